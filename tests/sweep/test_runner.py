"""lit_rl/sweep/runner.py: running a study in this process (:func:`run_sweep`, :class:`SweepRunner`): a derived
rule that fails its trial, atomic writes of a trial's overlay and arguments, a tiny real sweep through the
LightningCLI with MLflow parent/child runs, failed and stale trials, and a worker capped at some trials (the worker
processes of ``python -m lit_rl.sweep``: tests/sweep/test_sweep.py)."""

from __future__ import annotations

import json
import math
import os
import re
from types import SimpleNamespace

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from lit_rl.sweep import (
    SweepConfig,
    SweepConfigError,
    SweepRunner,
    fit_trial_with_lightning_cli,
    run_sweep,
)
from lit_rl.sweep.runner import retry_callback_class

from support.sweeps import POOL, ROOT  # noqa: E402
from support.sweeps import sweep_runs as _runs  # noqa: E402
from support.sweeps import tiny_sweep as _cfg  # noqa: E402
TS = optuna.trial.TrialState
optuna.logging.set_verbosity(optuna.logging.WARNING)


# ------------------------------------------------------------------------------------------ pieces


def test_a_derived_rule_that_fails_fails_its_trial_and_the_sweep_continues(tmp_path):
    message = "derived.data.init_args.g_on: '6 / (g_ext - 2)' failed for g_ext=2: division by zero"

    def fake_fit(cfg, trial, values, run_id, trial_dir, overlay):
        return float(values["data.init_args.g_on"])

    raw = _cfg(tmp_path, study_name="div", derived={"data.init_args.g_on": "6 / (g_ext - 2)"})
    study = run_sweep(SweepConfig.from_dict(raw), fit_trial=fake_fit)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.params["data.init_args.g_ext"] for t in trials] == [1, 2, 3]
    assert [t.state for t in trials] == [TS.COMPLETE, TS.FAIL, TS.COMPLETE]
    assert [trials[0].value, trials[2].value] == [-6.0, 6.0]
    _, children = _runs(tmp_path, "div")
    assert children[1].info.status == "FAILED" and children[1].data.tags["optuna.trial_state"] == "FAIL"
    assert children[1].data.tags["lit_rl.error"] == f"SweepConfigError: {message}"
    assert children[1].data.params == {"data.init_args.g_ext": "2"}  # no derived value to log
    assert children[2].data.params["data.init_args.g_on"] == "6.0"

    # catch_exceptions: false stops the sweep at that trial, which is FAIL (not left RUNNING)
    raw = _cfg(tmp_path, study_name="div-strict", derived={"data.init_args.g_on": "6 / (g_ext - 2)"},
               catch_exceptions=False)
    with pytest.raises(SweepConfigError, match=f"^{re.escape(message)}$"):
        run_sweep(SweepConfig.from_dict(raw), fit_trial=fake_fit)
    study = optuna.load_study(study_name="div-strict", storage=raw["storage"])
    assert [t.state for t in sorted(study.trials, key=lambda t: t.number)] == [TS.COMPLETE, TS.FAIL, TS.WAITING]
    _, children = _runs(tmp_path, "div-strict")
    assert children[1].info.status == "FAILED" and message in children[1].data.tags["lit_rl.error"]


def _no_space(fd):
    raise OSError(28, "No space left on device")


