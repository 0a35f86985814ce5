"""scripts/real_curves.py on a real MLflow store made here: a run's accuracy points with its validate run's point
added at its step, and generated tokens summed over both rollout stages per batch (prompts per batch x per prompt)."""

from __future__ import annotations

import json

from support.scripts import load_script


def test_points_tokens_and_the_validate_runs_point(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    store = tmp_path / "m.db"
    client = MlflowClient(f"sqlite:///{store}")
    exp = client.create_experiment("e")
    fit = client.create_run(exp, run_name="dr").info.run_id
    for step, acc in ((0, 0.1), (2, 0.3)):
        client.log_metric(fit, "val/word_problems/greedy/accuracy", acc, step=step)
    for step, (t1, t2) in {1: (10.0, 5.0), 2: (8.0, 4.0), 3: (6.0, 3.0)}.items():
        client.log_metric(fit, "train/cost/tokens_stage1", t1, step=step)
        client.log_metric(fit, "train/cost/tokens_stage2", t2, step=step)
        client.log_metric(fit, "rollouts/on_policy/length_mean", t1, step=step)
    val = client.create_run(exp, run_name="dr [validate @ step 4]").info.run_id
    client.log_metric(val, "val/word_problems/greedy/accuracy", 0.5, step=4)
    out = tmp_path / "c.png"
    curves = load_script("scripts", "real_curves")
    assert curves.main(["--store", str(store), "--run", "DR=dr", "--prompts_per_batch", "2", "--out", str(out)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["DR"]
    assert got["accuracy"] == [[0, 0.1], [2, 0.3], [4, 0.5]]
    # per batch: (t1 + t2) x 2 prompts; step 4 (after the last logged batch) counts the tokens so far
    assert got["tokens_at"] == {"0": 0.0, "2": 30.0 + 24.0, "4": 30.0 + 24.0 + 18.0}
    assert out.stat().st_size > 10_000
