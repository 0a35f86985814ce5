"""The tiny sweep the sweep tests share: a grid over G_ext on tests/tiny_overlay.yaml, and its MLflow runs."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"


def tiny_sweep(tmp_path: Path, **kw) -> dict:
    """A sweep config (a dict) over tests/tiny_overlay.yaml (seconds per trial)."""
    raw = {
        "study_name": "tiny",
        "base": [str(ROOT / "conf/erils.yaml"), str(ROOT / "tests/tiny_overlay.yaml")],
        "overrides": {"data": {"init_args": {"pool_path": str(POOL)}}},
        "space": {"data.init_args.g_ext": {"type": "categorical", "choices": [1, 2, 3]}},
        "derived": {
            "data.init_args.g_on": "4 - g_ext",
            # g_ext 3 gets a learning rate the threshold pruner below stops at its first report
            "model.init_args.optimizer.init_args.lr": "0.0002 if g_ext < 3 else 0.1",
        },
        "objective": {"metric": "val/sudoku/greedy/accuracy", "direction": "maximize"},
        "sampler": {"name": "grid"},
        "pruner": {"name": "threshold", "upper": 0.01},
        "prune_monitor": "train/lr",
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
        "output_dir": str(tmp_path / "out"),
        "heartbeat_interval": 1,
        "grace_period": 15,  # generous: a loaded 2-core machine can delay a live worker's heartbeat by seconds
    }
    raw.update(kw)
    return raw


def sweep_runs(tmp_path: Path, study: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("lit_rl-sweeps")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`lit_rl.sweep` = '{study}'")
    parents = [r for r in runs if r.data.tags.get("lit_rl.role") == "study"]
    children = {int(r.data.tags["optuna.trial_number"]): r for r in runs if r.data.tags.get("lit_rl.role") == "trial"}
    return parents, children
