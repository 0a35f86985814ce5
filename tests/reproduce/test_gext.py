"""The G_ext sweep's report (ERILS Fig. 8 in miniature) from a real MLflow store shaped as a sweep writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rl.reproduce import gext

ACC = "val/sudoku/greedy/accuracy"
STUDY = "erils-gext-g6"


def _sweep_store(tmp_path: Path, finals: dict[tuple[int, int], float]) -> str:
    """Trials (G_ext, seed) -> final accuracy, plus a failed trial, an evaluation run and another study's trial."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("lit_rl-sweeps")

    def trial(n, g_ext, seed, final, state="COMPLETE", study=STUDY, role="trial"):
        run = client.create_run(exp, run_name=f"{study}-trial-{n}", tags={
            "lit_rl.sweep": study, "lit_rl.role": role, "optuna.trial_number": str(n), "optuna.trial_state": state})
        params = {"data.init_args.g_ext": g_ext, "seed_everything": seed, "data.init_args.g_on": 6 - g_ext}
        for key, value in params.items():
            client.log_param(run.info.run_id, key, value)
        for step, value in ((0, 0.25), (149, (0.25 + final) / 2), (299, final)):
            client.log_metric(run.info.run_id, ACC, value, step=step)
        for step in range(3, 300, 4):
            client.log_metric(run.info.run_id, "train/on_policy/reward_mean", 0.1 * g_ext, step=step)
        client.set_terminated(run.info.run_id, "FINISHED" if state == "COMPLETE" else "FAILED")

    for n, ((g, s), f) in enumerate(finals.items()):
        trial(n, g, s, f)
    trial(90, 1, 0, 0.0, state="FAIL")  # a failed attempt of a grid point: not reported
    trial(91, 2, 0, 0.5, study="other")  # another study
    trial(92, 2, 0, 0.5, role="evaluation")  # a validate of a checkpoint
    return uri


def test_report_groups_trials_by_g_ext_with_seed_spread_lengths_and_plot(tmp_path):
    finals = {(1, 0): 0.90, (1, 1): 0.92, (1, 2): 0.94, (4, 0): 0.60, (4, 1): 0.70, (4, 2): 0.80}
    uri = _sweep_store(tmp_path, finals)
    trials = gext.trials_of(uri, "lit_rl-sweeps", STUDY, tmp_path / "sweeps")
    assert [(t.g_ext, t.seed) for t in trials] == list(finals)  # only this study's complete trials, sorted
    assert trials[0].folder == tmp_path / "sweeps" / STUDY / "trial_0" and trials[0].seconds is not None
    # the three-length evaluation of two trials of G_ext 4
    for t, accs in ((trials[3], {48: 0.6, 96: 0.5, 192: 0.4}), (trials[4], {48: 0.7, 96: 0.7, 192: 0.6})):
        (t.folder / "eval").mkdir(parents=True)
        configs = {f"det{n}": {"final": {"metrics": {"accuracy": a}}, "settings": {"gen_length": n}}
                   for n, a in accs.items()}
        (t.folder / "eval/passk_lengths_validate_report.json").write_text(json.dumps({"configs": configs}))
    out = tmp_path / "report"
    summary = gext.build(trials, out)
    g1, g4 = summary["g_ext"][1], summary["g_ext"][4]
    assert g1["g_on"] == 5 and g1["final"]["mean"] == pytest.approx(0.92) and g1["final"]["std"] == pytest.approx(0.02)
    assert g4["final"]["mean"] == pytest.approx(0.70) and g4["final"]["min"] == 0.6 and g4["per_seed"] == {
        0: 0.6, 1: 0.7, 2: 0.8}
    assert g4["on_policy_reward"]["mean"] == pytest.approx(0.4)
    assert list(summary["lengths"]) == ["G_ext 4"] and summary["lengths"]["G_ext 4"][96]["mean"] == pytest.approx(0.6)
    report = (out / "report.md").read_text()
    assert "| 1 | 5 | 3 | **0.920** ± 0.020 | 0.900-0.940 | s0 0.900, s1 0.920, s2 0.940 |" in report
    assert "| G_ext 4 | 2 | 0.650 ± 0.071 | 0.600 ± 0.141 | 0.500 ± 0.141 |" in report
    assert (out / "gext.png").stat().st_size > 5000


def test_the_command_says_when_the_sweep_has_not_run(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "sweep.yaml"
    base = Path(__file__).resolve().parents[2] / "conf/sweeps/erils_gext.yaml"
    text = base.read_text().replace("sqlite:///runs/mlflow.db", f"sqlite:///{tmp_path / 'mlflow.db'}").replace(
        "sqlite:///runs/sweeps/optuna.db", f"sqlite:///{tmp_path / 'optuna.db'}")
    sweep.write_text(text.replace("base: [conf/erils.yaml]", f"base: [{base.parents[1] / 'erils.yaml'}]"))
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").create_experiment("lit_rl-sweeps")
    assert gext.main(["--config", str(sweep), "--out", str(tmp_path / "out")]) == 2
    assert "no finished trials of study 'erils-gext-g6'" in capsys.readouterr().err


def test_wall_times_come_from_the_optuna_trials_when_the_storage_is_given(tmp_path):
    """A validate of a trial's checkpoint logs into the trial's MLflow run and moves its end: Optuna's trial
    start and completion are the training time."""
    import datetime

    import optuna

    uri = _sweep_store(tmp_path, {(1, 0): 0.9, (2, 0): 0.8})
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    trial = optuna.trial.create_trial(params={"x": 1}, distributions={"x": optuna.distributions.IntDistribution(0, 2)},
                                      value=0.9)
    trial.datetime_start = trial.datetime_complete - datetime.timedelta(seconds=470)
    study.add_trial(trial)  # trial 0; the store's trial 1 has no Optuna record here
    trials = gext.trials_of(uri, "lit_rl-sweeps", STUDY, tmp_path, storage)
    assert trials[0].number == 0 and trials[0].seconds == pytest.approx(470, abs=1)
    assert trials[1].seconds is None  # no Optuna record: unknown, not the MLflow run's span
