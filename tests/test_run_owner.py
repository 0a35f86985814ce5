"""lit_rl/run_owner.py: the run folder names its MLflow runs and their process; a run whose process is gone is
marked KILLED, one of a live process is left alone. Real sqlite MLflow stores, real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
from lightning.pytorch.loggers import MLFlowLogger

from lit_rl.run_owner import FILE, mark_orphans, process_alive, record, recorded_runs, this_process


class _Trainer:  # what the functions read of a trainer: its loggers
    def __init__(self, loggers):
        self.loggers = loggers


def _logger(tmp_path, run_id=None):
    return MLFlowLogger(experiment_name="owner", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", run_id=run_id)


def _dead_process() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return {**this_process(), "pid": proc.pid, "started": 0.0}


def test_process_alive_tells_a_live_process_from_a_gone_or_reused_pid():
    me = this_process()
    assert process_alive(me) is True
    assert process_alive(_dead_process()) is False
    assert process_alive({**me, "started": me["started"] - 3600}) is False  # this pid, another process's start
    assert process_alive({**me, "host": "another-host"}) is None  # cannot be told from here
    assert process_alive({}) is None and process_alive(None) is None


def test_record_writes_the_open_runs_and_this_process(tmp_path):
    logger = _logger(tmp_path)
    path = record(_Trainer([logger]), tmp_path / "run")
    data = json.loads(path.read_text())
    assert path == tmp_path / "run" / FILE
    assert data["runs"] == [{"run_id": logger.run_id, "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}]
    assert data["process"]["pid"] == this_process()["pid"]
    assert recorded_runs(tmp_path / "run") == data["runs"]
    assert record(_Trainer([]), tmp_path / "none") is None and not (tmp_path / "none").exists()


def test_a_running_run_of_a_gone_process_is_marked_killed_and_of_a_live_one_left(tmp_path):
    logger = _logger(tmp_path)
    folder = tmp_path / "run"
    record(_Trainer([logger]), folder)
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(logger.run_id).info.status == "RUNNING"
    assert mark_orphans(_Trainer([_logger(tmp_path)]), folder) == []  # this process holds it
    data = json.loads((folder / FILE).read_text())
    (folder / FILE).write_text(json.dumps({**data, "process": _dead_process()}))  # what kill -9 leaves
    assert mark_orphans(_Trainer([_logger(tmp_path)]), folder) == [logger.run_id]
    run = client.get_run(logger.run_id)
    assert run.info.status == "KILLED" and "ended without closing the run" in run.data.tags["lit_rl.stopped"]
    assert mark_orphans(_Trainer([_logger(tmp_path)]), folder) == []  # KILLED already: nothing to do


def test_an_unreadable_record_is_ignored_in_one_line(tmp_path, caplog):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / FILE).write_text('{"runs": [{"run_id": "abc"')  # cut short
    assert recorded_runs(folder) == []
    assert mark_orphans(_Trainer([_logger(tmp_path)]), folder) == []
    said = [r.message for r in caplog.records if FILE in r.message]
    assert said and said[0].startswith(f"resume: ignored {folder / FILE}: cannot be read") and "\n" not in said[0]
