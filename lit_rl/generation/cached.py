"""Fast dLLM decoding: block KV cache and confidence-threshold parallel unmasking, batched, per-row progress.

The same semi-autoregressive low-confidence remasking as :func:`lit_rl.generation.diffusion.diffusion_generate`
(the exact reference, which stays the default), with two accelerations from Fast-dLLM (Wu et al., arXiv
2505.22618), as Gen-Verse/dLLM-RL uses them for RL rollouts:

* ``cache="prefix"``: at a row's first step in a block the whole sequence runs through the model (a
  **refresh**: every layer's keys/values are stored, and its logits make that step's choice); at the
  block's later steps only the block and everything after it run, attending to the stored keys/values of
  the prompt and the finished blocks. ``cache="dual"`` also reuses the stored keys/values of the masked
  suffix, so only the block's ``block_length`` positions run. ``refresh_every=k`` refreshes again after
  ``k`` steps inside a block (``1``: every step, which is the exact algorithm up to float rounding).
  ``cache="none"`` runs the whole sequence at every step (the exact forward) in this loop.
* ``threshold=τ``: reveal every masked position of the block whose confidence ``softmax(logits)[x0]`` is at
  least ``τ``, and at least the most confident one, instead of the fixed ``num_transfer_tokens`` schedule;
  ``steps`` is then unused (a block takes between 1 and ``block_length`` steps). ``threshold_floor="schedule"``
  reveals at least the fixed schedule's count instead, so a block takes at most ``steps / num_blocks`` steps:
  early in RL, when few positions pass ``τ``, Fast-dLLM's floor of one needs more passes than the schedule.

**Per-row progress.** Each row has its own block and step counters. A row whose block has no [MASK] left
moves to its next block at once (its next step is a refresh); a finished row leaves the batch, so the
model runs only on rows with work left and a fast row never waits for a slow one. Under the fixed schedule
every row needs the same number of steps per block, so the rows stay in step; with a threshold they drift
apart. With ``cache="prefix"`` the rows of one step share a window that starts at the earliest block start
among them; a row further ahead keeps its cached keys/values before its own block start, so every row gets
exactly what its own window would give, whatever its batchmates' progress.

**Which sampler the surrogate scores.** Cached keys/values are slightly stale and threshold decoding
reveals several tokens per step, so these rollouts come from a sampler that differs a little from the
exact one. The trainer's log-likelihoods (the SPG surrogate) are full-sequence forwards of the policy either
way, as in dLLM-RL and Fast-dLLM: the rollouts are then slightly off-policy for the surrogate.

Token choice, the [MASK] exclusion, the confidence and the noise are :mod:`lit_rl.generation.diffusion`'s;
for the exact loop (``cache="none"``, no threshold) the noise is drawn in the same order, so this function
returns the reference's tokens at any temperature (tested).
"""

from __future__ import annotations

import torch

from lit_rl.generation.diffusion import (DecodeStats, ModelFn, _check_args, _choose_tokens,  # noqa: F401
                                         num_transfer_tokens, position_ids_from_attention_mask)
from lit_rl.generation.kv_stack import KVCache, KVStack
from lit_rl.generation.settings import THRESHOLD_FLOORS

__all__ = ["CACHE_MODES", "DecodeStats", "cached_diffusion_generate"]

CACHE_MODES = ("none", "prefix", "dual")


def _window_index(starts: torch.Tensor, block_length: int, T: int, cache: str, shift: int) -> torch.Tensor:
    """Absolute positions each row runs through the layers at a cached step, ``(R, A)``.

    ``dual``: the block (and the position before it when logits come from ``p - shift``); ``prefix``: from the
    earliest block start among the rows to the end of the sequence.
    """
    if cache == "dual":
        return starts[:, None] - shift + torch.arange(block_length + shift, device=starts.device)  # (R, Lb+shift)
    first = int(starts.min()) - shift
    return torch.arange(first, T, device=starts.device).expand(starts.shape[0], -1)  # (R, T - first)


def _block_logits_exact(model_fn: ModelFn, x, attention_mask, rows, block_pos) -> torch.Tensor:
    """Full-sequence forward of ``rows`` -> logits at ``block_pos (R, Lb)``, ``(R, Lb, V)``."""
    logits = model_fn(x[rows], attention_mask[rows])  # (R, T, V)
    return logits.gather(1, block_pos[:, :, None].expand(-1, -1, logits.shape[-1]))


