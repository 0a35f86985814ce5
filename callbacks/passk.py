"""Checkpoint Pass@k evaluation (docs/tasks.md; ERILS §V-A, App. C-E).

Every ``every_n_steps`` optimizer steps from ``start_step`` (and optionally at fit start and at fit end)
the current policy is evaluated on the task's eval set, or a fixed subset, under a list of named
configurations (:class:`lit_rl.evaluation.EvalConfig`; default :func:`lit_rl.evaluation.paper_configs`:
``multi`` T 0.9 × 4 seeds 1001..1004 at L_gen 256, and ``det128/det256/det512`` at T 0). The numbers are
``val/<task>/<config>/pass@k`` (k = 1..n; Sudoku: best-of-k cell accuracy pooled over blank cells),
``.../accuracy``, ``.../length_mean`` and ``.../hit_limit_frac``.

Where they go:

* ``pl_module.log(..., logger=False)`` from ``on_train_batch_end``, so ``trainer.callback_metrics`` holds
  them before :class:`~lightning.pytorch.callbacks.ModelCheckpoint` runs its own ``on_train_batch_end``
  (Lightning runs checkpoint callbacks last): ``ModelCheckpoint(monitor="val/sudoku/det256/pass@1",
  mode="max", every_n_train_steps=<every_n_steps>)`` keeps the best checkpoint. ``every_n_steps`` should be
  a multiple of the module's ``updates_per_batch`` (μ) so both fire on the same batch;
* every logger, directly, at ``step = global_step`` (independent of ``log_every_n_steps``). MLflow metric
  names cannot hold ``@``, so MLflow gets ``pass_at_k``;
* a results table across checkpoints (``passk_table.csv`` long format, ``passk_table.md`` one row per
  step) in ``<run dir>/eval`` after every evaluation, and at the end of fit the App. D report — best
  checkpoint per configuration and the final checkpoint — as ``passk_report.md`` / ``.json``; all are
  logged as MLflow artifacts (``eval/``) when an ``MLFlowLogger`` is present. The table lives in the
  callback's state, so it survives a resume.

``python -m lit_rl validate|test --config ... [--ckpt_path ...]`` runs the same configurations once in
``on_validation_epoch_end`` / ``on_test_epoch_end`` (files ``passk_validate_*`` / ``passk_test_*``).

DDP: rank r evaluates eval batches r, r+W, ... (the same batches as on one device, so the same numbers),
and the metric states are summed over ranks by torchmetrics. Only rank 0 writes files.
Evaluation runs under ``torch.random.fork_rng``: it does not move the training RNG streams.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_rl.atomic import atomic_write_text
from lit_rl.errors import FieldError
from lit_rl.evaluation import (
    ConfigScorer,
    EvalConfig,
    ResultsTable,
    dumps_json,
    eval_batches,
    is_due,
    metric_key,
    paper_configs,
    run_config,
    select_subset,
    settings_summary,
)
from lit_rl.tasks.base import Example, Task
from lit_rl.runs import run_dir

__all__ = ["PassAtKEvaluation", "mlflow_metric_name"]


def mlflow_metric_name(name: str) -> str:
    """MLflow accepts only ``[/\\w.\\- :]`` in metric names: ``pass@1`` → ``pass_at_1``."""
    return re.sub(r"[^/\w.\- :]", "_", name.replace("@", "_at_"))


class PassAtKEvaluation(Callback):
    """Periodic Pass@k evaluation of the current policy under named decoding configurations.

    Args:
        configs: the configurations (default: the paper's ``multi``, ``det128``, ``det256``, ``det512``).
        every_n_steps: evaluate every this many optimizer steps (``trainer.global_step``).
        start_step: first scheduled evaluation step (then ``start_step + every_n_steps``, ...).
        eval_at_start: also evaluate the starting policy (step 0) when a fresh fit starts.
        eval_at_end: also evaluate the final weights when fit ends (unless that step was just evaluated).
        subset_size: evaluate a fixed subset of this many prompts (paper analysis runs: 128); ``None``: all.
        subset_mode: ``"first"`` (the first N) or ``"random"`` (a seeded sample, kept in set order).
        subset_seed: seed of the ``"random"`` subset.
        batch_size: prompts per generation call.
        max_prompt_len: prompts keep their last N tokens (default: the DataModule's ``max_prompt_len``).
        task: the task (default: the DataModule's ``task``).
        select_metric: metric that picks the best checkpoint in the report (e.g. ``pass@1``).
        output_dir: where tables and reports go (default ``<log dir or default_root_dir>/eval``).
        num_logged_samples: prompts per configuration whose completions are saved with each evaluation.
        run_on_validate: run in ``trainer.validate`` / ``trainer.test`` (``python -m lit_rl validate``).
        name: a label in this evaluation's file names (``passk_<name>_table.csv``, ...), so that a second
            evaluation beside the config's own (``--config conf/eval/erils_lengths.yaml`` after the run's config) does
            not overwrite its files; ``None``: ``passk_table.csv``, ...
    """

    @staticmethod
    def check_args(configs: Sequence[EvalConfig] | None = None, every_n_steps: int = 100, start_step: int = 0,
                   batch_size: int = 32, subset_mode: str = "first") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if every_n_steps < 1:
            raise FieldError("every_n_steps", f"must be >= 1, got {every_n_steps}")
        if start_step < 0:
            raise FieldError("start_step", f"must be >= 0, got {start_step}")
        if batch_size < 1:
            raise FieldError("batch_size", f"must be >= 1, got {batch_size}")
        if subset_mode not in ("first", "random"):
            raise FieldError("subset_mode", f"must be 'first' or 'random', got {subset_mode!r}")
        if configs is not None:
            if not configs:
                raise FieldError("configs", "is empty: list at least one configuration, or leave it out (the "
                                 "paper's)")
            names = [c.name for c in configs]
            if len(set(names)) != len(names):
                raise FieldError("configs", f"names must be unique, got {names}")

    def __init__(
        self,
        configs: list[EvalConfig] | None = None,
        every_n_steps: int = 100,
        start_step: int = 0,
        eval_at_start: bool = False,
        eval_at_end: bool = True,
        subset_size: int | None = None,
        subset_mode: str = "first",
        subset_seed: int = 0,
        batch_size: int = 32,
        max_prompt_len: int | None = None,
        task: Task | None = None,
        select_metric: str = "pass@1",
        output_dir: str | None = None,
        num_logged_samples: int = 4,
        run_on_validate: bool = True,
        name: str | None = None,
    ) -> None:
        PassAtKEvaluation.check_args(configs=configs, every_n_steps=every_n_steps, start_step=start_step,
                                     batch_size=batch_size, subset_mode=subset_mode)
        self.configs = list(configs) if configs is not None else paper_configs()
        self.every_n_steps = every_n_steps
        self.start_step = start_step
        self.eval_at_start = eval_at_start
        self.eval_at_end = eval_at_end
        self.subset_size = subset_size
        self.subset_mode = subset_mode
        self.subset_seed = subset_seed
        self.batch_size = batch_size
        self.max_prompt_len = max_prompt_len
        self.task = task
        self.select_metric = select_metric
        self.output_dir = output_dir
        self.num_logged_samples = num_logged_samples
        self.run_on_validate = run_on_validate
        if name is not None and not re.fullmatch(r"[\w.-]+", name):
            raise FieldError("name", f"must be letters, digits, '_', '.' or '-' (a file name part), got {name!r}")
        self.name = name
        # state (saved in checkpoints)
        self.table = ResultsTable()
        self.last_step = 0  # last step evaluated by the schedule (0: nothing yet)
        # last evaluation, for other callbacks and programmatic use
        self.last_metrics: dict[str, float] = {}
        self.last_eval_step: int | None = None
        self._examples: list[Example] | None = None
        self._stage_tables: dict[str, ResultsTable] = {}  # validate/test runs (not checkpointed)

    # -- checkpointed state -------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        # an unnamed one keeps the key older checkpoints hold; a named one (an eval overlay) gets its own
        extra = {"name": self.name} if self.name else {}
        return self._generate_state_key(configs=[c.name for c in self.configs], every_n_steps=self.every_n_steps,
                                        **extra)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.table.state(), "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.table = ResultsTable(state_dict.get("rows", []))
        self.last_step = int(state_dict.get("last_step", 0))

    # -- hooks --------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        per_batch = getattr(pl_module, "updates_per_batch", 1) or 1
        if self.every_n_steps % per_batch:
            rank_zero_warn(
                f"PassAtKEvaluation.every_n_steps ({self.every_n_steps}) is not a multiple of the module's "
                f"updates_per_batch ({per_batch}): evaluations run at the first rollout batch past each "
                "scheduled step, which a ModelCheckpoint(every_n_train_steps=...) will not hit."
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.eval_at_start and trainer.global_step == 0 and 0 not in self.table.steps:
            self.evaluate(trainer, pl_module, stage="fit", log_to_module=False)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if is_due(step, self.last_step, self.start_step, self.every_n_steps):
            self.evaluate(trainer, pl_module, stage="fit", log_to_module=True)
            self.last_step = step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if self.eval_at_end and step not in self.table.steps:
            self.evaluate(trainer, pl_module, stage="fit", log_to_module=False)
            self.last_step = max(self.last_step, step)
        if self.table.rows:
            self.write_report(trainer, final_step=step)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.run_on_validate and trainer.state.fn == "validate" and not trainer.sanity_checking:
            self.evaluate(trainer, pl_module, stage="validate", log_to_module=True)
            self.write_report(trainer, final_step=trainer.global_step, stage="validate")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.run_on_validate and trainer.state.fn == "test":
            self.evaluate(trainer, pl_module, stage="test", log_to_module=True)
            self.write_report(trainer, final_step=trainer.global_step, stage="test")

    # -- evaluation ---------------------------------------------------------------------------------
    def _task(self, trainer: L.Trainer) -> Task:
        task = self.task or getattr(trainer.datamodule, "task", None)
        if task is None:
            raise ValueError("PassAtKEvaluation: no task (set `task` or use a DataModule with a `task` attribute)")
        return task

    def eval_examples(self, trainer: L.Trainer) -> list[Example]:
        """The fixed evaluation prompts (the task's eval set or its subset)."""
        if self._examples is None:
            self._examples = select_subset(self._task(trainer).eval_examples(), self.subset_size, self.subset_mode,
                                           self.subset_seed)
            if not self._examples:
                raise ValueError("PassAtKEvaluation: the evaluation set is empty")
        return self._examples

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str = "fit",
                 log_to_module: bool = True) -> dict[str, float]:
        """Run every configuration on this rank's eval batches, sync, record, log and write the table."""
        task = self._task(trainer)
        policy = getattr(pl_module, "policy", pl_module)
        max_len = (self.max_prompt_len if self.max_prompt_len is not None
                   else getattr(trainer.datamodule, "max_prompt_len", None))
        batches = eval_batches(self.eval_examples(trainer), self.batch_size, trainer.global_rank, trainer.world_size)
        step = self._step(trainer, stage)
        prefix = "test" if stage == "test" else "val"
        device = next(iter(policy.parameters()), torch.empty(0)).device
        metrics: dict[str, float] = {}
        samples: list[dict[str, Any]] = []
        was_training = policy.training
        policy.eval()
        fork_devices = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=fork_devices), torch.no_grad():
                for cfg in self.configs:
                    result = run_config(policy, task, batches, cfg, max_len)
                    scorer = ConfigScorer(cfg).to(device)
                    scorer.update(result)
                    values = scorer.compute()  # synced over ranks
                    if stage == "fit":
                        self.table.add(step, cfg.name, values)
                    else:
                        self._stage_table(stage).add(step, cfg.name, values)
                    metrics.update({metric_key(prefix, task.name, cfg.name, m): v for m, v in values.items()})
                    for p in range(min(self.num_logged_samples, len(result.prompt_ids))):
                        for s, seed in enumerate(cfg.seeds):
                            samples.append({
                                "step": step, "config": cfg.name, "prompt_id": result.prompt_ids[p], "seed": seed,
                                "completion": result.texts[p][s], "correct": float(result.correct[p, s]),
                                "total": float(result.total[p]), "length": int(result.lengths[p, s]),
                            })
        finally:
            policy.train(was_training)
        self.last_metrics, self.last_eval_step = metrics, step
        if log_to_module:
            for k, v in metrics.items():
                # logger=False: the loggers get the values below at the right step (log_every_n_steps would
                # drop most of them); this puts them in callback_metrics for ModelCheckpoint and the CLI
                pl_module.log(k, v, logger=False, batch_size=1, on_step=stage == "fit", on_epoch=stage != "fit")
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, MLFlowLogger):
                    logger.log_metrics({mlflow_metric_name(k): v for k, v in metrics.items()}, step=step)
                else:
                    logger.log_metrics(metrics, step=step)
            self._write_table(trainer, stage, step, samples)
        return metrics

    def _step(self, trainer: L.Trainer, stage: str) -> int:
        """The checkpoint's step: ``global_step`` (in validate/test: read from ``ckpt_path`` if given)."""
        if stage != "fit" and trainer.ckpt_path:
            try:
                ckpt = torch.load(trainer.ckpt_path, map_location="cpu", weights_only=False, mmap=True)
                return int(ckpt.get("global_step", trainer.global_step))
            except Exception:  # noqa: BLE001 - the step is a label; never fail an evaluation over it
                return trainer.global_step
        return trainer.global_step

    def _stage_table(self, stage: str) -> ResultsTable:
        return self._stage_tables.setdefault(stage, ResultsTable())

    # -- files and artifacts ------------------------------------------------------------------------
    def _out_dir(self, trainer: L.Trainer) -> Path:
        base = self.output_dir or str(run_dir(trainer) / "eval")
        path = Path(base)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _stem(self, stage: str) -> str:
        base = "passk" if self.name is None else f"passk_{self.name}"
        return base if stage == "fit" else f"{base}_{stage}"

    def _log_artifacts(self, trainer: L.Trainer, paths: Sequence[Path], artifact_path: str = "eval") -> None:
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                for p in paths:
                    logger.experiment.log_artifact(logger.run_id, str(p), artifact_path=artifact_path)

    def _write_table(self, trainer: L.Trainer, stage: str, step: int, samples: list[dict[str, Any]]) -> None:
        table = self.table if stage == "fit" else self._stage_table(stage)
        out = self._out_dir(trainer)
        stem = self._stem(stage)
        csv_path, md_path = out / f"{stem}_table.csv", out / f"{stem}_table.md"
        atomic_write_text(csv_path, table.to_csv())
        atomic_write_text(md_path, table.to_markdown())
        paths = [csv_path, md_path]
        if samples:
            sample_path = out / "samples" / f"{stem}_step_{step:06d}.jsonl"
            sample_path.parent.mkdir(exist_ok=True)
            atomic_write_text(sample_path, "".join(json.dumps(s) + "\n" for s in samples))
            self._log_artifacts(trainer, [sample_path], "eval/samples")
        self._log_artifacts(trainer, paths)
        if stage != "fit":
            rank_zero_info(f"Pass@k evaluation ({stage}, step {step}):\n{table.to_markdown()}")

    def report(self, trainer: L.Trainer | None = None, final_step: int | None = None,
               stage: str = "fit") -> dict[str, Any]:
        """The App. D report (best per configuration by ``select_metric`` + final checkpoint) as a dict."""
        table = self.table if stage == "fit" else self._stage_table(stage)
        rep = table.report(self.select_metric, final_step)
        task = self._task(trainer) if trainer is not None else self.task
        rep["task"] = getattr(task, "name", None)
        rep["num_prompts"] = len(self._examples) if self._examples is not None else None
        rep["subset"] = {"size": self.subset_size, "mode": self.subset_mode, "seed": self.subset_seed}
        for cfg in self.configs:
            entry = rep["configs"].setdefault(cfg.name, {})
            entry["settings"] = settings_summary(cfg.generation)
            entry["num_samples"], entry["seeds"], entry["parser"] = cfg.num_samples, list(cfg.seeds), cfg.parser
            if trainer is not None and "best" in entry and rep["task"]:
                key = metric_key("val", rep["task"], cfg.name, self.select_metric)
                for cb in trainer.checkpoint_callbacks:
                    if isinstance(cb, ModelCheckpoint) and cb.monitor == key and cb.best_model_path:
                        entry["best"]["checkpoint"] = cb.best_model_path
        return rep

    def write_report(self, trainer: L.Trainer, final_step: int | None = None, stage: str = "fit") -> dict[str, Any]:
        rep = self.report(trainer, final_step, stage)
        if trainer.is_global_zero:
            out = self._out_dir(trainer)
            stem = self._stem(stage)
            notes = [
                f"task `{rep['task']}`, {rep['num_prompts']} eval prompts"
                + (f" (fixed subset: {self.subset_mode} {self.subset_size})" if self.subset_size else ""),
                *(
                    f"`{c.name}`: {c.num_samples} sample(s), seeds {list(c.seeds)}, parser `{c.parser}`, "
                    f"{', '.join(f'{k}={v}' for k, v in settings_summary(c.generation).items())}"
                    for c in self.configs
                ),
            ]
            md = ResultsTable.report_markdown(rep, title=f"Pass@k checkpoint report ({stage})", notes=notes)
            md += ("\n## All checkpoints\n\n"
                   + (self.table if stage == "fit" else self._stage_table(stage)).to_markdown())
            md_path, json_path = out / f"{stem}_report.md", out / f"{stem}_report.json"
            atomic_write_text(md_path, md)
            atomic_write_text(json_path, dumps_json(rep))
            self._log_artifacts(trainer, [md_path, json_path])
        return rep
