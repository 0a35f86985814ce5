"""callbacks/progress.py: the progress bar counts the rollout batches left, not the optimizer updates."""

from __future__ import annotations

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks.progress import RolloutProgressBar


def _totals(module, tmp_path, max_steps: int) -> list:
    bar = RolloutProgressBar()
    seen: list = []

    class Probe(Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append((bar.total_train_batches, bar._get_train_description(0).strip()))

    trainer = Trainer(max_steps=max_steps, callbacks=[bar, Probe()], default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, limit_val_batches=0, accelerator="cpu", devices=1)
    trainer.fit(module)
    return seen


def test_the_total_is_the_rollout_batches_left_with_mu_updates_each(tmp_path):
    class RLLike(BoringModel):
        updates_per_batch = 4  # μ: optimizer updates per rollout batch (RLModule's attribute)

    # 10 updates at 4 per rollout batch: 3 batches (the last one cut short), not Lightning's 10 "batches"
    assert _totals(RLLike(), tmp_path / "rl", max_steps=10) == [(3, "RL rollout batches (x4 updates)")]
    # a module without μ counts as one update per batch
    assert _totals(BoringModel(), tmp_path / "plain", max_steps=10) == [(10, "RL rollout batches")]


def test_the_bar_leaves_out_v_num(tmp_path):
    """Lightning shows the logger's version (for MLflow the run id's tail) as ``v_num``: it says nothing here."""
    from lightning.pytorch.loggers import CSVLogger

    bar = RolloutProgressBar()
    seen: list = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append(bar.get_metrics(trainer, pl_module))

    Trainer(max_steps=2, callbacks=[bar, Probe()], default_root_dir=tmp_path, logger=CSVLogger(tmp_path),
            enable_checkpointing=False, limit_val_batches=0, accelerator="cpu", devices=1).fit(BoringModel())
    assert seen and all("v_num" not in m for m in seen)
