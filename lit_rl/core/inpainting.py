"""IGPO's treatment of inpainted hint positions in the loss: pure tensor math.

IGPO (Zhao et al., "Inpainting-Guided Policy Optimization for Diffusion Large Language Models", arXiv:2509.10396)
decodes some rows with chunks of a reference trace held fixed (the *hints*) and trains on them with d1's clipped
per-token objective. Hint tokens were not sampled by the policy, so IGPO keeps only the highest-entropy share of
them in the loss (its *entropy filter*): per row, among the hint positions that the loss scores, the top
``max(1, floor(keep_ratio · n))`` by the policy's token entropy stay; the other hint positions leave the loss mask
(no policy-gradient or KL term, and they do not count in the token mean's denominator). Positions outside the
hints, and rows without hints, are unchanged.

As in the reference code (``facebookresearch/igpo``, ``trainer_igpo.py``), the entropy is π_old's on the same noisy
input as the update's loss (the update's mask draw), and the filter runs per update; ``keep_ratio`` 0.2
(``entropy_clipping_ratio_inpaint``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["keep_high_entropy_hints"]


def keep_high_entropy_hints(loss_mask: Tensor, hint: Tensor, entropy: Tensor, keep_ratio: float) -> Tensor:
    """The loss mask with each row's hint positions cut to its ``max(1, floor(keep_ratio · n))`` highest-entropy
    ones, ``n`` the row's scored hint positions (``loss_mask & hint``); ties go to the earlier position.

    Shapes: ``loss_mask (B, L)`` bool, ``hint (B, L)`` bool, ``entropy (B, L)`` float -> ``(B, L)`` bool.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    loss_mask, hint = loss_mask.bool(), hint.bool()
    cand = loss_mask & hint  # (B, L) scored hint positions
    n = cand.sum(-1)  # (B,)
    k = torch.where(n > 0, (n.double() * keep_ratio).floor().long().clamp(min=1), 0)  # (B,)
    L = loss_mask.shape[-1]
    # rank the candidates by entropy, highest first; a stable sort keeps the earlier position first on ties
    score = torch.where(cand, entropy.float(), float("-inf"))  # (B, L)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # (B, L)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(L, device=order.device).expand_as(order))  # (B, L) each position's rank
    keep = cand & (rank < k[:, None])  # (B, L)
    return loss_mask & (~hint | keep)