def test_overlay_and_cli_args_are_replaced_whole_never_written_in_place(tmp_path, monkeypatch):
    """A write that fails (here: fsync on a full disk) leaves the previous file as it was and no temp file."""
    SweepRunner(SweepConfig.from_dict(_cfg(tmp_path, study_name="atomic")))
    overlay = tmp_path / "out/atomic/overrides.yaml"
    old = overlay.read_text()
    assert yaml.safe_load(old) == {"data": {"init_args": {"pool_path": str(POOL)}}}
    cfg = SweepConfig.from_dict(_cfg(tmp_path, study_name="atomic", overrides={"trainer": {"max_steps": 2}}))
    monkeypatch.setattr(os, "fsync", _no_space)
    with pytest.raises(OSError, match="No space left"):
        SweepRunner(cfg)
    assert overlay.read_text() == old
    assert sorted(p.name for p in overlay.parent.iterdir()) == ["overrides.yaml"]

    import lit_rl.cli

    built = []

    def fake_cli(args, run=True):
        built.append(args)
        raise RuntimeError("stop after the arguments are written")

    monkeypatch.setattr(lit_rl.cli, "run_lightning_cli", fake_cli)
    trial_dir = tmp_path / "out/atomic/trial_0"
    with pytest.raises(OSError, match="No space left"):
        fit_trial_with_lightning_cli(cfg, SimpleNamespace(number=0), {"data.init_args.g_ext": 1}, "0" * 32, trial_dir,
                                     overlay)
    assert list(trial_dir.iterdir()) == [] and built == []
    monkeypatch.undo()
    monkeypatch.setattr(lit_rl.cli, "run_lightning_cli", fake_cli)
    with pytest.raises(RuntimeError, match="stop after"):
        fit_trial_with_lightning_cli(cfg, SimpleNamespace(number=0), {"data.init_args.g_ext": 1}, "0" * 32, trial_dir,
                                     overlay)
    assert [p.name for p in trial_dir.iterdir()] == ["cli_args.json"]
    assert json.loads((trial_dir / "cli_args.json").read_text()) == built[0]


# -------------------------------------------------------------------------------- real tiny sweeps


def test_tiny_sweep_states_and_mlflow_parent_child_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    study = run_sweep(SweepConfig.from_dict(_cfg(tmp_path)))
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.params["data.init_args.g_ext"] for t in trials] == [1, 2, 3]
    assert [t.state for t in trials] == [TS.COMPLETE, TS.COMPLETE, TS.PRUNED]
    assert 0.0 <= trials[0].value <= 1.0
    assert list(trials[2].intermediate_values) == [2]  # train/lr reported at global_step 2 (first rollout batch)

    parents, children = _runs(tmp_path, "tiny")
    assert len(parents) == 1 and sorted(children) == [0, 1, 2]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["objective.metric"] == "val/sudoku/greedy/accuracy"
    assert parent.data.tags["optuna.best_trial_number"] in ("0", "1")
    for n, run in children.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["data.init_args.g_ext"] == str(n + 1)
        assert run.data.params["data.init_args.g_on"] == str(3 - n)  # derived: 4 - g_ext
        assert trials[n].user_attrs["mlflow_run_id"] == run.info.run_id
        # the trial's own MLFlowLogger logged into the child run
        assert "train/on_policy/reward_mean" in run.data.metrics
    assert [children[n].data.tags["optuna.trial_state"] for n in range(3)] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [children[n].info.status for n in range(3)] == ["FINISHED", "FINISHED", "KILLED"]
    assert children[0].data.metrics["sweep/objective"] == pytest.approx(trials[0].value)
    # a pruned trial's value is the lr, not accuracy: its objective stays the "no value yet" NaN
    assert math.isnan(children[2].data.metrics["sweep/objective"])
    # MLflow's compare view preselects a run's first-logged metric and its first three differing params:
    # the objective, and only what the sweep varied (the folder and run name are tags)
    assert all(next(iter(c.data.metrics)) == "sweep/objective" for c in children.values())
    params = [c.data.params for c in children.values()]
    differ = {k for k in set().union(*params) if len({p.get(k) for p in params}) > 1}
    assert differ == {"data.init_args.g_ext", "data.init_args.g_on", "model.init_args.optimizer.init_args.lr"}, differ
    assert children[1].data.tags["lit_rl.run.trainer.default_root_dir"].endswith("trial_1")
    assert parent.data.metrics["sweep/objective"] == pytest.approx(max(trials[0].value, trials[1].value))
    # the runs list's shared view: the study's runs, the objective first and sorted best first
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment(parent.info.experiment_id)
    view = json.loads(exp.tags["mlflow.sharedViewState.lit_rl-sweep-tiny"])
    assert view["selectedColumns"][:3] == ["metrics.`sweep/objective`", "metrics.`val/sudoku/greedy/accuracy`",
                                           "params.`data.init_args.g_ext`"]
    assert view["orderByKey"] == "metrics.`sweep/objective`" and view["orderByAsc"] is False
    assert view["searchFilter"] == "tags.`lit_rl.sweep` = 'tiny'"
    assert len(client.search_runs([exp.experiment_id], view["searchFilter"])) == 4  # the filter MLflow runs
    assert (tmp_path / "out/tiny/trial_2/cli_args.json").exists()

    # resuming a finished study runs nothing more
    again = run_sweep(SweepConfig.from_dict(_cfg(tmp_path)))
    assert len(again.trials) == 3


