"""lit_rl/algorithms/losses.py's ``objective``: the clipped policy-gradient loss's per-batch function is a
parameter (a dotted path); CISPO and a user's own function run through the same loss class."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rl.algorithms.losses import ClippedPGLoss, GRPOLossSettings
from lit_rl.core.pg import cispo_loss, clipped_pg_loss
from lit_rl.errors import FieldError

ROOT = Path(__file__).resolve().parents[2]


def test_the_objective_is_a_dotted_path_resolved_once_and_refused_when_it_does_not_import():
    assert ClippedPGLoss().objective is clipped_pg_loss
    assert ClippedPGLoss(GRPOLossSettings(objective="lit_rl.core.pg.cispo_loss")).objective is cispo_loss
    with pytest.raises(FieldError) as err:
        GRPOLossSettings(objective="lit_rl.core.pg.no_such_loss")
    assert err.value.field == "objective" and "cannot be imported" in str(err.value)
    with pytest.raises(FieldError, match="is not a function"):
        GRPOLossSettings(objective="lit_rl.core.pg.AGGREGATIONS")


def _fit(tmp_path, *extra):
    from lit_rl.cli import run_lightning_cli

    torch.manual_seed(0)
    return run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/double_rollout.yaml"), "--config", str(ROOT / "conf/grpo.yaml"),
        *extra, "--config", str(ROOT / "tests/tiny_dr_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/m.db",
        "--data.init_args.task.init_args.reward_funcs=[support.objectives.digit_reward]",  # advantages not all 0
        "--data.init_args.task.init_args.num_train=50",
    ])


def _history(folder, key):
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{folder}/m.db")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def test_cispo_and_a_users_function_train_through_the_shipped_config(tmp_path):
    """conf/cispo.yaml is one line of substance. Its loss is ``-w·A·logp``, the PPO clip's ``-A·ratio``: the
    logged losses differ (a token inside the clip range gets the same gradient from both, ``-A·ratio·∇logp``, so
    a tiny run's weights need not). A function outside lit_rl is one ``--model...objective`` away."""
    ppo = _fit(tmp_path / "ppo")
    cispo = _fit(tmp_path / "cispo", "--config", str(ROOT / "conf/cispo.yaml"))
    assert cispo.model.loss_fn.objective is cispo_loss and cispo.trainer.global_step == ppo.trainer.global_step == 4
    assert cispo.model.loss_fn.settings.eps_low == 1.0
    pg = [_history(tmp_path / name, "train/grpo/pg_loss") for name in ("ppo", "cispo")]
    assert len(pg[0]) == len(pg[1]) and pg[0] != pg[1], pg
    assert all(torch.isfinite(torch.tensor(v)) for v in pg[1])
    assert torch.isfinite(torch.tensor(float(cispo.trainer.callback_metrics["train/grpo/clip_frac"])))
    own = _fit(tmp_path / "own", "--model.init_args.loss.objective=support.objectives.halved_clip")
    assert own.model.loss_fn.objective.__name__ == "halved_clip" and "train/grpo/halved" in own.trainer.callback_metrics
