"""End to end: the real CLI trains a tiny ERILS run; weights change and MLflow holds per-source metrics."""

import math
from pathlib import Path

import mlflow
import torch

from lit_rl.cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[2]


def _fit(tmp_path, *extra):
    args = [
        "fit",
        "--config", str(ROOT / "conf/erils.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
        *extra,
    ]
    return run_lightning_cli(args)


def test_tiny_erils_fit_updates_weights_and_logs_per_source_metrics(tmp_path):
    torch.manual_seed(0)
    cli = _fit(tmp_path)
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step == 4  # 2 rollout batches x 2 updates
    # parameters changed relative to a freshly built policy with the same seed
    fresh = type(module.policy)(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    changed = [n for (n, p), (_, q) in zip(module.policy.named_parameters(), fresh.named_parameters())
               if not torch.equal(p.detach(), q)]
    assert len(changed) > 10
    # the DataModule produced rollouts at batch start and advanced its cursor past both batches
    assert trainer.datamodule.cursor == 2
    assert (tmp_path / "prompt_order.jsonl").exists()
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("lit_rl-embedded")
    run = client.search_runs([exp.experiment_id])[0]
    keys = set(run.data.metrics)
    for src in ("on_policy", "external"):
        for stat in ("reward_mean", "reward_std", "advantage_mean", "advantage_std", "length_mean"):
            assert f"train/{src}/{stat}" in keys
    assert {"train/loss", "train/lr", "val/sudoku/greedy/accuracy"} <= keys
    # TRL-style diagnostics: the gradient norm before clipping, groups without signal, per-reward metrics
    assert run.data.metrics["train/grad_norm"] > 0.0
    assert 0.0 <= run.data.metrics["train/on_policy/frac_reward_zero_std"] <= 1.0
    assert {"rewards/sudoku_reward/mean", "rewards/sudoku_reward/std"} <= keys
    # the denoiser's entropy at the scored (masked) positions: between 0 and log V (nats)
    vocab = len(cli.model.policy.tokenizer)
    assert 0.0 < run.data.metrics["train/spg/entropy"] <= math.log(vocab) + 1e-4
    # the stall diagnostics (#16): format rate, the advantages' sign balance, per-source ELBO
    assert {"train/on_policy/format_rate", "train/on_policy/advantage_pos_frac", "train/on_policy/advantage_neg_frac",
            "train/spg/elbo_external", "train/rows_trained"} <= keys
    # the on-policy rows' ELBO is over the rows trained: absent only when every on-policy row had A = 0 (SPGLoss
    # skips their forward), i.e. every group's two on-policy rewards were equal at every batch
    zero_std = client.get_metric_history(run.info.run_id, "train/on_policy/frac_reward_zero_std")
    assert "train/spg/elbo_on_policy" in keys or all(m.value == 1.0 for m in zero_std)
    assert max(m.value for m in client.get_metric_history(run.info.run_id, "train/rows_trained")) <= 2 * 4
    pos = run.data.metrics["train/on_policy/advantage_pos_frac"]
    neg = run.data.metrics["train/on_policy/advantage_neg_frac"]
    assert 0.0 <= pos <= 1.0 and 0.0 <= neg <= 1.0 and pos + neg <= 1.0
    assert run.data.metrics["train/spg/elbo_external"] < 0.0  # a log-likelihood per token
    # the resolved config as params (what MLflow's compare view lines runs up by) and the code's commit
    params = run.data.params
    assert params["model.init_args.advantages.class_path"] == "lit_rl.algorithms.advantages.SourceSpecific"
    assert params["data.init_args.g_ext"] == "2" and params["model.init_args.updates_per_batch"] == "2"
    assert params["trainer.max_steps"] == "4" and len(params) > 100
    assert "tiny_overlay.yaml" in run.data.tags["lit_rl.config_files"]
    assert len(run.data.tags.get("git.commit", "x" * 40)) == 40
    # external rollouts are the scripted solver's: mostly correct (error rate 0.1)
    assert run.data.metrics["train/external/reward_mean"] > 0.5


def test_source_metrics_count_continuation_rows_with_the_on_policy_rows():
    from lit_rl.algorithms.erils import source_metrics
    from lit_rl.batch import RolloutBatch

    n, P, L = 4, 2, 3
    lengths = torch.tensor([3, 1, 2, 2])
    ro = RolloutBatch(
        input_ids=torch.zeros(n, P + L, dtype=torch.long), attention_mask=torch.ones(n, P + L, dtype=torch.long),
        prompt_len=P, completion_mask=torch.arange(L)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.25]), source=torch.tensor([0, 2, 1, 0]),  # row 1: CONTINUATION
        group=torch.zeros(n, dtype=torch.long), texts=[""] * n, prompt_ids=["a"] * n,
        hit_limit=torch.tensor([True, False, False, False]),
    ).with_advantages(torch.tensor([0.5, -0.5, 0.5, 0.0]))
    m = source_metrics(ro)
    # on-policy = rows 0, 1, 3 (source 0 and 2): rewards [1, 0, 0.25], lengths [3, 1, 2]
    assert math.isclose(m["train/on_policy/reward_mean"], 1.25 / 3, rel_tol=1e-6)
    assert math.isclose(m["train/on_policy/length_mean"], 2.0)
    assert math.isclose(m["train/on_policy/hit_limit_frac"], 1 / 3, rel_tol=1e-6)
    assert math.isclose(m["train/on_policy/advantage_neg_frac"], 1 / 3, rel_tol=1e-6)
    assert m["train/external/reward_mean"] == 0.5 and m["train/rollouts_kept"] == 4
