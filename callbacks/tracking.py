"""Completion-length and per-source reward/advantage tracking (ERILS App. F, Fig. 12; docs/tasks.md).

Every ``every_n_batches`` rollout batches (the paper's Fig. 12 samples every 12 optimizer steps = every
rollout batch at μ = 12) this callback logs, per source (``on_policy``, ``external``, ``continuation``):

* ``rollouts/<source>/count`` and ``kept`` (rows the advantage processor keeps);
* ``length_mean`` / ``length_min`` / ``length_max`` (completion tokens up to and including the first EOS);
* ``hit_limit_frac``: share of completions that filled L_gen without an EOS;
* ``reward_mean`` / ``reward_std`` and ``advantage_mean`` / ``advantage_std`` (population std, over the
  kept rows).

Advantages and ``keep`` are the rows' own (``batch.rollouts.advantages``, set by the module's processors
in its training step: the callback sees the rows that were trained on).
The values go straight to every logger at ``step = global_step`` (so ``log_every_n_steps`` does not
thin them out).

A sample table of prompt / completion / reward per source (``samples_per_source`` rows each) is written
at each Pass@k evaluation (when a :class:`callbacks.passk.PassAtKEvaluation` is present) and/or every
``samples_every_n_batches`` batches: appended to ``<run dir>/rollout_samples.jsonl`` and logged to MLflow
with ``log_table`` (``rollout_samples.json``, one table across training with a ``step`` column).

DDP: statistics and samples are those of rank 0's rollouts (each rank holds its own prompts); they are
not gathered across ranks.
"""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger

from lit_rl.errors import FieldError
from lit_rl.evaluation import is_due
from lit_rl.batch import RolloutBatch, Source
from lit_rl.runs import run_dir

__all__ = ["RolloutTracker", "rollout_source_stats", "rollout_samples"]


def rollout_source_stats(
    rollouts: RolloutBatch, advantages: torch.Tensor | None = None, keep: torch.Tensor | None = None
) -> dict[str, dict[str, float]]:
    """Per-source statistics of one rollout batch: ``{source label: {stat: value}}``.

    Shapes: ``advantages``, ``keep`` ``(N,)`` aligned with ``rollouts`` (``keep`` defaults to all).
    Sources without rows are absent. Advantage statistics use the kept rows only.
    """
    out: dict[str, dict[str, float]] = {}
    keep = torch.ones_like(rollouts.rewards, dtype=torch.bool) if keep is None else keep.bool()
    for src in Source:
        sel = rollouts.source == int(src)  # (N,)
        if not bool(sel.any()):
            continue
        lengths = rollouts.lengths[sel].float()
        rewards = rollouts.rewards[sel].float()
        stats = {
            "count": float(sel.sum()),
            "kept": float((sel & keep).sum()),
            "length_mean": float(lengths.mean()),
            "length_min": float(lengths.min()),
            "length_max": float(lengths.max()),
            "hit_limit_frac": float(rollouts.hit_limit[sel].float().mean()),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
        }
        if advantages is not None and bool((sel & keep).any()):
            a = advantages[sel & keep].float()
            stats["advantage_mean"] = float(a.mean())
            stats["advantage_std"] = float(a.std(unbiased=False))
        out[src.label] = stats
    return out


def rollout_samples(
    rollouts: RolloutBatch,
    questions: list[str] | None = None,
    advantages: torch.Tensor | None = None,
    per_source: int = 4,
    max_chars: int = 2000,
    step: int = 0,
) -> list[dict[str, Any]]:
    """The first ``per_source`` rows of each source as table rows (prompt, completion, reward, ...).

    ``questions[g]`` is the prompt text of group ``g`` (``PromptBatch.examples[g].question``).
    """
    rows: list[dict[str, Any]] = []
    for src in Source:
        idx = (rollouts.source == int(src)).nonzero(as_tuple=True)[0].tolist()[:per_source]
        for i in idx:
            g = int(rollouts.group[i])
            rows.append({
                "step": step,
                "source": src.label,
                "prompt_id": rollouts.prompt_ids[i],
                "prompt": (questions[g] if questions is not None and g < len(questions) else "")[:max_chars],
                "completion": rollouts.texts[i][:max_chars],
                "reward": float(rollouts.rewards[i]),
                "advantage": float(advantages[i]) if advantages is not None else None,
                "length": int(rollouts.lengths[i]),
                "hit_limit": bool(rollouts.hit_limit[i]),
            })
    return rows


