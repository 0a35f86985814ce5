"""lit_rl/sweep/mlflow_study.py: the study's MLflow bookkeeping (its parent and child runs through a whole sweep:
tests/sweep/test_runner.py)."""

from __future__ import annotations

import pytest


def test_the_parent_run_tag_race_between_workers_is_retried(monkeypatch):
    """Two workers setting a new tag on the study's parent run at once: MLflow's SQL store makes the second
    insert fail on the unique key (seen with 4 workers finishing together); the retry then updates it."""
    import lit_rl.sweep.mlflow_study as tracking
    from mlflow.exceptions import MlflowException

    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    calls = []

    class Client:
        def set_tag(self, run_id, key, value, failures=[1]):
            calls.append((key, value))
            if failures[0]:
                failures[0] -= 1
                raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: tags.key, tags.run_uuid")

    tracker = tracking.StudyTracker.__new__(tracking.StudyTracker)
    tracker.client = Client()
    tracker._set_shared_tag("parent", "optuna.best_trial_number", "3")
    assert calls == [("optuna.best_trial_number", "3")] * 2

    class Broken:
        def set_tag(self, run_id, key, value):
            raise MlflowException("Run 'parent' not found")

    tracker.client = Broken()
    with pytest.raises(MlflowException, match="not found"):
        tracker._set_shared_tag("parent", "k", "v")
