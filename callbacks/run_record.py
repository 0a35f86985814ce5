"""What a resume needs from a checkpoint, and one ``last.ckpt``: :class:`RunRecord`.

``python -m lit_rl fit`` adds it to every fit (:class:`lit_rl.lightning_cli.LitRLCLI`); naming it under
``trainer.callbacks`` changes nothing. :mod:`lit_rl.resume` reads what it writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rl.resume import RECORD_KEY, identity, mlflow_runs

__all__ = ["RunRecord"]


class RunRecord(L.Callback):
    """Record the run in every checkpoint and keep ``last.ckpt`` the newest state.

    * ``on_save_checkpoint``: ``checkpoint["lit_rl_run"] = {"identity": {task, algorithm, policy, data},
      "components": {config key: class_path}, "mlflow": [{"run_id", "tracking_uri"}]}``, so that a resume can
      refuse another run's checkpoint and continue the same MLflow run (:mod:`lit_rl.resume`).
    * ``on_train_start``: each ``ModelCheckpoint(save_last=True)`` takes the ``last.ckpt`` already in its
      folder as its own. Lightning versions a ``last.ckpt`` it did not write in this run to ``last-v1.ckpt``
      and leaves the old file in place: its ``last_model_path`` comes from the checkpoint, and is empty when
      :class:`callbacks.CheckpointOnSigterm` saved before the first periodic checkpoint, or points elsewhere
      when the run folder moved. Every later save then went to ``last-v1.ckpt`` while ``last.ckpt``, the file
      the docs' resume / ``predict`` / ``export`` commands read, stayed at the interruption.
      ``enable_version_counter=False`` would avoid it, but it is the user's setting and also governs the
      top-k names. Overwriting ``last.ckpt`` in place is safe with
      :class:`~lit_rl.checkpoint_io.AtomicCheckpointIO` (temp file + rename): a reader or a crash sees the
      old file or the new one.

    Args:
        components: every ``class_path`` the config chose under ``model`` and ``data``
            (:func:`lit_rl.resume.components`; the CLI passes them, ``None`` records none).
    """

    def __init__(self, components: dict[str, str] | None = None) -> None:
        self.components = dict(components) if components is not None else None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        record = {"identity": identity(pl_module, trainer.datamodule), "mlflow": mlflow_runs(trainer)}
        if self.components is not None:
            record["components"] = self.components
        checkpoint[RECORD_KEY] = record

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for cb in trainer.checkpoint_callbacks:
            if not isinstance(cb, ModelCheckpoint) or not cb.save_last or not cb.dirpath:
                continue
            if "{" in cb.CHECKPOINT_NAME_LAST:  # a templated last name ("{epoch}-last") is a new file each time
                continue
            last = cb.format_checkpoint_name({}, cb.CHECKPOINT_NAME_LAST)  # the name Lightning compares
            if Path(last).is_file():
                cb.last_model_path = last