class RolloutTracker(Callback):
    """Per-source completion length, EOS-less share, reward and advantage statistics of rollout batches.

    Args:
        every_n_batches: log statistics every this many rollout batches (1 = every batch).
        samples_at_eval: write a sample table on the batches where a ``PassAtKEvaluation`` evaluates.
        samples_every_n_batches: also write one every this many rollout batches (``None``: only at evals).
        samples_per_source: rows per source in each sample table.
        max_chars: prompts and completions are cut to this many characters in the table.
        prefix: metric prefix (``rollouts/<source>/<stat>``).
        output_dir: where ``rollout_samples.jsonl`` goes (default: log dir or ``default_root_dir``).
    """

    @staticmethod
    def check_args(every_n_batches: int = 1, samples_every_n_batches: int | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if every_n_batches < 1:
            raise FieldError("every_n_batches", f"must be >= 1, got {every_n_batches}")
        if samples_every_n_batches is not None and samples_every_n_batches < 1:
            raise FieldError("samples_every_n_batches", f"must be >= 1 or null, got {samples_every_n_batches}")

    def __init__(
        self,
        every_n_batches: int = 1,
        samples_at_eval: bool = True,
        samples_every_n_batches: int | None = None,
        samples_per_source: int = 4,
        max_chars: int = 2000,
        prefix: str = "rollouts",
        output_dir: str | None = None,
    ) -> None:
        RolloutTracker.check_args(every_n_batches=every_n_batches, samples_every_n_batches=samples_every_n_batches)
        self.every_n_batches = every_n_batches
        self.samples_at_eval = samples_at_eval
        self.samples_every_n_batches = samples_every_n_batches
        self.samples_per_source = samples_per_source
        self.max_chars = max_chars
        self.prefix = prefix
        self.output_dir = output_dir
        self.batches_seen = 0  # rollout batches seen (checkpointed)
        self.last_stats: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"batches_seen": self.batches_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches_seen = int(state_dict.get("batches_seen", 0))

    # -- advantages ---------------------------------------------------------------------------------
    @staticmethod
    def advantages_of(ro: RolloutBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(advantages (N,), keep (N,))`` the module's processors set on the batch's rows (``(None,
        None)`` when it has none, e.g. SFT)."""
        if ro.advantages is None:
            return None, None
        return ro.advantages.detach(), ro.keep

    # -- hooks --------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        ro = getattr(batch, "rollouts", None)
        if not isinstance(ro, RolloutBatch):
            return
        self.batches_seen += 1
        want_stats = self.batches_seen % self.every_n_batches == 0
        want_samples = self._samples_due(trainer)
        if not (want_stats or want_samples):
            return
        adv, keep = self.advantages_of(ro)
        step = trainer.global_step
        if want_stats:
            stats = rollout_source_stats(ro, adv, keep)
            flat = {f"{self.prefix}/{src}/{k}": v for src, d in stats.items() for k, v in d.items()}
            self.last_stats = flat
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics(flat, step=step)
        if want_samples and trainer.is_global_zero:
            examples = getattr(batch, "examples", None) or []
            rows = rollout_samples(ro, [e.question for e in examples], adv, self.samples_per_source, self.max_chars,
                                   step)
            self._write_samples(trainer, rows)

    def _samples_due(self, trainer: L.Trainer) -> bool:
        if self.samples_every_n_batches and self.batches_seen % self.samples_every_n_batches == 0:
            return True
        if not self.samples_at_eval:
            return False
        step = trainer.global_step
        for cb in trainer.callbacks:
            # PassAtKEvaluation: it evaluated at this step, or will in this same hook (callback order)
            if hasattr(cb, "every_n_steps") and hasattr(cb, "last_eval_step") and hasattr(cb, "start_step"):
                if cb.last_eval_step == step or is_due(step, cb.last_step, cb.start_step, cb.every_n_steps):
                    return True
        return False

    def _write_samples(self, trainer: L.Trainer, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        base = run_dir(trainer, self.output_dir)
        base.mkdir(parents=True, exist_ok=True)
        path = base / "rollout_samples.jsonl"
        with path.open("a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                columns = {k: [r[k] for r in rows] for k in rows[0]}
                try:
                    logger.experiment.log_table(logger.run_id, data=columns, artifact_file="rollout_samples.json")
                except Exception:  # noqa: BLE001 - older MLflow or no pandas: plain artifact instead
                    logger.experiment.log_artifact(logger.run_id, str(path))
