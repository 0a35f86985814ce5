"""What a loss is given and what it returns: typed arguments, never the module (torchtune's recipe/loss split).

A loss is three calls, all driven by :class:`~lit_rl.algorithms.rl_module.RLModule`, which owns
micro-batching, ``manual_backward`` and logging once for every loss::

    prepared = loss.prepare(rollouts, ctx)            # once per rollout batch, no gradients
    for each of the batch's μ updates (ctx.update = 0..μ-1, ctx.step = that update's global_step):
        for sl in ctx.slices(len(prepared.rows)):     # the module's one micro_batch_size
            loss_mb, stats = loss.micro_batch_loss(prepared, sl, ctx)   # weighted by its share of the batch
            module.manual_backward(loss_mb)
        stats |= loss.finish_update(prepared, ctx)    # statistics of the whole update (e.g. entropy)

``prepared.metrics`` is a mailbox: whatever the loss puts there (full metric names) the module logs after
``prepare`` and after every update, then empties it. ``stats`` are logged under ``loss.stats_prefix`` when
the update is finite (the module's NaN guard).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.batch import RolloutBatch

__all__ = ["Loss", "LossContext", "Prepared", "kept_rows", "mask_seeds"]


def mask_seeds(seed: int, rank: int, step: int, rows: RolloutBatch) -> list[int]:
    """One mask seed per row: ``seed_for(seed, MASKS, rank, step, row)``, ``step`` = the optimizer update, so a
    row's masks depend on neither its batch-mates nor the micro-batch split."""
    return [rng.seed_for(seed, rng.Stream.MASKS, rank=rank, step=step, row=r) for r in rows.row.tolist()]


@dataclass(frozen=True)
class LossContext:
    """Everything a loss may use besides its rows (the module builds one per call).

    Attributes:
        policy: the policy being trained.
        device: where the loss's accumulators live.
        step: the optimizer update this call belongs to (``global_step``; in ``prepare``: the batch's first).
        update: its index among the batch's ``updates_per_batch`` updates (``prepare``: 0).
        updates_per_batch: μ.
        micro_batch_size: rows per forward (``None``: all); also bounds ``prepare``'s no-grad passes.
        seed: the module's seed (mask draws).
        rank: the data-parallel rank (mask draws).
        reference: a context manager yielding the KL reference policy (``None``: the loss asked for none).
    """

    policy: torch.nn.Module
    device: torch.device
    step: int = 0
    update: int = 0
    updates_per_batch: int = 1
    micro_batch_size: int | None = None
    seed: int = 0
    rank: int = 0
    reference: Callable[[], ContextManager[torch.nn.Module]] | None = None

    def mask_seeds(self, rows: RolloutBatch, step: int | None = None) -> list[int]:
        """:func:`mask_seeds` at ``step`` (default: this call's update)."""
        return mask_seeds(self.seed, self.rank, self.step if step is None else step, rows)

    def slices(self, n: int) -> list[slice]:
        """The micro-batches of ``n`` rows: consecutive chunks of ``micro_batch_size`` (all when ``None``)."""
        size = self.micro_batch_size or max(n, 1)
        return [slice(s, s + size) for s in range(0, n, size)]

    def reference_policy(self) -> ContextManager[torch.nn.Module]:
        if self.reference is None:
            raise RuntimeError("this loss asked for no KL reference (reference_mode None)")
        return self.reference() if callable(self.reference) else contextlib.nullcontext(self.reference)


@dataclass
class Prepared:
    """What a loss fixes once per rollout batch. ``rows``: the ``B'`` rows it trains on (the module splits
    them into micro-batches); ``metrics``: the mailbox of full-named metrics (module docstring)."""

    rows: RolloutBatch
    metrics: dict[str, Any] = field(default_factory=dict)


class Loss:
    """Base of the losses (module docstring). ``stats_prefix``: where the per-update statistics are logged;
    ``reference_mode``: the KL reference the loss needs (``None``: none; ``"auto"`` | ``"adapter"`` |
    ``"copy"``, kept by the module: :meth:`~lit_rl.algorithms.rl_module.RLModule.reference_policy`)."""

    stats_prefix = "train/loss"
    reference_mode: str | None = None

    def bind(self, policy: torch.nn.Module) -> None:
        """Called once by the module with its policy (e.g. the mask token id)."""

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> Prepared:
        raise NotImplementedError

    def micro_batch_loss(self, prepared: Any, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of rows ``sl`` of ``prepared.rows``, weighted by their share of the batch so that the
        micro-batch losses add up to the whole batch's (and so do their gradients), and detached stats."""
        raise NotImplementedError

    def finish_update(self, prepared: Any, ctx: LossContext) -> dict[str, Tensor]:
        """Statistics of the whole update, after its micro-batches (merged into the last one's)."""
        return {}


def kept_rows(rollouts: RolloutBatch) -> RolloutBatch:
    """The rows the processors keep (all when they set no ``keep``)."""
    if rollouts.advantages is None:
        raise ValueError("the rollouts have no advantages: the module's processors must set them")
    return rollouts if rollouts.keep is None else rollouts.select(rollouts.keep)
