"""Noise masks for Monte-Carlo likelihood surrogates of masked dLLMs.

Spec: docs/erils.md; ERILS §IV and App. A; the SPG reference code (facebookresearch/SPG,
``SPGTrainer.forward_process``, ``forward_type="block_random"`` for on-policy rollouts and ``"random"`` for
uniformly random masks). All functions are pure given a ``torch.Generator`` and vectorised over draws and
rows (the reference loops over rows in Python). A :class:`lit_rl.rng.RowStreams` in place of the generator
gives each row its own stream (row ``i`` draws exactly what it would draw alone from generator ``i``) while
the arithmetic still runs over the whole batch at once.

Conventions. ``completion_mask (B, L)`` is True on the completion tokens up to and including the first
EOS; ``L`` is the padded completion width and completion position ``j`` sits at sequence position
``P + j``. A mask set is a :class:`DiffusionMasks`:

* ``completion (num_t, B, L)``: completion positions replaced by [MASK] in the model input. Positions
  after the first EOS are always masked here (SPG: "positions after EOS masked").
* ``loss (num_t, B, L)``: the scored positions ``M_j`` = masked AND inside ``completion_mask``
  (SPG scores ``completion_mask * (noisy == mask_id)``; after-EOS positions are never scored).
* ``prompt (num_t, B, P)`` or ``None``: prompt positions replaced by [MASK] (SPG's ``p_mask_prompt``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from lit_rl import rng

__all__ = [
    "DiffusionMasks",
    "BlockChoice",
    "spg_block_choice",
    "uniform_block_choice",
    "BLOCK_CHOICES",
    "spg_block_masks",
    "uniform_random_masks",
    "full_completion_masks",
    "mask_prompt_tokens",
    "apply_masks",
]


class DiffusionMasks(NamedTuple):
    """Masks for ``num_t`` noise draws of ``B`` rollouts (see module doc)."""

    completion: torch.Tensor  # (num_t, B, L) bool: [MASK] in the input
    loss: torch.Tensor  # (num_t, B, L) bool: scored positions M_j (subset of completion & completion_mask)
    prompt: torch.Tensor | None = None  # (num_t, B, P) bool or None


Draws = torch.Generator | rng.RowStreams | None
"""Where a mask function draws: one generator for the batch, one stream per row (:class:`lit_rl.rng.RowStreams`,
row axis ``B``), or the global stream."""

BlockChoice = Callable[[torch.Tensor, int, int, torch.Generator | None], torch.Tensor]
"""``(valid_blocks (B,) long >= 1, num_blocks, num_t, generator) -> block index (num_t, B) long``. The built-in
choices also take a :class:`lit_rl.rng.RowStreams`; a user's gets a ``torch.Generator`` (one row at a time)."""


def _randperm_rows(rows: int, n: int, generator: Draws, device) -> torch.Tensor:
    """An independent random permutation of ``range(n)`` per row. Shape: ``(rows, n)``."""
    return rng.uniform((rows, n), generator=generator, device=device, row_dim=0).argsort(-1)  # (rows, n)


