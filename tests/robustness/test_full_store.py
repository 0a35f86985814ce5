"""An MLflow SQLite store that cannot be used, before and during a fit.

* Before: a store file of random bytes, or a disk without room, is one ``error:`` line naming the URI and the
  cause, before any run folder exists (was 150-200 lines ending in jsonargparse's "Does not validate against
  any of the Union subtypes").
* During: the store's disk fills up mid-run (a real 3 MiB tmpfs where root allows it, else MLflow's SQL store
  made to fail as SQLite does on a full disk): training goes on to the end; one warning when it starts and one
  ``error:`` line at the end naming the store, SQLite's reason, that training finished, and the spill file with
  its replay command (was 2,449 lines: MLflow logs every failed INSERT with its traceback and parameters, then
  a 300 s wait and a traceback). The replay, once the disk has room, puts every step in the run and ends it
  FINISHED.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import mlflow
import pytest

from lit_rl.loggers import replay

from support.resume_runs import run_args as _args  # noqa: E402
from support.resume_runs import run_cli as _run  # noqa: E402
from support.tmpfs import tmpfs  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # rel_faults, for FillDiskAt's class_path


def test_a_store_of_random_bytes_is_one_line_before_any_run_folder(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(os.urandom(50_000))
    run = tmp_path / "run"
    argv = _args(run, 2, f"--trainer.logger.init_args.tracking_uri=sqlite:///{db}")
    for p in list(run.iterdir()):  # _args writes its overlay into the run folder: keep it elsewhere
        p.rename(tmp_path / p.name)
    argv = [a.replace(str(run / "overlay.yaml"), str(tmp_path / "overlay.yaml")) for a in argv]
    run.rmdir()
    rc, err = _run(argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert f"MLflow store 'sqlite:///{db}' cannot be used: {db} is not an SQLite database" in lines[0], lines[0]
    assert lines[0].startswith("error: ") and not run.exists()


def test_a_store_sqlite_cannot_open_is_one_line(tmp_path):
    from lit_rl.tracking import tracking_uri_problem

    good = tmp_path / "ok.db"
    sqlite3.connect(good).execute("CREATE TABLE t (x)").connection.commit()
    assert tracking_uri_problem(f"sqlite:///{good}") is None
    bad = tmp_path / "bad.db"
    bad.write_bytes(good.read_bytes()[:16] + os.urandom(8000))  # SQLite's header, then garbage
    problem = tracking_uri_problem(f"sqlite:///{bad}")
    assert problem.startswith(f"MLflow store 'sqlite:///{bad}' cannot be used: {bad} cannot be opened by SQLite ("), \
        problem


def test_a_store_on_a_disk_without_room_is_one_line(tmp_path):
    from lit_rl.tracking import tracking_uri_problem

    with tmpfs(tmp_path / "disk", "64k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
        problem = tracking_uri_problem(f"sqlite:///{tmp_path}/disk/mlflow.db")
        assert problem and "cannot be written: " in problem and " KiB free on " in problem, problem


def _full_sqlite(monkeypatch, after: int) -> None:
    """MLflow's SQL store raising what it raises on a full disk, from its ``after``-th ``log_batch`` on."""
    import sqlalchemy
    from mlflow.exceptions import MlflowException
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    real, calls = SqlAlchemyStore.log_batch, {"n": 0}

    def log_batch(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > after and not os.environ.get("ROOM"):
            try:
                raise sqlalchemy.exc.OperationalError("INSERT INTO metrics", {},
                                                      sqlite3.OperationalError("database or disk is full"))
            except sqlalchemy.exc.OperationalError as e:
                raise MlflowException(f"(raised as a result of Query-invoked autoflush)\n{e}",
                                      error_code="TEMPORARILY_UNAVAILABLE") from e
        return real(self, *a, **k)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", log_batch)


@pytest.mark.parametrize("how", ["tmpfs", "injected"])
def test_a_store_that_fills_up_mid_run_keeps_training_and_loses_no_metric(tmp_path, monkeypatch, recwarn, how):
    run, disk = tmp_path / "run", tmp_path / "disk"
    with tmpfs(disk, "3m") as mounted:
        if how == "tmpfs" and not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
        extra = []
        if how == "tmpfs":
            fill = f"{{class_path: rel_faults.FillDiskAt, init_args: {{step: 2, path: {disk}}}}}"
            extra = [f"--trainer.callbacks+={fill}"]
        else:
            disk.mkdir(exist_ok=True)
            _full_sqlite(monkeypatch, after=1)
        uri = f"sqlite:///{disk}/mlflow.db"
        rc, err = _run(_args(run, 8, f"--trainer.logger.init_args.tracking_uri={uri}", *extra))
        assert rc == 2, err[-3000:]
        assert "Traceback" not in err and len(err.splitlines()) < 40, err[-3000:]
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1, err[-3000:]
        assert errors[0].startswith(f"error: MLflow store {uri} did not take the metrics of run "), errors[0]
        assert "(last error: database or disk is full); training went on to the end" in errors[0], errors[0]
        assert f"send them with: python -m lit_rl.loggers replay {run}/unsent/" in errors[0], errors[0]
        assert errors[0].endswith(" once the disk has room"), errors[0]
        # the one warning when the store stops taking metrics (pytest records it; a shell shows it on stderr)
        warned = [str(w.message) for w in recwarn.list if "is not taking metrics" in str(w.message)]
        assert len(warned) == 1 and "is not taking metrics (database or disk is full)" in warned[0], warned
        assert (run / "checkpoints/last.ckpt").is_file()  # training reached its end and saved
        # room again, then the replay the line names
        for p in disk.glob("filler*"):
            p.unlink()
        monkeypatch.setenv("ROOM", "1")
        files = sorted((run / "unsent").glob("*.jsonl"))
        assert files and replay(files) > 0 and not list((run / "unsent").glob("*.jsonl"))
        client = mlflow.tracking.MlflowClient(tracking_uri=uri)
        (r,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        assert sorted({m.step for m in client.get_metric_history(r.info.run_id, "train/loss")}) == [2, 4, 6, 8]
        assert client.get_run(r.info.run_id).info.status == "FINISHED"  # the end the store missed, replayed
