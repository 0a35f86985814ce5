"""Every fit ends with an evaluation: :class:`FinalValidation`."""

from __future__ import annotations

from typing import Any

import lightning as L

__all__ = ["FinalValidation"]


class FinalValidation(L.Callback):
    """Run the validation loop after the last training batch, so a run whose ``max_steps`` is not a multiple of
    ``val_check_interval`` still ends with its accuracy (a 4-step smoke run of ``conf/erils.yaml``, whose
    interval is 15 rollout batches, ended on ``train/loss`` alone).

    How: when a batch brings ``global_step`` to ``max_steps``, it sets ``trainer.should_stop``, which makes
    Lightning's epoch loop validate after that batch (as it does for early stopping) unless the interval
    already does; the fit then ends where ``max_steps`` ends it. The ``fit`` command adds it unless the config
    lists one; a run whose last batch is a scheduled validation is unchanged. A fit killed during that final
    validation resumes from ``last.ckpt`` at ``max_steps`` and ends at once, without it: run ``validate`` on
    the checkpoint.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True
