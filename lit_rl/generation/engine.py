"""The one interface for everything that samples: :class:`Engine`.

A rollout source or stage receives an engine in its :class:`~datamodules.context.RolloutContext` and calls

* ``sample(prompt_ids (B, P), prompt_mask (B, P), settings, n=, seed=, stats=)`` -> ``(B*n, L)`` completion ids,
  prompt-major, EOS-filled after each row's end (first-stage rollouts and evaluation);
* ``continue_from(prefixes, n, max_new_tokens, ...)`` -> continuations of cut prefixes (double rollout);
* ``sync(policy)``: sample from the policy's current weights from now on (a no-op where the engine runs the
  policy's own modules).

Three engines implement it: :class:`~lit_rl.generation.ar.HFBackend` and
:class:`~lit_rl.generation.ar.VLLMBackend` for causal LMs (``settings``:
:class:`~lit_rl.models.ar.SamplingSettings`, through :meth:`ARBackend.sample`), and :class:`DiffusionEngine` for a
masked diffusion LM (``settings``: :class:`~lit_rl.generation.settings.DecodeSettings`), which decodes with the
policy's own ``generate`` and continues a cut canvas with
:class:`~lit_rl.generation.continuations.DiffusionContinuations`. Who builds the engine is the DataModule, once per
run (:meth:`datamodules.stream.PromptStreamDataModule.engine`); nothing that samples reads the DataModule or the
trainer.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch

from lit_rl.generation.continuations import DiffusionContinuations

__all__ = ["DiffusionEngine", "Engine"]


@runtime_checkable
class Engine(Protocol):
    """What samples rollouts (module docstring)."""

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: Any, *, n: int = 1,
               seed: int, stats: Any = None) -> torch.Tensor:
        """``n`` completions of each left-padded prompt: ``(B*n, L)`` ids, prompt-major."""
        ...

    def continue_from(self, prefix_ids: Sequence[Sequence[int]], n: int, max_new_tokens: int | Sequence[int],
                      **kwargs: Any) -> torch.Tensor:
        """``n`` continuations of each prefix (prompt ⊕ cut trace), prefix-major."""
        ...

    def sync(self, policy: Any) -> None:
        """Sample from ``policy``'s current weights from now on."""
        ...


class DiffusionEngine(DiffusionContinuations):
    """The dLLM's engine: ``sample`` is the policy's own block decoding (``policy.generate``, seeded), ``continue_from``
    and ``decode_canvases`` resume a canvas on ``settings``' block schedule (:class:`DiffusionContinuations`). It
    runs the policy's modules, so ``sync`` has nothing to do.

    Args:
        policy: the :class:`~lit_rl.models.policy.DiffusionPolicy`.
        settings: the run's training decoding (the continuations' block schedule).
    """

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: Any, *, n: int = 1,
               seed: int, stats: Any = None) -> torch.Tensor:
        if n > 1:
            prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        kwargs = {"stats": stats} if stats is not None else {}
        return self.policy.generate(prompt_ids, prompt_mask, settings, seed, **kwargs)  # (B*n, L_gen)

    def sync(self, policy: Any) -> None:
        self.policy = policy
