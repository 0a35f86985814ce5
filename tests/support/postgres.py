"""A throwaway PostgreSQL server for tests: Debian's binaries (``/usr/lib/postgresql/<version>/bin``, installed
by ``.ci/run``), a fresh cluster in a temporary folder, trust authentication on 127.0.0.1 and a free port.

PostgreSQL refuses to run as root, so under root (CI, these machines) ``initdb``/``pg_ctl`` run as the
``postgres`` OS user through ``runuser``. :func:`start_or_skip` turns a server that cannot start into a
``pytest.skip`` naming the reason, or into a failure when ``CI=true`` (a CI run must not pass by skipping).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PostgresServer", "PostgresUnavailable", "find_bin_dir", "start_or_skip"]


class PostgresUnavailable(RuntimeError):
    """The server could not be set up or started (the message says why)."""


def find_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` (``LIT_RL_PG_BIN`` overrides)."""
    if os.environ.get("LIT_RL_PG_BIN"):
        candidates = [os.environ["LIT_RL_PG_BIN"]]
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                            if Path(p).parent.name.isdigit() else -1, reverse=True)
    for path in candidates:
        if (Path(path) / "initdb").exists() and (Path(path) / "pg_ctl").exists():
            return Path(path)
    raise PostgresUnavailable("no PostgreSQL server binaries: /usr/lib/postgresql/*/bin/initdb is missing "
                              "(apt-get install postgresql, as .ci/run does)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One cluster: :meth:`start`, :meth:`stop`, :meth:`restart`, :meth:`create_database`, :meth:`url`."""

    def __init__(self, bin_dir: Path | None = None, user: str = "postgres") -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="lit_rl_pg_"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            try:
                account = pwd.getpwnam(user)
            except KeyError:
                raise PostgresUnavailable(f"running as root and there is no {user!r} OS user to run the server "
                                          "(Debian's postgresql package creates it)") from None
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._initdb()

    def _run(self, *argv: str, timeout: float = 120) -> str:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if proc.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(f"{' '.join(argv[:2])} failed (exit {proc.returncode}): "
                                      f"{(proc.stderr or proc.stdout).strip()[-2000:]}\n{tail}")
        return proc.stdout

    def _initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
                  "--no-sync")

    def start(self) -> None:
        # fsync off: a test cluster, thrown away; the socket lives in our folder (no /var/run/postgresql needed)
        options = (f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: the server ends every open session (clients see their connection dropped)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, down_s: float = 0.0, mode: str = "fast") -> None:
        """Stop (dropping every client connection), stay down ``down_s`` seconds, start on the same port."""
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def running(self) -> bool:
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status"]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True).returncode == 0

    def url(self, database: str = "postgres", driver: str = "psycopg") -> str:
        return f"postgresql+{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=30) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def cleanup(self) -> None:
        if self.data.exists() and self.running():
            try:
                self.stop("immediate")
            except PostgresUnavailable:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def start_or_skip() -> PostgresServer:
    """A started server, or ``pytest.skip`` with the reason (``pytest.fail`` when ``CI=true``)."""
    import pytest

    server = None
    try:
        import psycopg  # noqa: F401 - the driver the storage URL names

        server = PostgresServer()
        server.start()
        server.create_database("probe")  # a client really gets in
        return server
    except Exception as e:  # noqa: BLE001 - any reason is reported, by name
        if server is not None:
            server.cleanup()
        reason = f"PostgreSQL could not start: {type(e).__name__}: {e}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI=true: a PostgreSQL test must run, not skip)", pytrace=False)
        pytest.skip(reason)
