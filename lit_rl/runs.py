"""Where a run's local files go, computed the same way on every rank without a collective."""

from __future__ import annotations

from pathlib import Path

import lightning as L


def run_dir(trainer: L.Trainer, output_dir: str | None = None) -> Path:
    """``output_dir``, else the first logger's local folder, else ``trainer.default_root_dir``.

    Lightning's ``trainer.log_dir`` broadcasts from rank 0, so calling it from rank-0-only code under
    DDP deadlocks; every rank has the same config, so this computes the same folder with no broadcast.
    """
    if output_dir:
        return Path(output_dir)
    for logger in trainer.loggers[:1]:
        local = (getattr(logger, "log_dir", None) if type(logger).__name__ in ("TensorBoardLogger", "CSVLogger")
                 else getattr(logger, "save_dir", None))
        if local:
            return Path(local)
    return Path(trainer.default_root_dir)