def test_a_trial_that_raises_is_failed_and_the_sweep_continues(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    raw = _cfg(tmp_path, study_name="bad", space={"trainer.max_steps": {"type": "categorical", "choices": ["many"]}},
               derived={})
    study = run_sweep(SweepConfig.from_dict(raw))
    assert [t.state for t in study.trials] == [TS.FAIL]
    _, children = _runs(tmp_path, "bad")
    assert children[0].info.status == "FAILED" and children[0].data.tags["optuna.trial_state"] == "FAIL"
    assert "did not parse" in children[0].data.tags["lit_rl.error"]


def test_a_trial_declared_stale_while_alive_does_not_crash_its_worker(tmp_path):
    """On an overloaded machine another worker may fail a live trial whose heartbeat came late (and
    re-enqueue it); the worker that was running it must drop its result and carry on."""
    calls = []

    def fake_fit(cfg, trial, values, run_id, trial_dir, overlay):
        calls.append(trial.number)
        if len(calls) == 1:  # what fail_stale_trials + the retry hook do from the other worker
            trial.study._storage.set_trial_state_values(trial._trial_id, state=TS.FAIL)
            frozen = trial.study._storage.get_trial(trial._trial_id)
            retry_callback_class()(max_retry=1)(trial.study, frozen)
        return 0.5

    raw = _cfg(tmp_path, study_name="late", space={"data.init_args.g_ext": {"type": "categorical", "choices": [1]}},
               derived={})
    runner = SweepRunner(SweepConfig.from_dict(raw), fake_fit)
    runner.setup(None)
    assert runner.run() == [0, 1] and runner.dropped == [0]  # trial 0's result was dropped, not failed here
    study = runner.study
    assert calls == [0, 1]
    assert [t.state for t in study.trials] == [TS.FAIL, TS.COMPLETE]
    assert study.trials[1].system_attrs["failed_trial"] == 0 and study.trials[1].params == {"data.init_args.g_ext": 1}
    _, children = _runs(tmp_path, "late")
    assert children[0].info.status == "FAILED" and "declared stale" in children[0].data.tags["lit_rl.error"]
    assert children[1].info.status == "FINISHED" and children[1].data.metrics["sweep/objective"] == 0.5


def test_max_trials_caps_one_worker_and_the_next_run_takes_the_rest(tmp_path):
    calls = []

    def fake_fit(cfg, trial, values, run_id, trial_dir, overlay):
        calls.append(trial.number)
        return float(values["data.init_args.g_ext"])

    raw = _cfg(tmp_path, study_name="capped", derived={})
    cfg = SweepConfig.from_dict(raw)
    with pytest.raises(ValueError, match="max_trials must be >= 1"):
        run_sweep(cfg, fit_trial=fake_fit, max_trials=0)
    study = run_sweep(cfg, fit_trial=fake_fit, max_trials=2)
    assert calls == [0, 1]
    assert [t.state for t in study.trials] == [TS.COMPLETE, TS.COMPLETE, TS.WAITING]  # grid of 3: one left
    parents, _ = _runs(tmp_path, "capped")
    assert parents[0].info.status == "RUNNING"  # the study is not finished while a slot waits
    study = run_sweep(cfg, fit_trial=fake_fit)
    assert calls == [0, 1, 2] and all(t.state == TS.COMPLETE for t in study.trials)
    assert sorted(t.value for t in study.trials) == [1.0, 2.0, 3.0]
    parents, _ = _runs(tmp_path, "capped")
    assert parents[0].info.status == "FINISHED"
