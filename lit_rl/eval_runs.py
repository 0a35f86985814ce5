"""``validate`` / ``test`` on a fit's checkpoint: an MLflow run marked as that checkpoint's evaluation.

Without this, ``python -m lit_rl validate --config runs/<name>/config.yaml --ckpt_path ...`` opened a new run
with the fit's run name, logged its metrics at step 0 (Lightning's validate has no global step), and
``report`` drew it as a second training variant. Here, before the loop starts, each MLflow logger's run:

* is named ``<run name> [validate @ step N]`` and tagged ``lit_rl.role = evaluation`` (``report`` leaves
  such runs out of its curves and tables), ``lit_rl.stage``, ``lit_rl.evaluates`` (the fit's MLflow run id,
  from the checkpoint's :class:`callbacks.run_record.RunRecord`), ``lit_rl.checkpoint`` and
  ``lit_rl.checkpoint_step``;
* logs its metrics at the checkpoint's step ``N`` (:attr:`lit_rl.loggers.MLFlowLogger.eval_step`), so they
  line up with the fit's curves in MLflow's compare view.

A run of validate without a checkpoint (the config's weights) is marked the same, at step 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["mark_evaluation"]


def _checkpoint_facts(ckpt_path: Any, trainer: Any) -> tuple[Path | None, int, str | None]:
    """``(path, global step, the fit's MLflow run id)`` of the checkpoint ``validate``/``test`` will load."""
    from lit_rl.resume import RECORD_KEY, resolve_checkpoint

    path, ckpt = resolve_checkpoint(ckpt_path, trainer, weights_only=False)
    if ckpt is None:
        return (Path(path) if path is not None and Path(str(path)).is_file() else None), 0, None
    runs = (ckpt.get(RECORD_KEY) or {}).get("mlflow") or [{}]
    return Path(path), int(ckpt.get("global_step", 0)), runs[0].get("run_id")


def mark_evaluation(trainer: Any, stage: str, ckpt_path: Any) -> None:
    """Name, tag and step the MLflow runs of a ``validate``/``test`` (module docstring); rank 0 only."""
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities import rank_zero_only

    loggers = [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]
    if not loggers or rank_zero_only.rank != 0:
        return
    path, step, fit_run = _checkpoint_facts(ckpt_path, trainer)
    for logger in loggers:
        label = f"[{stage} @ step {step}]"
        if logger._run_id is None:  # the run is created on first use, with this name
            logger._run_name = f"{logger._run_name or stage} {label}"
        logger.eval_step = step
        client, run_id = logger.experiment, logger.run_id
        tags = {"lit_rl.role": "evaluation", "lit_rl.stage": stage, "lit_rl.checkpoint_step": str(step)}
        if path is not None:
            tags["lit_rl.checkpoint"] = str(path)
        if fit_run:
            tags["lit_rl.evaluates"] = fit_run
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
