"""The Optuna names lit_rl.sweep relies on beyond the public API, pinned by this test.

The runner claims an enqueued trial atomically with ``study._storage.set_trial_state_values`` and wraps it in
``optuna.Trial(study, trial._trial_id)`` (``study.ask`` would create a new trial when another worker took the
last waiting one, which a grid or a ``--max_trials`` cap cannot allow); the heartbeat and the pruning
callback use ``trial._trial_id`` and the cached storage's ``_backend``. pyproject pins ``optuna>=4.0,<6``:
the sweep tests pass on Optuna 4.0.0, 5.0.0 and 5.1.0; an upgrade that renames any of these fails here first.
"""

from __future__ import annotations

import optuna
import pytest

TS = optuna.trial.TrialState


@pytest.fixture
def study(tmp_path):
    return optuna.create_study(study_name="contract", storage=f"sqlite:///{tmp_path}/s.db")


def test_claiming_a_waiting_trial_is_atomic_and_wrappable(study):
    study.enqueue_trial({"x": 1.0})
    (waiting,) = study.get_trials(deepcopy=False, states=(TS.WAITING,))
    tid = waiting._trial_id
    assert study._storage.set_trial_state_values(tid, state=TS.RUNNING) is True
    with pytest.raises(RuntimeError):  # a claim after it finished (Optuna 5: UpdateFinishedTrialError, a RuntimeError)
        study._storage.set_trial_state_values(tid, state=TS.COMPLETE, values=[0.0])
        study._storage.set_trial_state_values(tid, state=TS.RUNNING)
    study2 = optuna.load_study(study_name="contract", storage=study._storage)
    study2.enqueue_trial({"x": 2.0})
    (w2,) = study2.get_trials(deepcopy=False, states=(TS.WAITING,))
    study2._storage.set_trial_state_values(w2._trial_id, state=TS.RUNNING)
    trial = optuna.Trial(study2, w2._trial_id)
    assert trial.suggest_float("x", 0.0, 3.0) == 2.0  # the enqueued value
    assert trial.number == w2.number


def test_the_cached_storage_exposes_its_backend_and_heartbeats(study):
    backend = getattr(study._storage, "_backend", study._storage)
    assert isinstance(backend, optuna.storages.RDBStorage)
    study.enqueue_trial({"x": 1.0})
    (w,) = study.get_trials(deepcopy=False, states=(TS.WAITING,))
    study._storage.set_trial_state_values(w._trial_id, state=TS.RUNNING)
    backend.record_heartbeat(w._trial_id)  # what the runner's heartbeat thread calls
    assert hasattr(optuna.storages, "fail_stale_trials") and hasattr(optuna.storages, "RetryFailedTrialCallback")
