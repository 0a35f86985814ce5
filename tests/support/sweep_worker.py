"""Sweep worker processes for storage tests: the real ``python -m lit_rl sweep`` command line
(:func:`lit_rl.sweep.main`: ``--config``, ``--max_trials``, the runner, heartbeats, MLflow runs) with the
LightningCLI fit replaced by a trial that sleeps ``trial_s`` seconds and returns the sum of its numeric
parameters, so a dozen trials over several workers take seconds.

:func:`start_worker` forks each worker from a ``forkserver`` that imported :mod:`lit_rl.sweep` once: every
worker is its own OS process (own database connections, heartbeat thread; SIGKILL kills it alone), but it
starts in milliseconds instead of paying the ~20 s torch/Lightning import again on a busy 2-core machine.
The forkserver holds no database connection, so none is shared with a worker.

As a script: ``python tests/support/sweep_worker.py --config sweep.yaml [--max_trials N]``
(``LIT_RL_TEST_TRIAL_S`` seconds per trial, default 1).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Worker", "sleepy_fit", "start_worker"]


def _barrier() -> None:
    """``LIT_RL_TEST_BARRIER=<dir>:<n>``: a worker's first trial waits (at most 120 s) until ``n`` workers are in
    theirs, so all of them hold a trial at once and then race for the next claims."""
    spec = os.environ.pop("LIT_RL_TEST_BARRIER", "")
    if not spec:
        return
    folder, n = spec.rsplit(":", 1)
    Path(folder, str(os.getpid())).touch()
    deadline = time.time() + 120
    while len(os.listdir(folder)) < int(n) and time.time() < deadline:
        time.sleep(0.05)


def sleepy_fit(cfg, trial, values, run_id, trial_dir, overlay) -> float:
    _barrier()
    time.sleep(float(os.environ.get("LIT_RL_TEST_TRIAL_S", "1")))
    return float(sum(v for v in values.values() if isinstance(v, (int, float))))


def main(argv: list[str] | None = None) -> int:
    import lit_rl.sweep.runner as runner
    from lit_rl.sweep import main as sweep_main

    runner.fit_trial_with_lightning_cli = sleepy_fit  # what SweepRunner falls back to without a fit_trial
    return sweep_main(argv)


def _child(argv: list[str], log: str, trial_s: float, barrier: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(LIT_RL_TEST_TRIAL_S=str(trial_s), LIT_RL_TEST_BARRIER=barrier, OMP_NUM_THREADS="1",
                      LIT_RL_THREADS="1")
    sys.exit(main(argv))


class Worker:
    """A started worker process with the ``subprocess.Popen`` calls the tests use."""

    def __init__(self, process, log: Path) -> None:
        self.process, self.log = process, log

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"sweep worker {self.log.name}", timeout)
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()  # SIGKILL

    def send_signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)


_CTX = None


def start_worker(config: Path, log: Path, *extra: str, trial_s: float = 1.0,
                 barrier: tuple[Path, int] | None = None) -> Worker:
    """A worker running ``--config config *extra``; ``barrier=(folder, n)``: see :func:`_barrier`."""
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["lit_rl.sweep", "optuna", "mlflow.tracking", "sqlalchemy", "psycopg",
                                 "support.sweep_worker"])
    process = _CTX.Process(target=_child, args=(["--config", str(config), *extra], str(log), trial_s,
                                                  f"{barrier[0]}:{barrier[1]}" if barrier else ""), daemon=False)
    process.start()
    return Worker(process, log)


if __name__ == "__main__":
    sys.exit(main())
