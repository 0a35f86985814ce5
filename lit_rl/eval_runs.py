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

A run of validate without a checkpoint (the config's weights) is marked the same, at step 0. ``--ckpt_path
last`` is resolved here as ``fit`` resolves it, and that file is the one validated.
"""

from __future__ import annotations

from typing import Any

__all__ = ["checkpoint_facts", "mark_evaluation"]


def checkpoint_facts(ckpt_path: Any, trainer: Any) -> tuple[Any, int, str | None]:
    """``(the checkpoint to load, its global step, the fit's MLflow run id)`` for ``validate``/``test``:
    ``last`` resolved as ``fit`` resolves it (the newest readable checkpoint of the run,
    :func:`lit_rl.resume.resolve_checkpoint`; ``None`` when there is none: the config's weights), a file
    read once; ``best`` and remote URLs are left to Lightning (step 0 in the run's name)."""
    from lit_rl.resume import RECORD_KEY, resolve_checkpoint

    path, ckpt = resolve_checkpoint(ckpt_path, trainer, weights_only=False)
    if ckpt is None:
        return path, 0, None
    runs = (ckpt.get(RECORD_KEY) or {}).get("mlflow") or [{}]
    return path, int(ckpt.get("global_step", 0)), runs[0].get("run_id")


def mark_evaluation(trainer: Any, stage: str, ckpt_path: Any) -> Any:
    """Name, tag and step the MLflow runs of a ``validate``/``test`` (module docstring; rank 0 only) and return
    the checkpoint to load (:func:`checkpoint_facts`), so the run describes the checkpoint evaluated.

    A run the config names (``run_id``, e.g. the fit's own) gets the values at the checkpoint's step but no
    evaluation tags: it is the user's run, and ``report`` must keep showing it."""
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities import rank_zero_only

    path, step, fit_run = checkpoint_facts(ckpt_path, trainer)
    loggers = [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]
    if not loggers or rank_zero_only.rank != 0:
        return path
    for logger in loggers:
        logger.eval_step = step
        if logger._run_id is not None:  # the config chose the run
            continue
        logger._run_name = f"{logger._run_name or stage} [{stage} @ step {step}]"  # the run is created with it
        client, run_id = logger.experiment, logger.run_id
        tags = {"lit_rl.role": "evaluation", "lit_rl.stage": stage, "lit_rl.checkpoint_step": str(step)}
        if path is not None:
            tags["lit_rl.checkpoint"] = str(path)
        if fit_run:
            tags["lit_rl.evaluates"] = fit_run
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
    return path
