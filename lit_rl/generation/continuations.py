"""Double-rollout continuations for a masked diffusion LM (double rollout for the dLLM).

The second stage of double rollout (Qian et al. 2026, §2) samples ``N`` continuations of each rollout from
its thinking trace cut at ρ. A causal LM continues a prefix token by token
(:meth:`lit_rl.generation.ar.ARBackend.continue_from`); a dLLM has a fixed canvas instead, so here a
continuation is the first stage's decode **resumed from the cut**::

    canvas = [prompt | t[:cut] | MASK * (L_gen - cut)]
    decode with the first stage's block schedule (L_gen, block, steps, temperature):
        blocks before the cut's block are complete (no forward pass),
        the cut's block reveals its remaining masks over all its steps_per_block steps,
        later blocks decode as in the first stage

(:func:`lit_rl.generation.diffusion.diffusion_generate` with ``init``). A cut inside a block spreads that
block's remaining masks over the block's full step count, so they are revealed fewer per step (more finely)
than the first stage revealed them; from a block boundary the schedule is the first stage's exactly. The
continuation is the canvas after the cut, ``L_gen - cut`` tokens, EOS-filled after its first EOS, so its
budget is the rest of the canvas: with ``cap_to_generation_limit`` (the default) and a buffer of at least
``L_gen`` (the default 1024), the double-rollout budget ``min(|T| − cut + buffer, L_gen − cut)`` is exactly
that. A smaller budget only truncates what the estimate reads (a dLLM cannot decode fewer positions than its
canvas).

The exact decoder is used (no KV cache, no threshold reveal): continuations are scored against the
policy's own block schedule. ``top_p`` does not exist for the dLLM sampler and must be 1.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_rl.generation.diffusion import diffusion_generate
from lit_rl.rng import device_generator

__all__ = ["DiffusionContinuations"]


class DiffusionContinuations:
    """``continue_from`` for a dLLM policy (module docstring), the interface
    :func:`lit_rl.algorithms.dr_stage.sample_continuations` calls; ``needs_prompt_lens``: the stage passes
    where each prefix's prompt ends (the canvas starts there).

    Args:
        policy: the :class:`~lit_rl.models.policy.DiffusionPolicy` (its current weights).
        settings: the first stage's decoding settings (``gen_length``, ``block_length``, ``steps``).
    """

    needs_prompt_lens = True

    def __init__(self, policy: Any, settings: Any) -> None:
        self.policy, self.settings = policy, settings

    @torch.no_grad()
    def decode_canvases(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, canvas: torch.Tensor, *,
                        temperature: float, seed: int) -> torch.Tensor:
        """Decode the [MASK] positions of each canvas after its left-padded prompt on the first stage's block
        schedule, keeping every other canvas token (:func:`~lit_rl.generation.diffusion.diffusion_generate` with
        ``init``), in eval mode: double rollout's continuations and IGPO's inpainted rows.

        Shapes: ``prompt_ids (R, P)``, ``prompt_mask (R, P)``, ``canvas (R, L_gen)`` -> completions ``(R, L_gen)``
        on the policy's device.
        """
        pol, s = self.policy, self.settings
        device = next(pol.parameters()).device
        P = prompt_ids.shape[1]
        was_training = pol.training
        pol.eval()
        try:
            return diffusion_generate(
                lambda ids, mask: pol(ids, mask), prompt_ids.to(device), prompt_mask.to(device),
                gen_length=int(s.gen_length), block_length=s.block_length, steps=s.steps, temperature=temperature,
                mask_id=pol.mask_id, generator=device_generator(seed, device), init=canvas.to(device),
            )[:, P:]
        finally:
            pol.train(was_training)

    @torch.no_grad()
    def continue_from(
        self,
        prefix_ids: Sequence[Sequence[int]],
        n: int,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        prompt_lens: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """``n`` continuations of each prefix (prompt ⊕ cut trace): ids ``(R*n, max budget)``, prefix-major,
        EOS-filled after the first EOS and after the budget."""
        if prompt_lens is None or len(prompt_lens) != len(prefix_ids):
            raise ValueError("DiffusionContinuations.continue_from needs prompt_lens, one per prefix")
        if top_p != 1.0:
            raise ValueError(f"a dLLM continuation has no nucleus sampling: top_p must be 1, got {top_p}")
        pol, s = self.policy, self.settings
        L, R = int(s.gen_length), len(prefix_ids)
        budgets = [int(max_new_tokens)] * R if isinstance(max_new_tokens, int) else [int(b) for b in max_new_tokens]
        prompts = [list(p[:k]) for p, k in zip(prefix_ids, prompt_lens)]
        kept = [list(p[k:]) for p, k in zip(prefix_ids, prompt_lens)]
        if any(len(t) >= L for t in kept):
            raise ValueError(f"a cut trace fills the whole canvas (gen_length {L}): nothing to continue")
        P = max(len(p) for p in prompts)
        prompt_ids = torch.full((R, P), pol.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros(R, P, dtype=torch.long)
        canvas = torch.full((R, L), pol.mask_id, dtype=torch.long)
        for r, (p, t) in enumerate(zip(prompts, kept)):
            prompt_ids[r, P - len(p):], prompt_mask[r, P - len(p):] = torch.tensor(p), 1
            canvas[r, : len(t)] = torch.tensor(t, dtype=torch.long)
        rep = lambda x: x.repeat_interleave(n, 0)  # noqa: E731  (R*n, ·) prefix-major
        out = self.decode_canvases(rep(prompt_ids), rep(prompt_mask), rep(canvas), temperature=temperature,
                                   seed=seed).cpu()  # (R*n, L)
        width = max(budgets)
        res = torch.full((R * n, width), pol.eos_id, dtype=torch.long)
        for r in range(R):
            cut, b = len(kept[r]), budgets[r]
            tail = out[r * n : (r + 1) * n, cut : cut + b]  # (n, ≤ b)
            res[r * n : (r + 1) * n, : tail.shape[1]] = tail
        for row in res:  # EOS-filled after the first EOS
            hit = (row == pol.eos_id).nonzero()
            if len(hit):
                row[int(hit[0]):] = pol.eos_id
        return res
