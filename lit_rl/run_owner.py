"""Which MLflow runs a run folder opened, and which process holds them: ``<run folder>/mlflow_runs.json``.

A checkpoint records its MLflow run (:mod:`lit_rl.resume`), so a resume after a checkpoint continues the same
run. Before the first checkpoint nothing did: a fit killed there (``kill -9``, a second Ctrl-C, an OOM kill)
left its run RUNNING forever, and ``--ckpt_path last`` opened a second one. ``python -m lit_rl fit`` now writes,
as soon as its MLflow runs are open (:func:`record`)::

    {"runs": [{"run_id": "...", "tracking_uri": "sqlite:///runs/mlflow.db"}],
     "process": {"pid": 4242, "host": "node-3", "started": 1765141200.52}}

and reads it back at the next fit into the same folder, before anything else opens a run:

1. :func:`mark_orphans`: a recorded run still RUNNING whose process is gone (same host; the pid is free or
   belongs to a process started at another time) is marked KILLED with a ``lit_rl.stopped`` tag saying so.
   A run of a live process, or of another host, is left alone.
2. :func:`recorded_runs`: what ``--ckpt_path last`` continues when it finds no checkpoint
   (:func:`lit_rl.resume.prepare_resume`), so the run keeps one MLflow run whatever ended its first attempt.

Lightning opens the MLflow run before the DataModule's ``setup`` reads the data, so a data file refused there
(a pool whose completions cannot fit the policy, a prompt file with a bad row) used to leave a FAILED run with
nothing in it. :func:`discard_empty` removes such a run (new in this process, no metric logged), the record
and the run folder if nothing else is in it: the error line is then the only trace, as for the preflight's.

Only rank 0 reads or writes the file; it is written atomically (temp file + rename). A file that cannot be
parsed is ignored with one line (nothing is continued from it).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_rl.atomic import atomic_write_text
from lit_rl.errors import one_line

__all__ = ["FILE", "discard_empty", "mark_orphans", "mlflow_loggers", "process_alive", "record", "recorded_runs",
           "this_process"]

FILE = "mlflow_runs.json"


def this_process() -> dict[str, Any]:
    """``{"pid", "host", "started"}`` of this process (``started``: its start time, which tells a reused pid)."""
    import psutil  # peft's dependency, so always installed with lit_rl

    return {"pid": os.getpid(), "host": socket.gethostname(), "started": psutil.Process().create_time()}


def process_alive(proc: dict[str, Any]) -> bool | None:
    """Whether the recorded process still runs: ``None`` when it cannot be told (another host, a record
    without a pid), else whether a process with that pid and start time exists."""
    import psutil

    if not isinstance(proc, dict) or proc.get("host") != socket.gethostname() or not isinstance(proc.get("pid"), int):
        return None
    try:
        started = psutil.Process(proc["pid"]).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # access denied: it exists
        return True
    want = proc.get("started")
    return not isinstance(want, (int, float)) or abs(started - float(want)) < 1.0


def _read(folder: Path) -> dict[str, Any]:
    path = Path(folder) / FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise ValueError("no 'runs' list")
        return data
    except (OSError, ValueError) as e:
        rank_zero_info(f"resume: ignored {path}: cannot be read ({one_line(e, 120) or type(e).__name__})")
        return {}


def recorded_runs(folder: str | os.PathLike) -> list[dict[str, str]]:
    """``[{"run_id", "tracking_uri"}]`` the last fit into ``folder`` opened (empty without a record)."""
    return [r for r in _read(Path(folder)).get("runs", []) if isinstance(r, dict) and r.get("run_id")]


def mlflow_loggers(trainer: Any) -> list:
    """The trainer's MLflow loggers (Lightning's class and lit_rl's subclass)."""
    from lightning.pytorch.loggers import MLFlowLogger

    return [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]


def record(trainer: Any, folder: str | os.PathLike) -> Path | None:
    """Open the trainer's MLflow runs (what Lightning does at the start of ``fit`` anyway) and write
    ``<folder>/mlflow_runs.json`` naming them and this process. Rank 0 only; ``None`` without an MLflow logger."""
    loggers = mlflow_loggers(trainer)
    if rank_zero_only.rank != 0 or not loggers:
        return None
    runs = []
    for logger in loggers:
        _ = logger.experiment  # creates (or continues) the run
        if logger.run_id:
            runs.append({"run_id": str(logger.run_id), "tracking_uri": str(logger._tracking_uri)})
    path = Path(folder) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"runs": runs, "process": this_process()}, indent=1) + "\n")
    return path


def mark_orphans(trainer: Any, folder: str | os.PathLike) -> list[str]:
    """Mark KILLED each run recorded in ``folder`` that is still RUNNING in the trainer's MLflow store although
    its process is gone; returns their ids. Rank 0 only; a store that does not answer changes nothing."""
    data = _read(Path(folder))
    loggers = mlflow_loggers(trainer)
    if rank_zero_only.rank != 0 or not data or not loggers or process_alive(data.get("process")) is not False:
        return []
    proc = data["process"]
    marked = []
    for rec in recorded_runs(folder):
        for logger in loggers:
            client = logger._mlflow_client
            try:
                run = client.get_run(rec["run_id"])
                if run.info.status != "RUNNING":
                    break
                client.set_terminated(rec["run_id"], "KILLED")
                client.set_tag(rec["run_id"], "lit_rl.stopped",
                               f"process {proc['pid']} on {proc['host']} ended without closing the run (kill -9, an "
                               "out-of-memory kill, a crash); resume with --ckpt_path last")
            except Exception:  # noqa: BLE001 - not in this logger's store: try the next logger
                continue
            marked.append(rec["run_id"])
            rank_zero_info(f"resume: MLflow run {rec['run_id']} was left RUNNING by process {proc['pid']}, which is "
                           "gone: marked KILLED")
            break
    return marked


def discard_empty(trainer: Any, folder: str | os.PathLike) -> list[str]:
    """Delete the MLflow runs this process opened that hold no metric (a fit refused while setting up), then the
    record and ``folder`` if they are all that is left in it. Rank 0 only; returns the deleted run ids."""
    if rank_zero_only.rank != 0:
        return []
    gone = []
    for logger in mlflow_loggers(trainer):
        run_id = logger._run_id if getattr(logger, "_initialized", False) else None
        if not run_id:
            continue
        try:
            client = logger._mlflow_client
            if client.get_run(run_id).data.metrics:
                continue
            client.delete_run(run_id)
        except Exception:  # noqa: BLE001 - a store that does not answer: the run stays, FAILED
            continue
        gone.append(run_id)
        rank_zero_info(f"MLflow run {run_id} was opened before the data were read and holds nothing: removed")
    path = Path(folder) / FILE
    if gone and path.is_file():
        path.unlink()
        try:
            Path(folder).rmdir()  # only if empty
        except OSError:
            pass
    return gone
