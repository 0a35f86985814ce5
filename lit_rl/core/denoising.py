"""Masked-denoising SFT for dLLMs (LLaDA's SFT objective), used by the format warm-up and the SFT baseline.

For each completion ``t ~ U(eps, 1]``; every completion token is masked with probability ``t``; the loss is
the cross-entropy on masked tokens weighted by ``1/t`` and normalised by the completion length (LLaDA
App. B, Eq. 5): ``loss = mean_b [ Σ_{i masked} −log p(x_i | x_t) / (t_b · L_b) ]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_rl import rng


def denoising_masks(completion_mask: torch.Tensor, generator: torch.Generator | None = None,
                    eps: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``t (B,)`` and the masked positions ``(B, L)`` among valid completion tokens."""
    B, L = completion_mask.shape
    t = eps + (1 - eps) * rng.uniform((B,), generator=generator, device=completion_mask.device)  # (B,)
    u = rng.uniform((B, L), generator=generator, device=completion_mask.device)  # (B, L)
    return t, (u < t[:, None]) & completion_mask.bool()


def masked_denoising_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                          lengths: torch.Tensor) -> torch.Tensor:
    """LLaDA SFT loss.

    Shapes: ``logits (B, L, V)`` at completion positions, ``targets (B, L)``, ``masked (B, L)`` bool,
    ``t (B,)``, ``lengths (B,)`` -> scalar.
    """
    ce = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # (B, L)
    per_seq = (ce * masked).sum(-1) / (t * lengths.clamp(min=1))  # (B,)
    return per_seq.mean()
