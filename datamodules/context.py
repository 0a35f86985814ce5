"""What the rollout side hands its parts: typed and frozen, so a source or stage never reaches back into the
DataModule or the trainer.

* :class:`SourceSetup`: once, before the first batch, what a source may filter the prompts by (the task, the
  stream's prompts so far, the prompt and generation widths); a source returns the prompts it keeps.
* :class:`RolloutContext`: per training batch, what a source needs to make its rows: the policy, the run's
  :class:`~lit_rl.generation.engine.Engine` (synced to the policy's current weights), the task, the batch's
  step, rank and generation seed, and the batch's encoded prompts.

The DataModule builds both (:mod:`datamodules.stream`); the LightningModule hands it the policy, its dependent
stages and its weight version once, at setup (:meth:`datamodules.stream.PromptStreamDataModule.connect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lit_rl.tasks.base import Example, Task

__all__ = ["RolloutContext", "SourceSetup"]


@dataclass(frozen=True)
class SourceSetup:
    """A source's view of the prompt set at setup.

    Attributes:
        task: the run's task.
        examples: the stream's training prompts so far (after the earlier sources' filters).
        max_prompt_len: prompts are cut to their last ``max_prompt_len`` tokens (``None``: no cut).
        gen_width: the run's generation length (dLLM ``gen_length``, AR ``max_new_tokens``; 0 if unknown).
    """

    task: Task
    examples: list[Example]
    max_prompt_len: int | None
    gen_width: int = 0


@dataclass(frozen=True)
class RolloutContext:
    """One training batch's rollout context.

    Attributes:
        policy: the policy (its tokenizer, EOS id, encoders; the engine samples from its weights).
        engine: the run's engine, synced to the policy's current weights.
        task: the run's task.
        step: the prompt stream's batch index.
        rank: this process's rank.
        seed: the batch's generation seed on this rank (``(seed, step, rank)``: a resumed run redraws the same).
        prompt_ids, prompt_mask: ``(B_p, P)`` the batch's left-padded prompts on the policy's device.
    """

    policy: Any
    engine: Any
    task: Task
    step: int
    rank: int
    seed: int
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
