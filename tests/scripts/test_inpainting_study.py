"""scripts/inpainting_study.py on a real MLflow store: rollout tokens from the logged config and the stage's
cost, and a variant's accuracy at its baseline's token budget, by hand."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient
import pytest

from support.scripts import load_script


def _run(uri: str, vals: list[tuple[int, float]], inpaint: dict[int, float] | None = None) -> None:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("lit_rl-embedded")
    exp_id = exp.experiment_id if exp else client.create_experiment("lit_rl-embedded")
    run_id = client.create_run(exp_id, run_name="x").info.run_id
    for k, v in {"data.init_args.prompts_per_batch": 2, "data.init_args.g_on": 2,
                 "data.init_args.generation.gen_length": 10}.items():
        client.log_param(run_id, k, v)  # 2 prompts x 2 rows x 10 positions = 40 tokens per batch
    for step in (4, 8):  # two rollout batches, logged at the update that ends each
        client.log_metric(run_id, "train/on_policy/frac_reward_zero_std", 0.25 if step == 4 else 0.75, step=step)
        if inpaint is not None:
            client.log_metric(run_id, "train/cost/tokens_inpaint", inpaint[step], step=step)
            client.log_metric(run_id, "train/inpaint/trigger_rate", 1.0 if step == 4 else 0.5, step=step)
            client.log_metric(run_id, "train/inpaint/rows_replaced", 3.0, step=step)
    for step, acc in vals:
        client.log_metric(run_id, "val/sudoku/greedy/accuracy", acc, step=step)
    client.set_terminated(run_id)


def test_tokens_and_the_equal_token_comparison_by_hand(tmp_path, capsys):
    base, var = f"sqlite:///{tmp_path}/base.db", f"sqlite:///{tmp_path}/var.db"
    _run(base, [(0, 0.2), (8, 0.6)])  # 80 tokens in all
    # + 2 prompts x 10 and x 5 inpainted positions: 60 tokens after batch 1, 110 after batch 2
    _run(var, [(0, 0.2), (4, 0.5), (8, 0.8)], inpaint={4: 10.0, 8: 5.0})
    summary = load_script("scripts", "inpainting_study").main(
        ["--method", "d1", base, "--method", "igpo", var, "--pair", "igpo=d1", "--out", str(tmp_path / "f.png")])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == json.loads(json.dumps(summary))
    d1, igpo = summary["methods"]["d1"][0], summary["methods"]["igpo"][0]
    assert d1["tokens"] == 80 and igpo["tokens"] == 110 and d1["final"] == 0.6 and igpo["final"] == 0.8
    # at 80 tokens the variant is between its evaluations at 60 (0.5) and 110 (0.8): 0.5 + 20/50 * 0.3
    assert igpo["at_base_tokens"] == pytest.approx(0.62) and igpo["base_tokens"] == 80
    assert d1["zero_adv_share"] == pytest.approx(0.5) and d1["trigger_first"] is None
    assert igpo["trigger_first"] == 1.0 and igpo["trigger_last"] == 0.5 and igpo["rows_replaced"] == 3.0
    assert any(line.startswith("| igpo | 1 | 0.800 | 0.620 |") for line in out)
    assert (tmp_path / "f.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        load_script("scripts", "inpainting_study").main(["--method", "d1", base, "--pair", "igpo=d1"])
