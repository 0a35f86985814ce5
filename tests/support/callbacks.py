"""Small Lightning callbacks for tests (importable by class path: ``support.callbacks.BatchCounter``)."""

from __future__ import annotations

import lightning as L


class BatchCounter(L.Callback):
    """Counts the training batches this process ran and the global step the first one started at."""

    def __init__(self) -> None:
        self.batches = 0
        self.first_step: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_step is None:
            self.first_step = trainer.global_step
        self.batches += 1


def find(trainer: L.Trainer, cls: type) -> L.Callback:
    return next(cb for cb in trainer.callbacks if isinstance(cb, cls))
