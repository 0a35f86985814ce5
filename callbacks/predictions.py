"""``python -m lit_rl predict``: the evaluation set's completions as a JSONL file that ``score`` reads.

    python -m lit_rl predict --config runs/erils/config.yaml --ckpt_path runs/erils/checkpoints/last.ckpt
    python -m lit_rl score --task sudoku --generations runs/erils/predictions.jsonl --details items.jsonl

The DataModule's predict batches are its evaluation batches (the task's eval split, ``eval_size`` of it,
decoded with ``eval_generation``: greedy for the shipped configs), so the file's score is the run's
``val/<task>/greedy/accuracy`` at that checkpoint. To generate for your own prompts, point a
:class:`~lit_rl.tasks.PromptTask`'s ``eval_path`` at them. Each line: ``prompt_id``, ``question``,
``completion``, ``ground_truth`` (and the task's ``puzzle`` where it has one), ``correct``, ``total``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from lit_rl.atomic import atomic_write_text
from lit_rl.runs import run_dir


class PredictionWriter(BasePredictionWriter):
    """Write every rank's predicted records to one JSONL file per rank, atomically, after the predict epoch.

    Args:
        path: the output file (default ``<run folder>/predictions.jsonl``); under DDP rank ``r`` writes
            ``<stem>.rank<r>.jsonl`` next to it (``score`` pools several files).
    """

    def __init__(self, path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path
        self.written: Path | None = None

    def output_path(self, trainer: L.Trainer) -> Path:
        path = Path(self.path) if self.path else run_dir(trainer) / "predictions.jsonl"
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Sequence[Any],
                           batch_indices: Any) -> None:
        rows = [rec for batch in predictions for rec in (batch or [])]
        path = self.output_path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        self.written = path
        correct, total = sum(r["correct"] for r in rows), sum(r["total"] for r in rows)
        accuracy = f"{correct / total:.4f}" if total else "n/a"
        print(f"predict: {len(rows)} completions -> {path} (evaluation accuracy {accuracy})", flush=True)
