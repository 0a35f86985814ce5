"""A throwaway ``mlflow server`` for tests: the real server (this venv's ``mlflow`` command) on loopback, a
PostgreSQL backend store (a database of a :class:`tests.support.postgres.PostgresServer`), a local artifact
folder served by the server (``--serve-artifacts``), on a free port that a restart keeps.

:func:`start_or_skip` turns a server that cannot start into ``pytest.skip`` naming the reason, or a failure
under ``CI=true``, like the PostgreSQL fixture.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.postgres import PostgresServer, _free_port

__all__ = ["MlflowServer", "start_or_skip"]


class MlflowServer:
    """:meth:`start`, :meth:`stop` (SIGKILL: the server goes away at once, mid-request), :meth:`restart`,
    :attr:`uri`."""

    # MLflow 3's server also starts a job runner (huey) for its GenAI jobs; none of that is needed here, and it
    # costs a process and start-up time on a 2-core machine
    ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

    def __init__(self, backend_uri: str, root: Path | None = None) -> None:
        self.backend_uri = backend_uri
        self._own_root = root is None  # a folder this object made is removed by cleanup()
        self.root = Path(root or tempfile.mkdtemp(prefix="lit_rl_mlflow_"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.artifacts = self.root / "artifacts"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> float:
        """Start and wait for ``/health``; returns the seconds it took."""
        mlflow = Path(sys.executable).with_name("mlflow")
        cmd = [str(mlflow), "server", "--backend-store-uri", self.backend_uri,
               "--artifacts-destination", str(self.artifacts), "--serve-artifacts",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        t0 = time.monotonic()
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **self.ENV})
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """Kill the server and its workers (the whole process group) and wait until the port is free."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def restart(self, down_s: float = 0.0) -> float:
        self.stop()
        time.sleep(down_s)
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def start_or_skip(pg: PostgresServer, database: str = "mlflow") -> MlflowServer:
    """A started server whose backend store is a fresh database of ``pg`` (skip, or fail under CI=true)."""
    import pytest

    try:
        server = MlflowServer(pg.create_database(database))
        server.start()
        return server
    except Exception as e:  # noqa: BLE001 - any reason is reported, by name
        reason = f"mlflow server could not start: {type(e).__name__}: {e}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI=true: a tracking-server test must run, not skip)", pytrace=False)
        pytest.skip(reason)
