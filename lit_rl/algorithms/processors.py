"""Processors: the middle stage of the pipeline, rollouts in, rollouts with advantages out.

A processor turns the rows' rewards into ``advantages`` (and ``keep``: the rows the loss trains on) and
may replace rows; a module runs its chain in order (``model.init_args.processors`` in YAML), each one
seeing the previous one's output::

    rollouts = run_processors(self.processors, rollouts, batch)

* ERILS's advantage processors (:mod:`lit_rl.algorithms.advantages`): ``SourceSpecific`` (Eq. 9),
  ``Joint`` (Eq. 11), ``OnPolicyOnly`` (SPG), ``ExternalOnly``;
* :class:`GroupBaseline`: GRPO / RLOO / Dr. GRPO / NeMo-RL group-relative advantages over every row;
* :class:`~lit_rl.algorithms.double_rollout.DoubleRolloutEstimate`: double rollout's reward estimation
  (revised rewards from the continuations its stage sampled, one-sided replacement, length terms) and the GRPO
  advantages of the revised rewards.

A processor is a pure function of the rollouts and their :class:`~lit_rl.batch.PromptBatch` (the task's
threshold, the step and rank for seeds, what a dependent rollout stage produced: ``batch.continuations``); it
generates nothing. A processor whose input needs rows generated from the batch's rows declares that
:attr:`Processor.stage`, which the DataModule runs after the first stage. It reports anything beyond advantages
in ``batch.diagnostics``; the module gives it its policy once (:meth:`bind`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_rl.core.advantages import STD_OF, group_centered
from lit_rl.errors import FieldError
from lit_rl.batch import PromptBatch, RolloutBatch

__all__ = ["GroupBaseline", "Processor", "run_processors"]


class Processor:
    """Base of the processors (module docstring)."""

    stage: Any = None
    """A :class:`~lit_rl.algorithms.dr_stage.RolloutStage` the processor's input needs (new rows or samples
    generated from the batch's rows, e.g. double rollout's continuations): the DataModule runs it after the first
    stage, so the processor itself stays a pure function of the batch. ``None``: none."""

    fsdp2_unsupported: str | None = None
    """Why the processor cannot run under FSDP2 sharding (``None``: it can); the module refuses the strategy
    with this reason in ``configure_model``."""

    def bind(self, policy: torch.nn.Module) -> None:
        """Called once by the module with its policy (tokenizer, EOS id, decoding)."""

    def process(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        raise NotImplementedError


def run_processors(processors: Sequence[Processor], rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
    """The chain in order; a non-empty chain must leave advantages on the rows (an empty one: a loss that
    needs none, e.g. SFT)."""
    for p in processors:
        rollouts = p.process(rollouts, batch)
    if processors and rollouts.advantages is None:
        raise ValueError(f"processors {[type(p).__name__ for p in processors]} set no advantages")
    return rollouts


class GroupBaseline(Processor):
    """Group-relative advantages over every row of each prompt group (:func:`lit_rl.core.advantages.group_centered`):
    GRPO (``scale_std``), RLOO (``leave_one_out``), Dr. GRPO (neither), NeMo-RL's GRPO (``scale_std``,
    ``leave_one_out`` and ``std_of="baseline"``). Keeps every row.

    Args:
        scale_std: divide by a std of the group's rewards (``std_of``).
        leave_one_out: the mean of the group's other rewards as the baseline.
        eps: added to the std before dividing.
        std_of: ``"group"`` (the group's sample std + ``eps``, every row) or ``"baseline"`` (NeMo-RL: the
            sample std of the rewards the row's baseline averages; rows where it is 0 are not divided).
    """

    def __init__(self, scale_std: bool = False, leave_one_out: bool = False, eps: float = 1e-4,
                 std_of: str = "group") -> None:
        if std_of not in STD_OF:
            raise FieldError("std_of", f"must be one of {STD_OF}, got {std_of!r}")
        self.scale_std, self.leave_one_out, self.eps, self.std_of = scale_std, leave_one_out, eps, std_of

    def __call__(self, rewards: torch.Tensor, group: torch.Tensor, bonus: torch.Tensor | None = None) -> torch.Tensor:
        """``(B,)`` advantages of ``rewards (B,)`` within ``group (B,)``; ``bonus (B,)`` is added after the
        baseline is taken (:func:`~lit_rl.core.advantages.group_centered`)."""
        return group_centered(rewards, group, scale_std=self.scale_std, leave_one_out=self.leave_one_out,
                              eps=self.eps, std_of=self.std_of, bonus=bonus)

    def process(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        return rollouts.with_advantages(self(rollouts.rewards.float(), rollouts.group))

    def __repr__(self) -> str:
        std_of = "" if self.std_of == "group" else f", std_of={self.std_of!r}"
        return f"GroupBaseline(scale_std={self.scale_std}, leave_one_out={self.leave_one_out}, eps={self.eps}{std_of})"
