"""``report`` on bad inputs is one ``error:`` line and exit 2 (``export``'s: tests/models/test_export_cli.py).

``report --experiment nosuch`` and a garbage ``mlflow.db`` are errors, not tracebacks; ``report`` at a missing
sqlite path creates nothing there.
"""

from __future__ import annotations

import contextlib
import io

from lit_rl import cli


def _run(args: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue().strip().splitlines()


def test_report_at_a_missing_store_does_not_create_it(tmp_path):
    db = tmp_path / "runs" / "mlflow.db"
    rc, lines = _run(["report", "--tracking_uri", f"sqlite:///{db}", "--out", str(tmp_path / "report"), "--no_log"])
    assert rc == 2 and len(lines) == 1 and f"no MLflow store at {db}" in lines[0], lines
    assert not db.exists() and not db.parent.exists()


def test_report_on_a_garbage_store_is_one_line(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"this is not a database\n" * 100)
    rc, lines = _run(["report", "--tracking_uri", f"sqlite:///{db}", "--out", str(tmp_path / "report"), "--no_log"])
    assert rc == 2 and lines == [f"error: {db} is not an SQLite database (--tracking_uri sqlite:///{db})"], lines


def test_report_of_an_unknown_experiment_is_one_line(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # an empty store
    rc, lines = _run(["report", "--tracking_uri", uri, "--experiment", "nosuch", "--out", str(tmp_path / "r"),
                      "--no_log"])
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: MLflow store {uri}: no MLflow experiment named ['nosuch']"), lines


def test_report_on_a_full_store_is_one_line(tmp_path, monkeypatch):
    """A store whose disk is full answers SQLite's "database or disk is full" on the first write: the report
    logging its figures into it (without --no_log) is one line naming the store, not a traceback."""
    import sqlalchemy.exc
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("e")
    run = client.create_run(exp, run_name="r")
    client.log_metric(run.info.run_id, "val/sudoku/greedy/accuracy", 0.5, step=1)
    client.set_terminated(run.info.run_id)

    def full(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("INSERT INTO runs ...", {}, Exception("database or disk is full"))

    monkeypatch.setattr("mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore.create_run", full)
    rc, lines = _run(["report", "--tracking_uri", uri, "--out", str(tmp_path / "report")])
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "database or disk is full" in lines[0] and "mlflow.db" in lines[0], lines