def _block_logits_cached(stack: KVStack, kv: KVCache, x, pos, key_mask, rows, block_pos, refresh,
                         cache) -> torch.Tensor:
    """Logits ``(R, Lb, V)`` at ``block_pos (R, Lb)``: refreshed rows run whole, the others their window."""
    R, Lb = block_pos.shape
    T = x.shape[1]
    hidden = None
    logit_pos = block_pos - stack.shift  # (R, Lb) hidden states that predict the block
    for sel, full in ((refresh, True), (~refresh, False)):
        if not bool(sel.any()):
            continue
        r = rows[sel]  # (R_s,)
        if full:
            h = stack.refresh(x[r], pos[r], key_mask[r], kv, r)  # (R_s, T, d)
            at = logit_pos[sel]
        else:
            starts = block_pos[sel, 0]  # (R_s,)
            index = _window_index(starts, Lb, T, cache, stack.shift)  # (R_s, A)
            fresh_from = starts - stack.shift if cache == "prefix" else None  # a shared window: own part only
            h = stack.window(x[r].gather(1, index), pos[r].gather(1, index), index, key_mask[r], kv, r, fresh_from)
            at = logit_pos[sel] - index[:, :1]  # offsets inside the window
        part = h.gather(1, at[:, :, None].expand(-1, -1, h.shape[-1]))  # (R_s, Lb, d)
        if hidden is None:
            hidden = part.new_empty((R, Lb, part.shape[-1]))
        hidden[sel] = part
    return stack.head(hidden)  # (R, Lb, V)


