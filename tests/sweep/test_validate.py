"""A sweep is checked against its base config before the first trial (lit_rl/sweep/validate.py).

Each of these sweeps would fail every trial (a misspelled space key, a choice of the wrong type, a derived rule
giving a negative count) or train every trial in full before finding a misspelled objective: ``python -m lit_rl
sweep`` prints one ``error:`` line naming the sweep file's line and exits 2, before the study's storage exists.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from lit_rl.sweep import main as sweep_main

ROOT = Path(__file__).resolve().parents[2]


def _sweep(tmp: Path, **changes) -> dict:
    raw = {
        "study_name": "check", "base": [str(ROOT / "conf/erils.yaml"), str(ROOT / "tests/tiny_overlay.yaml")],
        "overrides": {"data": {"init_args": {"pool_path": str(ROOT / "data/pools/sudoku_scripted.jsonl.gz")}}},
        "space": {"data.init_args.g_ext": {"type": "categorical", "choices": [1, 2, 3]}},
        "derived": {"data.init_args.g_on": "4 - data.init_args.g_ext"},
        "objective": {"metric": "val/sudoku/greedy/accuracy", "direction": "maximize"},
        "sampler": {"name": "grid"}, "pruner": {"name": "none"},
        "storage": f"sqlite:///{tmp}/optuna.db", "tracking_uri": f"sqlite:///{tmp}/mlflow.db",
        "output_dir": str(tmp / "sweeps"),
    }
    raw.update(changes)
    return raw


CASES = {
    "misspelled_space_key": (
        dict(space={"data.init_args.g_exx": {"type": "categorical", "choices": [1, 2]}}, derived={}),
        "space.data.init_args.g_exx", ["unknown key for datamodules.RolloutDataModule", "g_ext"]),
    "choice_of_the_wrong_type": (
        dict(space={"data.init_args.prompts_per_batch": {"type": "categorical", "choices": [2, "four"]}}, derived={}),
        "space.data.init_args.prompts_per_batch", ["expected int, got str 'four'"]),
    "derived_negative_count": (
        dict(space={"data.init_args.g_ext": {"type": "categorical", "choices": [1, 2, 6]}}),
        "derived.data.init_args.g_on", ["(g_ext=6, g_on=-2)", "must be >= 0, got -2"]),
    "misspelled_objective": (
        dict(objective={"metric": "val/sudoku/greedy/acuracy", "direction": "maximize"}),
        "objective.metric", ["not 'acuracy'", "did you mean 'val/sudoku/greedy/accuracy'?"]),
    "objective_of_another_evaluation": (
        dict(objective={"metric": "val/sudoku/det64/pass@1", "direction": "maximize"}),
        "objective.metric", ["no evaluation 'det64' in the base config (it logs greedy)"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_sweep_is_refused_before_the_first_trial(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    changes, key, fragments = CASES[name]
    path = tmp_path / "sweep.yaml"
    text = yaml.safe_dump(_sweep(tmp_path, **changes), sort_keys=False)
    path.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = sweep_main(["--config", str(path)])
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err.getvalue()[-2000:]
    assert f"{path}:" in errors[0] and f": {key}:" in errors[0], errors[0]
    for frag in fragments:
        assert frag in errors[0], f"{frag!r} not in {errors[0]!r}"
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "sweeps").exists()


def test_the_shipped_sweeps_pass_the_check(monkeypatch):
    from lit_rl.sweep.schema import SweepConfig
    from lit_rl.sweep.validate import check_against_base

    monkeypatch.chdir(ROOT)
    for path in sorted((ROOT / "conf/sweeps").glob("*.yaml")):
        check_against_base(SweepConfig.from_yaml(path))


def test_a_train_objective_that_is_never_logged_stops_the_sweep_after_its_first_trial(tmp_path, monkeypatch):
    """``train/...`` names are not checked against the base config (it cannot know every training metric); a name
    no trial logs then stops the sweep after the first trial, instead of failing every trial in turn."""
    monkeypatch.chdir(ROOT)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep(tmp_path, objective={"metric": "train/los", "direction": "minimize"}),
                                   sort_keys=False))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = sweep_main(["--config", str(path)])
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err.getvalue()[-2000:]
    assert "objective.metric: 'train/los' was not logged by trial 0; did you mean 'train/loss'?" in errors[0]
    import optuna

    study = optuna.load_study(study_name="check", storage=f"sqlite:///{tmp_path}/optuna.db")
    states = [t.state.name for t in study.trials]
    assert states.count("FAIL") == 1 and "COMPLETE" not in states and "RUNNING" not in states  # one trial ran
