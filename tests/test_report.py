"""The report on a hand-made MLflow store with known metric values: figures, their contents, the Markdown
table's final/best numbers, run selection and the MLflow artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from lit_rl.report import ReportSpec, build_report, load_runs, main, pareto_front

# variant -> greedy accuracy at steps 0, 10, 20 (ERILS rises, SPG slower, joint stalls)
ACC = {"erils": [0.1, 0.5, 0.4], "spg": [0.1, 0.2, 0.3], "joint": [0.1, 0.1, 0.1]}
# double-rollout points: (tokens per problem at steps 0 and 10, final accuracy)
PARETO = {"dr-a": ([90, 110], 0.5), "dr-b": ([200, 200], 0.4), "dr-c": ([300, 300], 0.7)}


def _log(client, run_id, series: dict[str, list[tuple[int, float]]], params=None, tags=None):
    metrics = [Metric(k, v, 1000 + s, s) for k, pts in series.items() for s, v in pts]
    client.log_batch(run_id, metrics=metrics, params=[Param(k, str(v)) for k, v in (params or {}).items()],
                     tags=[RunTag(k, v) for k, v in (tags or {}).items()])
    client.set_terminated(run_id, "FINISHED")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts of a sqlite store land under ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    emb = client.create_experiment("lit_rl-embedded")
    for name, acc in ACC.items():
        run = client.create_run(emb, run_name=name, tags={"variant": name, "paper": "fig1"})
        series = {"val/sudoku/greedy/accuracy": list(zip([0, 10, 20], acc)),
                  "train/on_policy/reward_mean": [(1, 0.2), (20, 0.6)],
                  "train/on_policy/length_mean": [(1, 50.0), (20, 40.0)],
                  "train/loss": [(1, 3.0), (10, 1.0), (20, 2.0)]}
        if name != "spg":  # SPG has no external rollouts
            series |= {"train/external/reward_mean": [(1, 0.9), (20, 0.9)],
                       "train/external/advantage_mean": [(1, 0.3), (20, 0.1)]}
        _log(client, run.info.run_id, series)
    dr = client.create_experiment("double-rollout")
    for name, (tokens, acc) in PARETO.items():
        run = client.create_run(dr, run_name=name)
        _log(client, run.info.run_id, {"train/tokens_per_problem": list(zip([0, 10], tokens)),
                                       "val/countdown/greedy/accuracy": [(0, 0.0), (10, acc)]})
    sw = client.create_experiment("lit_rl-sweeps")
    parent = client.create_run(sw, run_name="study:s", tags={"lit_rl.role": "study", "lit_rl.sweep": "s"})
    for n, (g_ext, obj, state) in enumerate([(1, 0.3, "COMPLETE"), (2, 0.6, "COMPLETE"), (3, 0.1, "PRUNED")]):
        run = client.create_run(sw, run_name=f"s-trial-{n}", tags={
            "mlflow.parentRunId": parent.info.run_id, "lit_rl.role": "trial", "lit_rl.sweep": "s",
            "optuna.trial_number": str(n), "optuna.trial_state": state, "optuna.direction": "maximize",
            "lit_rl.space": "data.init_args.g_ext", "lit_rl.derived": "data.init_args.g_on"})
        _log(client, run.info.run_id, {"sweep/objective": [(4, obj)]},
             params={"data.init_args.g_ext": g_ext, "data.init_args.g_on": 6 - g_ext})
    return uri, client


def test_pareto_front_by_hand():
    # (cost, quality): (50, .1) cheapest; (100, .5) beats (200, .4); (300, .7) best quality
    assert pareto_front([(100, 0.5), (200, 0.4), (300, 0.7), (50, 0.1)]) == [3, 0, 2]
    assert pareto_front([(1, 1.0), (1, 0.5)]) == [0]


def test_report_on_known_runs(store, tmp_path):
    uri, client = store
    runs = load_runs(uri, ["lit_rl-embedded"], label="tag:variant")
    assert [r.label for r in runs] == ["erils", "spg", "joint"]
    out = tmp_path / "fig1"
    drawn = build_report(runs, out, ReportSpec(table_metrics=["val/sudoku/greedy/accuracy", "train/loss"]))
    # Fig. 1: the metrics present (pass@1 is absent from these runs, so no empty panel)
    assert drawn["learning_curves.png"] == ["val/sudoku/greedy/accuracy", "train/on_policy/reward_mean"]
    assert drawn["per_source.png"] == ["on_policy", "external"]
    assert "pareto.png" not in drawn and not (out / "pareto.png").exists()
    md = (out / "report.md").read_text()
    # final / best (step): ERILS accuracy ends at 0.4, best 0.5 at step 10; loss is lower-is-better: best 1 at 10
    assert "| erils | FINISHED | 0.4 / 0.5 (10) | 2 / 1 (10) |" in md
    assert "| spg | FINISHED | 0.3 / 0.3 (20) | 2 / 1 (10) |" in md
    assert "| joint | FINISHED | 0.1 / 0.1 (0) | 2 / 1 (10) |" in md
    for png in ("learning_curves.png", "per_source.png"):
        _assert_png(out / png)


def _assert_png(path: Path):
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)
    assert img.shape[0] > 300 and img.shape[1] > 400
    # not blank: lines in several colours
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20


def test_pareto_and_sweep_figures_and_mlflow_artifacts(store, tmp_path, capsys):
    uri, client = store
    out = tmp_path / "rep"
    # metric names are configurable
    assert main(["--tracking_uri", uri, "--experiment", "double-rollout", "--experiment", "lit_rl-sweeps",
                 "--out", str(out), "--pareto_y", "val/countdown/greedy/accuracy"]) == 0
    printed = capsys.readouterr().out
    # Pareto points: mean tokens over the history; a = 100 (0.5), b = 200 (0.4) dominated by a, c = 300 (0.7)
    assert ("('dr-a', 100.0, 0.5, True)" in printed and "('dr-b', 200.0, 0.4, False)" in printed
            and "('dr-c', 300.0, 0.7, True)" in printed)
    assert (out / "sweep_s.png").exists() and "sweep_s.png: ['data.init_args.g_ext']" in printed
    md = (out / "report.md").read_text()
    assert "| dr-a | 100 | 0.5 | yes |" in md and "| dr-b | 200 | 0.4 |  |" in md
    assert "3 trials: 2 complete, 1 pruned." in md
    assert 'Best: trial 1 objective 0.6, params `{"data.init_args.g_ext": "2", "data.init_args.g_on": "4"}`' in md
    assert "study:s" not in md  # the parent run is not a variant
    _assert_png(out / "pareto.png")
    _assert_png(out / "sweep_s.png")
    # logged as artifacts of a report run (in the first --experiment)
    exp = client.get_experiment_by_name("double-rollout")
    reports = client.search_runs([exp.experiment_id], filter_string="tags.`lit_rl.role` = 'report'")
    assert len(reports) == 1
    names = {Path(a.path).name for a in client.list_artifacts(reports[0].info.run_id, "report")}
    assert names == {"report.md", "pareto.png", "sweep_s.png"}
    # a second report does not pick up the first one's run
    assert main(["--tracking_uri", uri, "--experiment", "double-rollout", "--out", str(tmp_path / "again"),
                 "--no_log"]) == 0
    assert "report-" not in (tmp_path / "again/report.md").read_text()


def test_selection_by_tag_and_study(store, tmp_path):
    uri, _ = store
    assert [r.name for r in load_runs(uri, tags={"variant": "spg"})] == ["spg"]
    assert [r.name for r in load_runs(uri, study="s")] == ["s-trial-0", "s-trial-1", "s-trial-2"]
    assert main(["--tracking_uri", uri, "--tag", "variant=nothing", "--no_log", "--out", str(tmp_path / "x")]) == 1


def test_a_study_that_matches_nothing_names_the_sweeps_and_experiments_there(store, tmp_path, capsys):
    uri, _ = store
    assert main(["--tracking_uri", uri, "--study", "nosuch", "--no_log", "--out", str(tmp_path / "x")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()  # was only "no runs matched"
    assert line == (f"no runs matched --study nosuch in {uri}; its sweeps: s; its experiments: Default, "
                    "double-rollout, lit_rl-embedded, lit_rl-sweeps"), line


def test_a_file_store_uri_is_one_line_not_mlflows_paragraph(tmp_path, capsys):
    assert main(["--tracking_uri", str(tmp_path / "mlruns"), "--no_log", "--out", str(tmp_path / "x")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: MLflow tracking URI '{tmp_path / 'mlruns'}' (--tracking_uri): MLflow 3's file store is "
                    "not supported; use the sqlite:/// URI the runs' config names (e.g. sqlite:///runs/mlflow.db) or "
                    "a server"), line