@torch.no_grad()
def cached_diffusion_generate(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    temperature: float,
    mask_id: int,
    model_fn: ModelFn | None = None,
    stack: KVStack | None = None,
    cache: str = "dual",
    refresh_every: int | None = None,
    threshold: float | None = None,
    threshold_floor: str = "one",
    generator: torch.Generator | None = None,
    logits_dtype: torch.dtype = torch.float64,
    sampler: str = "gumbel",
    stats: DecodeStats | None = None,
) -> torch.Tensor:
    """Decode ``gen_length`` tokens after left-padded prompts with a block KV cache and/or a threshold.

    Args:
        prompt_ids, prompt_mask: ``(B, P)`` left-padded prompts and their mask (0 on padding).
        gen_length, block_length, steps, temperature, mask_id, generator, logits_dtype, sampler: as
            :func:`~lit_rl.generation.diffusion.diffusion_generate` (``steps`` unused with a threshold).
        model_fn: the full forward ``(ids, mask) -> logits (B, T, V)``; needed for ``cache="none"``.
        stack: the model's :class:`~lit_rl.generation.kv_stack.KVStack`; needed for ``prefix`` / ``dual``.
        cache: ``"none"``, ``"prefix"`` or ``"dual"`` (module doc).
        refresh_every: refresh the cache every this many steps inside a block (``None``: once per block).
        threshold: reveal every masked position with confidence >= this; ``None`` keeps the fixed schedule.
        threshold_floor: the least a threshold step reveals: ``"one"`` (the most confident position, Fast-dLLM)
            or ``"schedule"`` (the fixed schedule's count at that step: never more passes than ``steps``).
        stats: filled with what the decode cost, if given.

    Returns:
        ``(B, P + gen_length)`` long: the prompts followed by their completions, no [MASK] left.
    """
    num_blocks = _check_args(prompt_ids, prompt_mask, gen_length, block_length, steps, temperature, sampler)
    if cache not in CACHE_MODES:
        raise ValueError(f"generation.cache must be one of {CACHE_MODES}, got {cache!r}")
    if cache == "none" and model_fn is None or cache != "none" and stack is None:
        raise ValueError(f"generation.cache={cache!r} needs {'model_fn' if cache == 'none' else 'a KVStack'}")
    if refresh_every is not None and refresh_every < 1:
        raise ValueError(f"generation.refresh_every must be >= 1 (or null), got {refresh_every}")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ValueError(f"generation.threshold must be in (0, 1], got {threshold}")
    if threshold_floor not in THRESHOLD_FLOORS:
        raise ValueError(f"generation.threshold_floor must be one of {THRESHOLD_FLOORS}, got {threshold_floor!r}")
    if cache != "none" and stack.shift and prompt_ids.shape[1] < stack.shift:
        raise ValueError("a model whose logits at p - 1 predict p (Dream) needs at least one prompt token to decode "
                         "with a cache")
    stats = stats if stats is not None else DecodeStats()
    B, P = prompt_ids.shape
    T = P + gen_length
    device = prompt_ids.device
    # (B, T)
    x = torch.cat([prompt_ids.long(), torch.full((B, gen_length), mask_id, dtype=torch.long, device=device)], 1)
    attention_mask = torch.cat([prompt_mask.long(), torch.ones(B, gen_length, dtype=torch.long, device=device)], 1)
    pos = position_ids_from_attention_mask(attention_mask)  # (B, T)
    key_mask = attention_mask.bool()
    # every row enters every block with all block_length positions masked: one schedule for all
    schedule = num_transfer_tokens(torch.tensor([block_length], device=device), steps // num_blocks)[0]  # (S,)
    block = torch.zeros(B, dtype=torch.long, device=device)  # each row's current block
    step = torch.zeros(B, dtype=torch.long, device=device)  # each row's step inside it
    since = torch.zeros(B, dtype=torch.long, device=device)  # steps since the row's last refresh
    stale = torch.ones(B, dtype=torch.bool, device=device)  # the row entered a block: refresh
    kv = KVCache(batch=B)
    offsets = torch.arange(block_length, device=device)
    revealed_conf = torch.zeros((), device=device)

    while True:
        rows = (block < num_blocks).nonzero().squeeze(1)  # (R,) rows with work left
        if rows.numel() == 0:
            break
        R = rows.numel()
        block_pos = P + block[rows, None] * block_length + offsets  # (R, Lb) absolute positions
        if cache == "none":
            logits = _block_logits_exact(model_fn, x, attention_mask, rows, block_pos)
            stats.forward_tokens += R * T
        else:
            refresh = stale[rows]  # (R,) a new block
            if refresh_every is not None:
                refresh = refresh | (since[rows] >= refresh_every)
            before = stack.forward_tokens
            logits = _block_logits_cached(stack, kv, x, pos, key_mask, rows, block_pos, refresh, cache)
            stats.forward_tokens += stack.forward_tokens - before
            stats.refreshes += int(refresh.sum())
            since[rows] = torch.where(refresh, 0, since[rows])
        stats.steps += 1
        stats.row_forwards += R

        tokens = x[rows[:, None], block_pos]  # (R, Lb)
        masked = tokens == mask_id  # (R, Lb)
        flat = logits[masked].float()  # (N, V) the still-masked positions, row-major (the reference's order)
        x0, top = _choose_tokens(flat, temperature, mask_id, sampler, generator, logits_dtype)  # (N,), (N,)
        conf = torch.full(masked.shape, float("-inf"), device=device)  # (R, Lb)
        conf[masked] = (top - torch.logsumexp(flat, -1)).exp()  # softmax(untempered logits)[x0]
        cand = torch.full_like(tokens, mask_id)
        cand[masked] = x0
        if threshold is None:
            n = schedule[step[rows]]  # (R,)
        else:
            floor = schedule[step[rows]] if threshold_floor == "schedule" else 1  # (R,) | int
            n = torch.maximum((conf >= threshold).sum(1), torch.as_tensor(floor, device=device))  # (R,)
            n = torch.minimum(n, masked.sum(1))  # a block ahead of its schedule has fewer [MASK] than the floor
        k = int(n.max())
        order = conf.topk(k, dim=-1).indices  # (R, k) most confident first
        keep = torch.arange(k, device=device)[None, :] < n[:, None]  # (R, k)
        r_idx = torch.arange(R, device=device)[:, None].expand(-1, k)[keep]  # (M,)
        c_idx = order[keep]  # (M,)
        x[rows[r_idx], block_pos[r_idx, c_idx]] = cand[r_idx, c_idx]
        revealed_conf = revealed_conf + conf[r_idx, c_idx].sum()  # () the committed tokens' confidence
        stats.revealed += int(c_idx.numel())

        step[rows] += 1
        since[rows] += 1
        stale[rows] = False
        done = ~(x[rows[:, None], block_pos] == mask_id).any(1)  # (R,) block finished
        finished = rows[done]
        block[finished] += 1
        step[finished] = 0
        stale[finished] = True
    stats.confidence_sum += float(revealed_conf)
    stats.rows += B
    return x
