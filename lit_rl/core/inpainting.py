"""IGPO's inpainting hints as pure functions: which groups fire, where the hints go, and their treatment in the loss.

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

The rollout side (:mod:`lit_rl.algorithms.inpaint` runs it): a group fires when none of its on-policy rows is
correct by binary correctness (:func:`triggered_groups`); each new row's canvas holds a random share of a
reference trace's chunks at their own positions, the rest masked (:func:`hint_chunks`, :func:`hint_canvas`).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from torch import Tensor

__all__ = ["Draws", "hint_canvas", "hint_chunks", "keep_high_entropy_hints", "triggered_groups"]


class Draws(Protocol):
    """The draws the hint placement makes (``random.Random``: seeded per group by the stage)."""

    def randint(self, a: int, b: int) -> int: ...

    def sample(self, population: Sequence[int], k: int) -> list[int]: ...


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


def triggered_groups(rewards: Tensor, group: Tensor, on_policy: Tensor, threshold: float, num_groups: int) -> Tensor:
    """Groups whose on-policy rows are all wrong: at least one on-policy row and none with ``reward >= threshold``
    (binary correctness: a partial-credit reward below the threshold counts as wrong, as IGPO's correctness reward).

    Shapes: ``rewards (N,)`` float, ``group (N,)`` long, ``on_policy (N,)`` bool -> ``(num_groups,)`` bool.
    """
    g = group[on_policy].long().cpu()
    has = torch.zeros(num_groups, dtype=torch.bool)
    has[g] = True
    right = torch.zeros(num_groups, dtype=torch.bool)
    right[g[(rewards[on_policy].float().cpu() >= threshold)]] = True
    return has & ~right


def hint_chunks(n: int, chunk_min: int, chunk_max: int, rng: Draws) -> list[tuple[int, int]]:
    """IGPO's split of a trace of ``n`` tokens into consecutive chunks ``[start, end)`` from its start, each of a
    length drawn uniformly from ``chunk_min..chunk_max``; a remainder shorter than ``chunk_min`` is dropped (it is
    never a hint)."""
    if not 1 <= chunk_min <= chunk_max:
        raise ValueError(f"need 1 <= chunk_min <= chunk_max, got {chunk_min}, {chunk_max}")
    out, start = [], 0
    while n - start >= chunk_min:
        size = min(rng.randint(chunk_min, chunk_max), n - start)
        out.append((start, start + size))
        start += size
    return out


def hint_canvas(trace: Sequence[int], chunks: Sequence[tuple[int, int]], shown: float, width: int, mask_id: int,
                rng: Draws) -> tuple[Tensor, Tensor]:
    """One row's starting canvas: of ``n`` chunks, ``int(n · (1 - shown))`` hidden, drawn among all but the last
    (the last chunk is always shown, as IGPO's code), and the shown chunks' tokens at their own positions in the
    trace; every other position is ``mask_id``. Chunks past ``width`` are not placed.

    Shapes: -> canvas ``(width,)`` long, hint ``(width,)`` bool (True where the canvas holds a trace token).
    """
    canvas = torch.full((width,), mask_id, dtype=torch.long)
    hint = torch.zeros(width, dtype=torch.bool)
    n = len(chunks)
    if n == 0:
        return canvas, hint
    hidden = set(rng.sample(range(n - 1), min(int(n * (1 - shown)), n - 1)))
    for k, (a, b) in enumerate(chunks):
        if k in hidden or b > width:
            continue
        canvas[a:b] = torch.tensor(list(trace[a:b]), dtype=torch.long)
        hint[a:b] = True
    return canvas, hint
