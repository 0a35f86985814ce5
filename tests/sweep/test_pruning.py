"""Tests lit_rl/sweep/pruning.py."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
import torch

from lit_rl.sweep.pruning import INTERMEDIATE_KEY, PRUNED_STEP_KEY, StepPruningCallback

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _fake_trainer(step, metrics, world_size=1, rank0=True, decision=None):
    broadcast = (lambda x: x) if decision is None else (lambda x: decision)
    return SimpleNamespace(global_step=step, callback_metrics=metrics, world_size=world_size,
                           is_global_zero=rank0, strategy=SimpleNamespace(broadcast=broadcast), should_stop=False)


def test_step_pruning_reports_fresh_values_at_global_step_and_stops_without_raising(tmp_path, caplog):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/o.db", pruner=optuna.pruners.ThresholdPruner(lower=0.5))
    trial = study.ask()
    cb = StepPruningCallback(trial, "val/acc", every_n_steps=4)
    acc = {a: torch.tensor(a) for a in (0.9, 0.7, 0.6, 0.2)}
    # (hook, global_step, the tensor in callback_metrics)
    events = [
        ("train", 4, None),         # nothing logged yet: nothing reported
        ("val", 4, acc[0.9]),       # validation after the batch that ended at step 4: reported at 4
        ("train", 6, acc[0.9]),     # not a multiple of 4
        ("train", 8, acc[0.9]),     # the same tensor as at step 4: stale, not reported again
        ("train", 8, acc[0.7]),     # step 8 already handled by the train hook
        ("val", 8, acc[0.7]),       # fresh: reported at 8
        ("train", 12, acc[0.6]),    # e.g. Pass@k logged from on_train_batch_end: reported at 12
        ("val", 16, acc[0.2]),      # 0.2 < 0.5: pruned at 16
        ("train", 20, acc[0.9]),    # nothing after the decision
    ]
    for hook, step, value in events:
        tr = _fake_trainer(step, {} if value is None else {"val/acc": value})
        tr.sanity_checking = False
        if hook == "train":
            cb.on_train_batch_end(tr, None, None, None, 0)
        else:
            cb.on_validation_end(tr, None)
        assert tr.should_stop == (step == 16)
    assert cb.reported == pytest.approx({4: 0.9, 8: 0.7, 12: 0.6, 16: 0.2})
    # the monitor was absent at the first train step (before the first eval): no warning for that, at the end
    with caplog.at_level("WARNING", logger="lit_rl.sweep"):
        cb.on_train_end(tr, None)
        lonely = StepPruningCallback(study.ask(), "val/typo")
        for step in (4, 8):
            tr = _fake_trainer(step, {"val/acc": acc[0.9]})
            tr.sanity_checking = False
            lonely.on_train_batch_end(tr, None, None, None, 0)
            lonely.on_validation_end(tr, None)
        assert "nothing was reported" not in caplog.text  # not while training: it may still appear
        lonely.on_train_end(tr, None)
        lonely.on_train_end(tr, None)
    assert caplog.text.count("nothing was reported to the pruner up to step 8: monitor 'val/typo'") == 1
    assert study.trials[0].intermediate_values == pytest.approx({4: 0.9, 8: 0.7, 12: 0.6, 16: 0.2})
    with pytest.raises(optuna.TrialPruned, match="step 16"):
        cb.check_pruned()


def test_check_pruned_replays_a_spawned_rank0_decision(tmp_path):
    """Under ddp_spawn rank 0 runs in a child process: the launching process's callback saw nothing and
    must learn the decision and the reported values from the storage."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/o.db")
    trial = study.ask()
    # what rank 0's callback wrote from the child process, through its own storage handle
    child_view = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{tmp_path}/o.db")
    child_view._storage.set_trial_system_attr(trial._trial_id, INTERMEDIATE_KEY, {"2": 0.1, "4": 0.05})
    child_view._storage.set_trial_system_attr(trial._trial_id, PRUNED_STEP_KEY, 4)
    parent = StepPruningCallback(trial, "m")
    with pytest.raises(optuna.TrialPruned, match="step 4"):
        parent.check_pruned()
    assert parent.reported == {2: 0.1, 4: 0.05}
    # ranks that are not 0 follow the broadcast decision and stop too
    other = StepPruningCallback(trial, "m")
    tr = _fake_trainer(2, {}, world_size=2, rank0=False, decision=True)
    other.on_train_batch_end(tr, None, None, None, 0)
    assert tr.should_stop and other.pruned_step == 2
