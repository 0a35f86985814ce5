"""What a resume needs from a checkpoint, and one ``last.ckpt``: :class:`RunRecord`.

``python -m lit_rl fit`` adds it to every fit (:class:`lit_rl.lightning_cli.LitRLCLI`); naming it under
``trainer.callbacks`` changes nothing. :mod:`lit_rl.resume` reads what it writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from lit_rl.resume import RECORD_KEY, identity, mlflow_runs

__all__ = ["RunRecord", "fold_versions"]


class RunRecord(L.Callback):
    """Record the run in every checkpoint and keep ``last.ckpt`` the newest state.

    * ``on_save_checkpoint``: ``checkpoint["lit_rl_run"] = {"identity": {task, algorithm, policy, data},
      "components": {config key: class_path}, "mlflow": [{"run_id", "tracking_uri"}]}``, so that a resume can
      refuse another run's checkpoint and continue the same MLflow run (:mod:`lit_rl.resume`).
    * ``on_exception``: a failed checkpoint write logs its batch's metrics first (else that step would be
      missing from the run after the resume).
    * ``on_train_start``: each ``ModelCheckpoint(save_last=True)`` takes the ``last.ckpt`` already in its
      folder as its own. Lightning versions a ``last.ckpt`` it did not write in this run to ``last-v1.ckpt``
      and leaves the old file in place: its ``last_model_path`` comes from the checkpoint, and is empty when
      :class:`callbacks.CheckpointOnSigterm` saved before the first periodic checkpoint, or points elsewhere
      when the run folder moved. Every later save then went to ``last-v1.ckpt`` while ``last.ckpt``, the file
      the docs' resume / ``predict`` / ``export`` commands read, stayed at the interruption.
      ``enable_version_counter=False`` would avoid it, but it is the user's setting and also governs the
      top-k names. ``last-v1.ckpt`` files already there (older runs) are folded into ``last.ckpt`` first
      (:func:`fold_versions`). Overwriting ``last.ckpt`` in place is safe with
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
            if trainer.is_global_zero:
                fold_versions(Path(last), resumed=getattr(trainer, "ckpt_path", None))
            if Path(last).is_file():
                cb.last_model_path = last

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A checkpoint write that failed (:class:`~lit_rl.errors.CheckpointError`: a full disk) stops the fit in
        ``on_train_batch_end``, before Lightning hands that batch's metrics to the loggers; the resume restarts
        after the periodic checkpoint of that same step, so the step would never be logged. Hand them over here
        (the loggers' ``finalize`` sends them, or spills them to a file with the replay command)."""
        from lit_rl.errors import CheckpointError

        if not isinstance(exception, CheckpointError) or not trainer.training:
            return
        connector = getattr(trainer, "_logger_connector", None)
        try:  # Lightning's own end-of-batch steps (training_epoch_loop.advance), which the exception skipped
            connector.on_batch_end()
            connector.update_train_step_metrics()
        except Exception as e:  # noqa: BLE001 - a Lightning without these: the step stays unlogged, as before
            rank_zero_info(f"the metrics of step {trainer.global_step} could not be logged after the failed "
                           f"checkpoint write ({type(e).__name__}: {e})")


def _step(path: Path) -> int:
    """A checkpoint's ``global_step`` (-1 when it cannot be read)."""
    import torch

    try:
        return int(torch.load(path, map_location="cpu", mmap=True, weights_only=False).get("global_step", -1))
    except Exception:  # noqa: BLE001 - torn or foreign: older than any readable one
        return -1


def fold_versions(last: Path, resumed: str | Path | None = None) -> list[str]:
    """One ``last.ckpt``: fold the ``last-v1.ckpt``, ``last-v2.ckpt`` ... that Lightning wrote beside ``last``
    (runs before this fix, or a config of its own) into it. The file this fit resumed from (``resumed``) wins if it
    is one of them; else the newest readable (by step, then modification time). It becomes ``last.ckpt`` (renamed
    over it, atomically); the other versions are removed. Only names ``<last>-v<digits>.ckpt`` count. One line names
    what happened. Returns the versions' names."""
    import re

    pattern = re.compile(rf"^{re.escape(last.stem)}-v\d+{re.escape(last.suffix)}$")
    versions = sorted(p for p in last.parent.glob(f"{last.stem}-v*{last.suffix}") if pattern.match(p.name))
    if not versions:
        return []
    files = ([last] if last.is_file() else []) + versions
    chosen = [p for p in files if resumed is not None and p.resolve() == Path(resumed).resolve()]
    newest = chosen[0] if chosen else max(files, key=lambda p: (_step(p), p.stat().st_mtime, p == last))
    if newest != last:
        os.replace(newest, last)
    gone = [p.name for p in versions if p != newest]
    for p in versions:
        if p != newest:
            p.unlink(missing_ok=True)
    rank_zero_info(f"resume: one {last.name}: " + (f"{newest.name} (step {_step(last)}) renamed to {last.name}"
                                                  if newest != last else f"{last.name} kept")
                   + (f"; removed {', '.join(gone)}" if gone else ""))
    return [p.name for p in versions]
