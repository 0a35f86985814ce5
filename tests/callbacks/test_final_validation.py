"""Every fit ends with a validation (callbacks.FinalValidation, added by the fit command): a run whose
``max_steps`` is not a multiple of ``val_check_interval`` still logs its final greedy accuracy, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lit_rl.cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[2]


def _val_steps(tmp_path: Path, interval: int) -> dict[str, list[int]]:
    """4 updates = 2 rollout batches (tests/tiny_overlay.yaml, μ 2); ``interval`` rollout batches per validation."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--trainer.val_check_interval={interval}",
    ])
    client, run_id = MlflowClient(uri), cli.trainer.logger.run_id
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("val/")]
    return {k: [m.step for m in client.get_metric_history(run_id, k)] for k in keys}


@pytest.mark.parametrize("interval, want", [(3, [4]), (1, [2, 4])])
def test_a_fit_ends_with_one_validation_at_its_last_step(tmp_path, interval, want):
    steps = _val_steps(tmp_path, interval)
    assert steps  # interval 3 > 2 batches: before FinalValidation no val/ metric at all
    assert all(s == want for s in steps.values()), steps  # the final step once, not twice
