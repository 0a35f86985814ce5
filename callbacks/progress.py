"""A Rich progress bar that counts rollout batches of an RL run.

Lightning's bar counts training batches against ``max_steps``, but an RL step here makes ``μ`` optimizer
updates per rollout batch (``global_step`` counts updates), so its total would be μ times too large and
the endless prompt stream shows epoch ``0/-2``. This bar's total is ``ceil(remaining updates / μ)``, its label
says what it counts (``RL rollout batches (x4 updates)`` when μ = 4: 75 batches for ``max_steps`` 300), and it
leaves out Lightning's ``v_num``.
"""

from __future__ import annotations

import math

from lightning.pytorch.callbacks import RichProgressBar


class RolloutProgressBar(RichProgressBar):
    """``RichProgressBar`` whose total is the number of rollout batches left."""

    @property
    def total_train_batches(self) -> int | float:
        trainer = self.trainer
        per_batch = getattr(trainer.lightning_module, "updates_per_batch", 1) or 1
        if trainer.max_steps and trainer.max_steps > 0:
            return math.ceil(max(trainer.max_steps - trainer.global_step, 0) / per_batch)
        return super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        per_batch = getattr(getattr(self.trainer, "lightning_module", None), "updates_per_batch", 1) or 1
        desc = "RL rollout batches" + (f" (x{per_batch} updates)" if per_batch > 1 else "")
        if len(self.validation_description) > len(desc):
            desc = f"{desc:{len(self.validation_description)}}"
        return desc

    def get_metrics(self, trainer, pl_module):
        """Lightning's metrics without ``v_num`` (the logger's version: for MLflow the run id's tail, which says
        nothing on a progress bar)."""
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items
