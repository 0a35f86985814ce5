"""scripts/decode_study.py on a real MLflow store: two decoders' runs, figures read back per run."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient
import pytest

from support.scripts import load_script


def _run(uri: str, gen_s: float, passes: list[float], final: float) -> None:
    client = MlflowClient(uri)  # a client, not mlflow's global tracking URI (other tests read it)
    exp = client.get_experiment_by_name("lit_rl-embedded")
    exp_id = exp.experiment_id if exp else client.create_experiment("lit_rl-embedded")
    run_id = client.create_run(exp_id, run_name="erils-sudoku-tiny").info.run_id
    for step, (p, c) in enumerate(zip(passes, [0.5, 0.9])):
        for key, value in {"train/on_policy/forward_passes": p, "train/on_policy/confidence_mean": c,
                           "time/generation_s": gen_s / 2}.items():
            client.log_metric(run_id, key, value, step=step)
    for step, (tok, compl, acc) in enumerate([(1.0, 1.0, 0.25), (0.9, 0.25, final)]):
        client.log_metric(run_id, "decode_agreement/token", tok, step=step)
        client.log_metric(run_id, "decode_agreement/completion", compl, step=step)
        client.log_metric(run_id, "val/sudoku/greedy/accuracy", acc, step=step)
    client.set_terminated(run_id)


def test_decode_study_groups_runs_by_decoder_and_reads_each_runs_figures(tmp_path, capsys):
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    _run(a, 10.0, [12, 12], 0.9)
    _run(a, 14.0, [12, 12], 0.8)  # a second seed in the same store
    _run(b, 6.0, [35, 9], 0.95)
    summary = load_script("scripts", "decode_study").main(
        ["--mode", "exact", a, "--mode", "threshold", b, "--out", str(tmp_path / "fig.png")])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == json.loads(json.dumps(summary))
    exact, thr = summary["modes"]["exact"], summary["modes"]["threshold"]
    assert sorted(f["final"] for f in exact) == [0.8, 0.9] and [f["generation_s"] for f in thr] == [6.0]
    assert thr[0]["passes_mean"] == 22 and thr[0]["passes_first"] == 35 and thr[0]["passes_last"] == 9
    assert thr[0]["agreement_completion_start"] == 1.0 and thr[0]["agreement_completion_end"] == 0.25
    assert thr[0]["confidence_first"] == 0.5 and thr[0]["confidence_last"] == 0.9
    assert any(line.startswith("| exact | 2 | – | – | – | – | 0.850 ± 0.071 | 12.0 ± 2.8 |") for line in out)
    assert (tmp_path / "fig.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        load_script("scripts", "decode_study").main(["--mode", "exact"])


def test_one_store_split_into_groups_by_run_folder_with_the_curve_points_and_figure(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/all.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("lit_rl-embedded")
    runs = [("/r/D/s0", [0.25, 0.6, 0.97]), ("/r/D/s1", [0.25, 0.5, 0.95]), ("/r/E/s0", [0.25, 0.4, 0.9])]
    for folder, curve in runs:
        run_id = client.create_run(exp_id).info.run_id
        if folder.endswith("s0"):  # a run logged since the folder is a tag; the others as older runs logged it
            client.set_tag(run_id, "lit_rl.run.trainer.default_root_dir", folder)
        else:
            client.log_param(run_id, "trainer.default_root_dir", folder)
        for step, acc in zip([0, 60, 300], curve):
            client.log_metric(run_id, "val/sudoku/greedy/accuracy", acc, step=step)
        client.set_terminated(run_id)
    summary = load_script("scripts", "decode_study").main(
        ["--mode", "D", f"{uri}#/D/", "--mode", "E", f"{uri}#/E/", "--out", str(tmp_path / "fig.png"),
         "--curves", str(tmp_path / "curves.png")])
    d, e = summary["modes"]["D"], summary["modes"]["E"]
    assert sorted(f["at_60"] for f in d) == [0.5, 0.6] and [f["final"] for f in e] == [0.9]
    assert all(f["at_120"] is None for f in d + e)  # not logged: no value, not a zero
    out = capsys.readouterr().out
    assert "| D | 2 | 0.550 ± 0.071 | – | – | – | 0.960 ± 0.014 |" in out
    assert (tmp_path / "curves.png").stat().st_size > 0