def spg_block_choice(valid_blocks: torch.Tensor, num_blocks: int, num_t: int, generator: Draws) -> torch.Tensor:
    """SPG's choice: a random permutation of ``range(num_blocks)`` per row, taken modulo the row's number
    of non-empty blocks, first ``num_t`` entries. Distinct blocks across draws when the completion spans
    at least ``num_t`` blocks; slightly favours early blocks when ``num_blocks`` is not a multiple of
    ``valid_blocks`` (as the reference). SPG asserts ``num_t <= num_blocks``; we instead chain further
    permutations when more draws are requested.
    """
    B = valid_blocks.shape[0]
    reps = -(-num_t // num_blocks)  # ceil
    perm = torch.cat(
        [_randperm_rows(B, num_blocks, generator, valid_blocks.device) for _ in range(reps)], dim=1
    )  # (B, reps * num_blocks)
    return (perm[:, :num_t] % valid_blocks[:, None]).T.contiguous()  # (num_t, B)


def uniform_block_choice(valid_blocks: torch.Tensor, num_blocks: int, num_t: int, generator: Draws) -> torch.Tensor:
    """Independent uniform choice among the row's non-empty blocks for each draw (with replacement)."""
    u = rng.uniform((num_t, valid_blocks.shape[0]), generator=generator, device=valid_blocks.device,
                    row_dim=1)  # (num_t, B)
    return (u * valid_blocks[None, :]).floor().long().clamp(max=valid_blocks[None, :] - 1)  # (num_t, B)


BLOCK_CHOICES: dict[str, BlockChoice] = {"spg": spg_block_choice, "uniform": uniform_block_choice}


def _random_subset(candidates: torch.Tensor, counts: torch.Tensor, generator: Draws) -> torch.Tensor:
    """Choose ``counts`` positions uniformly without replacement among ``candidates`` (True), per row.

    ``candidates (num_t, B, L)`` bool, ``counts (num_t, B)`` long with ``counts <= candidates.sum(-1)``.
    Returns ``(num_t, B, L)`` bool.
    """
    if candidates.dim() != 3:  # the draw's row axis is 1 (RowStreams): a (B, L) input would draw by column
        raise ValueError(f"candidates must be (num_t, B, L), got shape {tuple(candidates.shape)}")
    scores = rng.uniform(candidates.shape, generator=generator, device=candidates.device, row_dim=1)  # (num_t, B, L)
    scores = scores.masked_fill(~candidates, 2.0)  # non-candidates rank last
    rank = scores.argsort(-1).argsort(-1)  # (..., L) rank of each position
    return (rank < counts[..., None]) & candidates


def _uniform_count(upper: torch.Tensor, generator: Draws, min_frac: float = 0.0, max_frac: float = 1.0) -> torch.Tensor:
    """``n ~ U{lo..hi}`` per entry with SPG's bounds ``lo = max(int(upper*min_frac), 1)``,
    ``hi = min(int(upper*max_frac), upper)``; 0 where ``upper == 0``. Shapes: ``upper (num_t, B)``."""
    if upper.dim() != 2:  # the draw's row axis is 1 (RowStreams)
        raise ValueError(f"upper must be (num_t, B), got shape {tuple(upper.shape)}")
    lo = (upper.double() * min_frac).long().clamp(min=1)
    hi = torch.minimum((upper.double() * max_frac).long(), upper)
    hi = torch.maximum(hi, lo)
    u = rng.uniform(upper.shape, generator=generator, device=upper.device, dtype=torch.float64, row_dim=1)
    n = lo + (u * (hi - lo + 1)).floor().long()
    return torch.where(upper > 0, n.clamp(max=hi), torch.zeros_like(n))


def _check_completion_mask(completion_mask: torch.Tensor) -> torch.Tensor:
    if completion_mask.dim() != 2:
        raise ValueError(f"completion_mask must be (B, L), got shape {tuple(completion_mask.shape)}")
    return completion_mask.bool()


def spg_block_masks(
    completion_mask: torch.Tensor,
    block_length: int,
    num_t: int,
    generator: Draws = None,
    *,
    block_choice: BlockChoice | str = "spg",
    min_t: float = 0.0,
    max_t: float = 1.0,
    p_mask_clean: float = 0.0,
    gen_width: int | None = None,
) -> DiffusionMasks:
    """SPG's block masking for on-policy rollouts (SPG code, ``forward_type="block_random"``).

    Per draw ``j`` and row: choose a block ``k_j`` among the blocks that hold completion tokens
    (``block_choice``); blocks before ``k_j`` are clean; in block ``k_j``, ``n ~ U{1..m}`` of its
    ``m = min(block_length, len - k_j*block_length)`` valid positions are masked, chosen uniformly (with
    ``min_t``/``max_t`` bounding ``n`` as in SPG); every block after ``k_j`` is fully masked; positions after
    the first EOS are always masked in the input and never scored. With ``p_mask_clean > 0`` each clean
    completion token of the blocks before ``k_j`` is also masked w.p. ``p_mask_clean`` and, as in the
    reference, scored (SPG draws this with its ``p_mask_prompt`` for every token outside the block-level
    mask: the prompt and the blocks before ``k_j``; the prompt part is :func:`mask_prompt_tokens`).

    Blocks are aligned to the start of the completion (as in decoding). ``gen_width`` is the rows' own
    generation width (on-policy rows: ``L_gen``; ``None``: ``L``): a mixed batch is padded to its widest
    external rollout, and positions at or after ``gen_width`` are padding, never scored and masked in the
    input. SPG's block rule runs over the ``ceil(gen_width / block_length)`` blocks of the rows' own width,
    not over the padded width (over the padded width ``perm % valid_blocks`` would favour block 0 more the
    wider the padding: 0.176 instead of 0.125 with 8 valid blocks in a 17-block width), so without padding
    nothing changes. If ``gen_width`` is not a multiple of ``block_length`` the last block is shorter (SPG
    asserts divisibility). A row with an empty completion gets no scored position.

    Shapes: ``completion_mask (B, L)`` -> masks ``(num_t, B, L)``.
    """
    completion_mask = _check_completion_mask(completion_mask)
    B, L = completion_mask.shape
    if block_length <= 0:
        raise ValueError(f"block_length must be positive, got {block_length}")
    if num_t < 1:
        raise ValueError(f"num_t must be >= 1, got {num_t}")
    if isinstance(block_choice, str):
        if block_choice not in BLOCK_CHOICES:
            raise ValueError(f"block_choice must be one of {sorted(BLOCK_CHOICES)} or a callable, got {block_choice!r}")
        block_choice = BLOCK_CHOICES[block_choice]
    device = completion_mask.device
    width = L if gen_width is None else int(gen_width)
    if not 1 <= width <= L:
        raise ValueError(f"gen_width must be in [1, L = {L}], got {gen_width}")
    pos = torch.arange(L, device=device)  # (L,)
    completion_mask = completion_mask & (pos < width)[None, :]  # padding is never a completion token
    num_blocks = -(-width // block_length)  # ceil: a shorter last block if width % block_length
    lengths = completion_mask.sum(-1)  # (B,)
    valid_blocks = ((lengths - 1) // block_length + 1).clamp(min=1)  # (B,) blocks holding completion tokens

    k = block_choice(valid_blocks, num_blocks, num_t, generator).to(device)  # (num_t, B)
    block_of = pos // block_length  # (L,)
    kk = k[:, :, None]  # (num_t, B, 1)
    valid = completion_mask[None].expand(num_t, B, L)  # (num_t, B, L)

    in_block = (block_of[None, None, :] == kk) & valid  # (num_t, B, L) valid positions of block k
    m = in_block.sum(-1)  # (num_t, B)
    n = _uniform_count(m, generator, min_t, max_t)  # (num_t, B)
    masked_in_block = _random_subset(in_block, n, generator)  # (num_t, B, L)
    after = block_of[None, None, :] > kk  # (num_t, B, L) blocks after k
    before = block_of[None, None, :] < kk  # (num_t, B, L) blocks before k

    masked = masked_in_block | after
    if p_mask_clean > 0:
        u = rng.uniform((num_t, B, L), generator=generator, device=device, row_dim=1)
        masked = masked | (before & valid & (u < p_mask_clean))
    loss = masked & valid
    completion = masked | ~valid  # after-EOS positions are masked in the input
    return DiffusionMasks(completion=completion, loss=loss)


def uniform_random_masks(
    completion_mask: torch.Tensor,
    num_t: int,
    generator: Draws = None,
    *,
    rule: str = "count",
    min_t: float = 0.0,
    max_t: float = 1.0,
) -> DiffusionMasks:
    """Uniformly random masked completion positions, for external rollouts (ERILS §IV: their generation
    confidences do not exist, so no block structure).

    ``rule="count"`` (default; SPG code, ``forward_type="random"``): per draw and row, ``n ~ U{1..len}``
    (``len`` = valid completion tokens; bounds ``max(int(len*min_t),1)..min(int(len*max_t),len)``), then
    ``n`` positions chosen uniformly without replacement among the valid completion tokens.
    ``rule="bernoulli"`` (ERILS App. A / LLaDA): ``t ~ U(0, 1)``, each valid token masked independently
    w.p. ``t``; a draw that masks nothing is given one uniformly chosen masked token so that every draw
    scores at least one position.

    Positions after the first EOS are masked in the input and never scored.

    Shapes: ``completion_mask (B, L)`` -> masks ``(num_t, B, L)``.
    """
    completion_mask = _check_completion_mask(completion_mask)
    B, L = completion_mask.shape
    if num_t < 1:
        raise ValueError(f"num_t must be >= 1, got {num_t}")
    device = completion_mask.device
    valid = completion_mask[None].expand(num_t, B, L)  # (num_t, B, L)
    lengths = valid.sum(-1)  # (num_t, B)
    if rule == "count":
        n = _uniform_count(lengths, generator, min_t, max_t)  # (num_t, B)
        selected = _random_subset(valid, n, generator)  # (num_t, B, L)
    elif rule == "bernoulli":
        t = rng.uniform((num_t, B, 1), generator=generator, device=device, row_dim=1)
        u = rng.uniform((num_t, B, L), generator=generator, device=device, row_dim=1)
        selected = (u < t) & valid
        none = (selected.sum(-1) == 0) & (lengths > 0)  # (num_t, B)
        one = _random_subset(valid, none.long(), generator)
        selected = selected | one
    else:
        raise ValueError(f"rule must be 'count' or 'bernoulli', got {rule!r}")
    return DiffusionMasks(completion=selected | ~valid, loss=selected)


def full_completion_masks(completion_mask: torch.Tensor, num_t: int = 1) -> DiffusionMasks:
    """d1's one-step estimator masks (d1 ``forward_process``): the whole completion is masked; every
    completion token is scored. Shapes: ``(B, L)`` -> ``(num_t, B, L)``."""
    completion_mask = _check_completion_mask(completion_mask)
    valid = completion_mask[None].expand(num_t, *completion_mask.shape)  # (num_t, B, L)
    return DiffusionMasks(completion=torch.ones_like(valid), loss=valid.clone())


def mask_prompt_tokens(
    masks: DiffusionMasks,
    prompt_mask: torch.Tensor,
    p: float,
    generator: Draws = None,
) -> DiffusionMasks:
    """Mask each real prompt token (``prompt_mask`` True) independently w.p. ``p`` per draw
    (d1/SPG ``p_mask_prompt``; default 0.15 in their ``train.yaml``). Prompt tokens are never scored.
    Padding positions are left alone (they are outside attention anyway).

    Shapes: ``prompt_mask (B, P)`` -> ``masks.prompt (num_t, B, P)``.
    """
    num_t = masks.completion.shape[0]
    pm = prompt_mask.bool()[None].expand(num_t, *prompt_mask.shape)  # (num_t, B, P)
    if p <= 0:
        return masks._replace(prompt=torch.zeros_like(pm))
    u = rng.uniform(pm.shape, generator=generator, device=pm.device, row_dim=1)
    return masks._replace(prompt=pm & (u < p))


def apply_masks(input_ids: torch.Tensor, masks: DiffusionMasks, prompt_len: int, mask_id: int) -> torch.Tensor:
    """Noisy inputs: ``input_ids`` with [MASK] at every masked prompt / completion position.

    Shapes: ``input_ids (B, T)`` with ``T = prompt_len + L`` -> ``(num_t, B, T)``.
    """
    num_t, B, L = masks.completion.shape
    if input_ids.shape != (B, prompt_len + L):
        raise ValueError(
            f"input_ids shape {tuple(input_ids.shape)} must be (B, prompt_len + L) = {(B, prompt_len + L)}"
        )
    if masks.prompt is None:
        prompt_part = torch.zeros(num_t, B, prompt_len, dtype=torch.bool, device=input_ids.device)
    else:
        prompt_part = masks.prompt
    full = torch.cat([prompt_part, masks.completion], dim=-1)  # (num_t, B, T)
    return input_ids[None].expand(num_t, -1, -1).masked_fill(full, mask_id)  # (num_t, B, T)
