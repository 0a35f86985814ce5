"""callbacks/dr_reliability.py: the reliability study's table, rows and metrics after a tiny double-rollout fit
through the real CLI (its binning on values computed by hand: tests/algorithms/test_dr_reliability.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "tests/algorithms"))  # the MLflow metrics reader of test_double_rollout
from test_double_rollout import _metrics  # noqa: E402


def test_tiny_chainsum_fit_writes_the_reliability_table(tmp_path):
    """The testbed config (chain sums, cut at </reasoning>) through the real CLI, with the reliability study."""
    import json

    from lit_rl.cli import run_lightning_cli

    torch.manual_seed(0)
    cli = run_lightning_cli([
        "fit",
        "--config", str(ROOT / "conf/double_rollout.yaml"), "--config", str(ROOT / "conf/double_rollout_chainsum.yaml"),
        "--config", str(ROOT / "tests/tiny_dr_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "--data.init_args.task.init_args.num_train=50",
        "--trainer.callbacks+=callbacks.ContinuationReliability",
    ])
    assert cli.model.dr.delimiter == "</reasoning>" and cli.trainer.global_step == 4
    report = json.loads((tmp_path / "reliability.json").read_text())
    overall = {r["rollout"]: r["n"] for r in report["table"] if r["by"] == "all"}
    assert 0 < report["rows"] == overall["correct"] + overall["incorrect"] <= 2 * 2 * 3  # 2 batches x 2 prompts x G 3
    for by in ("length", "difficulty"):  # every row lands in exactly one bin of each kind
        assert sum(r["n"] for r in report["table"] if r["by"] == by) == report["rows"]
    assert (tmp_path / "reliability.md").read_text().startswith("| by | bin |")
    raw = json.loads((tmp_path / "reliability_rows.json").read_text())  # what a report pools over seeds
    assert len(raw["correct"]) == len(raw["length"]) == report["rows"]
    assert any(k.startswith("reliability/cont_acc_after_") for k in _metrics(tmp_path))
