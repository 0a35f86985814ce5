"""Token entropy of the policy, the diagnostic TRL and verl log as ``entropy``: pure tensor math.

``H = logsumexp(z) - Σ_v softmax(z)_v z_v`` per position (nats), from logits ``z``, in float32 and in row
chunks so a 126k vocabulary never needs a second full ``(N, L, V)`` float32 buffer. Never differentiated:
callers pass detached logits (it is a diagnostic, not a loss term).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_entropy_mean", "token_entropy"]


@torch.no_grad()
def token_entropy(logits: Tensor, chunk: int = 512) -> Tensor:
    """Entropy of ``softmax(logits)`` at every position, ``chunk`` positions at a time.

    Shapes: ``logits (..., V)`` -> ``(...)`` float32. A uniform distribution over ``V`` gives ``log V``; a
    one-hot one gives 0.
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (M, V)
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    step = max(1, chunk)  # positions per pass: 512 x a 126k vocabulary is ~260 MB of float32
    for s in range(0, flat.shape[0], step):
        z = flat[s : s + step].float()  # (m, V)
        lse = torch.logsumexp(z, dim=-1)  # (m,)
        out[s : s + step] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return out.reshape(logits.shape[:-1])


def masked_entropy_mean(entropy: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``entropy`` over the True positions of ``mask`` (same shape); 0 when none are."""
    m = mask.to(entropy.dtype)
    return (entropy * m).sum() / m.sum().clamp(min=1)
