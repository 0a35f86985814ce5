"""Double-rollout reward estimation math (Qian et al., "Double-Rollout RL with Sampling-based Reward
Estimation", §2), as pure functions over python lists and tensors.

The algorithm, per prompt x with G rollouts y_i and rewards r_i::

    t_i      = thinking trace of y_i (tokens before the delimiter, e.g. ``</think>`` / ``</reasoning>``)
    T_i      = |t_i|;  cut_i = floor(ρ·T_i)                       -> split_thinking, cut_index
    prefix   = x ⊕ t_i[:cut_i]; sample N continuations c_ij with
               max_new_tokens = T_i - cut_i + buffer              -> continuation_budget
    q_ij     = R(x, t_i[:cut_i] ⊕ c_ij);  r̂_i = mean_j q_ij      -> revised_rewards
    A_i      = GRPO group advantage of r̂                         (advantages.group_centered)
    if A_i > 0 and y_i's own answer is wrong: y_i <- t_i[:cut_i] ⊕ c_ij for a correct j
                                                                  -> one_sided_replacement
    optional: r̂_i += λ·max(0, -z_i) on S = {A_i > 0}, z from lengths within S; the bonus is added
               after the baseline: A_i = (r̂_i + bonus_i - b_i)/σ_i, b and σ those of r̂
                                                                  -> length_bonus
    comparator (DR Fig. 3): r_i ← r_i·(1 - α·σ(z_i)) on correct rollouts, z within the correct ones
               (Arora & Zanette 2025)                            -> length_penalty_az
    data profiling: drop prompts with pass rate 0 or 1           -> pass_rate_filter

Departures / choices where the paper is silent are documented on each function.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import torch
from torch import Tensor

from lit_rl import rng

__all__ = [
    "continuation_budget",
    "cut_index",
    "length_bonus",
    "length_penalty_az",
    "one_sided_replacement",
    "pass_rate_filter",
    "revised_rewards",
    "split_thinking",
    "split_thinking_text",
]

Missing = Literal["whole", "skip"]


def _check_missing(missing: str) -> None:
    if missing not in ("whole", "skip"):
        raise ValueError(f"missing must be 'whole' or 'skip', got {missing!r}")


def split_thinking(
    token_ids: Sequence[int],
    delimiter_ids: Sequence[int],
    missing: Missing = "whole",
) -> int | None:
    """Length ``T`` of the thinking trace: index where the FIRST occurrence of ``delimiter_ids`` starts.

    The trace is ``token_ids[:T]`` (the delimiter itself is not part of it). The first occurrence is used
    because the reasoning ends where the model first closes it; anything after belongs to the answer.

    A rollout without the delimiter (typically one that hit the generation limit mid-thought, or a model
    that skipped the tags):

    * ``missing="whole"`` (default): the whole completion is the trace, ``T = len(token_ids)``. Every
      rollout of a group then gets a continuation-based reward, so the group baseline compares like with
      like, and truncated-but-on-track rollouts can still earn credit.
    * ``missing="skip"``: return ``None``; the caller samples no continuations and keeps the original
      reward for that rollout (see ``revised_rewards(..., original=, has_continuations=)``).

    Matching is on token ids, so ``delimiter_ids`` must be the ids the tokenizer actually produces in
    context (e.g. a single special token ``</think>`` for Qwen3; several ids for ``</reasoning>``).
    """
    _check_missing(missing)
    d = list(delimiter_ids)
    if not d:
        raise ValueError("delimiter_ids must not be empty")
    ids = list(token_ids)
    n, m = len(ids), len(d)
    first = d[0]
    for i in range(n - m + 1):
        if ids[i] == first and ids[i : i + m] == d:
            return i
    return n if missing == "whole" else None


def split_thinking_text(
    text: str,
    delimiter: str | Sequence[str] = ("</think>", "</reasoning>"),
    missing: Missing = "whole",
) -> int | None:
    """Text-level variant of :func:`split_thinking`: character index where the trace ends.

    With several delimiters, the earliest position of any of them wins. ``missing`` as in
    :func:`split_thinking` (``"whole"`` → ``len(text)``, ``"skip"`` → ``None``). Useful for tests and for
    backends that return text; training cuts in token space.
    """
    _check_missing(missing)
    delims = [delimiter] if isinstance(delimiter, str) else list(delimiter)
    if not delims or any(not d for d in delims):
        raise ValueError("delimiter must be non-empty")
    hits = [p for p in (text.find(d) for d in delims) if p >= 0]
    if hits:
        return min(hits)
    return len(text) if missing == "whole" else None


def _check_rho(rho: float) -> None:
    if not (0.0 < rho <= 1.0):
        raise ValueError(f"rho must be in (0, 1], got {rho}")


def cut_index(trace_len: int, rho: float) -> int:
    """Number of trace tokens kept in the prefix: ``floor(ρ·T)``.

    * floor, not round: the paper says "keep the first 90%", so the kept part never exceeds ρ·T and the
      continuation always regenerates at least the fractional remainder.
    * ρ ∈ (0, 1]; ρ = 1 keeps the whole trace (continuations only re-sample the answer).
    * No 1-token minimum: for tiny traces (T·ρ < 1) the cut is 0 and the prefix is the prompt alone —
      the same thing as the paper's ρ → 0 limit, well defined, and it avoids keeping the whole of a 1-token
      trace when ρ < 1.
    * ``ρ·T`` is rounded to 9 decimals before the floor so that float error cannot drop a token
      (``0.29 * 100 == 28.999999999999996`` in binary floating point; the cut is 29).
    """
    _check_rho(rho)
    if trace_len < 0:
        raise ValueError(f"trace_len must be >= 0, got {trace_len}")
    return min(trace_len, math.floor(round(rho * trace_len, 9)))


def continuation_budget(trace_len: int, rho: float, buffer: int) -> int:
    """``max_new_tokens`` for each continuation: ``ceil((1-ρ)·T) + buffer`` (DR §2, footnote 4).

    Computed as ``T - cut_index(T, ρ) + buffer``, which equals ``ceil((1-ρ)·T) + buffer`` exactly, without
    float error, and always covers the removed part of the trace. Paper buffers: math 1024, code 4096.
    """
    if buffer < 0:
        raise ValueError(f"buffer must be >= 0, got {buffer}")
    return trace_len - cut_index(trace_len, rho) + buffer


def revised_rewards(
    cont_rewards: Tensor,
    original: Tensor | None = None,
    has_continuations: Tensor | None = None,
) -> Tensor:
    """Revised reward ``r̂_i = mean_j q_ij`` over the N continuations of rollout i.

    Shape: ``cont_rewards`` ``(B, N)`` → ``(B,)``.

    With ``original`` ``(B,)`` and ``has_continuations`` ``(B,)`` bool, rows without continuations (the
    ``missing="skip"`` rule) keep their original reward; their ``cont_rewards`` row is ignored.
    """
    if cont_rewards.ndim != 2:
        raise ValueError(f"cont_rewards must be (B, N), got {tuple(cont_rewards.shape)}")
    dtype = cont_rewards.dtype if cont_rewards.is_floating_point() else torch.get_default_dtype()
    mean = cont_rewards.to(dtype).mean(dim=1)  # (B,)
    if has_continuations is None:
        return mean
    if original is None:
        raise ValueError("has_continuations needs original")
    return torch.where(has_continuations.bool(), mean, original.to(mean.dtype))


def one_sided_replacement(
    advantages: Tensor,
    own_correct: Tensor,
    cont_correct: Tensor,
    rule: Literal["first", "random", "shortest"] = "first",
    cont_lengths: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Which continuation replaces each rollout, or -1 for none (DR §2, "one-sided rollout replacements").

    Rollout i is replaced iff ``A_i > 0`` and its own final answer is wrong and at least one of its
    continuations is correct. Never the other way round: a correct rollout with ``A_i <= 0`` stays (it
    should be punished for guessing prematurely).

    The paper says "one of its correct continuations" without saying which:

    * ``"first"`` (default): the lowest index j. Continuations are i.i.d. samples, so this is
      distributed like a uniformly random correct one, and deterministic.
    * ``"random"``: uniform among the correct ones, drawn with ``generator``.
    * ``"shortest"``: fewest tokens (``cont_lengths`` required); ties go to the lowest index. Biases
      the replacement toward short completions, which compounds with a length bonus.

    Shapes: ``advantages`` ``(B,)``, ``own_correct`` ``(B,)`` bool, ``cont_correct`` ``(B, N)`` bool,
    ``cont_lengths`` ``(B, N)``; returns ``(B,)`` long.
    """
    B, N = cont_correct.shape
    if advantages.shape != (B,) or own_correct.shape != (B,):
        raise ValueError("advantages and own_correct must be (B,) matching cont_correct (B, N)")
    cc = cont_correct.bool()  # (B, N)
    eligible = (advantages > 0) & ~own_correct.bool() & cc.any(dim=1)  # (B,)
    j = torch.arange(N, device=cc.device)
    if rule == "first":
        # lowest correct index: argmin over (j where correct else N)
        choice = torch.where(cc, j, torch.full_like(j, N)).argmin(dim=1)  # (B,)
    elif rule == "random":
        noise = rng.uniform((B, N), generator=generator, device=cc.device)  # (B, N) in [0, 1)
        choice = torch.where(cc, noise, torch.full_like(noise, -1.0)).argmax(dim=1)  # (B,)
    elif rule == "shortest":
        if cont_lengths is None or cont_lengths.shape != (B, N):
            raise ValueError("rule='shortest' needs cont_lengths of shape (B, N)")
        lengths = cont_lengths.to(torch.float64)
        # key = length·(N+1) + j makes ties break toward the lowest index; argmin of a unique key.
        key = torch.where(cc, lengths * (N + 1) + j, torch.full_like(lengths, torch.inf))
        choice = key.argmin(dim=1)  # (B,)
    else:
        raise ValueError(f"rule must be 'first', 'random' or 'shortest', got {rule!r}")
    return torch.where(eligible, choice, torch.full_like(choice, -1)).long()


def _subset_length_z(lengths: Tensor, group: Tensor, member: Tensor, ddof: int = 0, eps: float = 1e-6) -> Tensor:
    """Length z-scores within each group's subset ``member``: ``(len - mean) / (std + eps)`` with std
    dividing by ``|subset| - ddof``; 0 outside the subset and where the subset has no spread (|subset| = 1
    or equal lengths), never 0/0. Shapes ``(B,)`` → ``(B,)`` float64. Shared by :func:`length_bonus`
    (subset: A > 0) and :func:`length_penalty_az` (subset: correct)."""
    _, idx = torch.unique(group, return_inverse=True)  # (B,)
    G = int(idx.max()) + 1
    L = lengths.to(torch.float64)  # (B,)
    s = member.to(torch.float64)  # (B,)
    zeros = torch.zeros(G, dtype=torch.float64, device=L.device)
    n = zeros.clone().index_add_(0, idx, s)  # (G,) subset size per group
    mean = zeros.clone().index_add_(0, idx, L * s) / n.clamp(min=1)  # (G,)
    dev = (L - mean[idx]) * s  # (B,) deviation, 0 outside the subset
    sd = (zeros.clone().index_add_(0, idx, dev**2) / (n - ddof).clamp(min=1)).sqrt()[idx]  # (B,)
    return torch.where(sd > 0, dev / (sd + eps), torch.zeros_like(dev))  # (B,)


def length_bonus(
    revised: Tensor,
    advantages: Tensor,
    lengths: Tensor,
    group: Tensor,
    lam: float,
    eps: float = 1e-6,
    unbiased_std: bool = False,
) -> Tensor:
    """Upward-only group-relative length reward (DR §2, adapted from Arora & Zanette 2025).

    Per group, on ``S = {i : A_i > 0}``::

        z_i = (len_i - mean_S len) / (std_S len + eps);   r̂_i += lam · max(0, -z_i)    for i in S

    Rollouts outside S are untouched, and the revision is never downward.

    * **The advantages after the bonus.** The caller adds the bonus after the group baseline (and std) of the
      revised rewards: ``A_i = (r̂_i + bonus_i − b_i)/σ_i`` (``group_centered(revised, group, bonus=...)``),
      so A goes up on the rewarded rows and nowhere goes down. Recomputing the baseline from the returned
      rewards instead (``DoubleRolloutSettings.length_bonus_in_baseline``) raises every row's baseline by the
      group's bonuses: a long row of S (no bonus) can end with ``A <= 0``, and when it is a replaced row (an
      incorrect rollout swapped for a correct continuation by :func:`one_sided_replacement`, which needs
      ``A > 0``) the update pushes the correct continuation down. The paper (DR §2) revises "the rewards for
      short-and-reliably-correct rollouts upward ... but we do not apply any length-based downward revision"
      so as to "arbitrarily amplify the magnitude of length-based reward without any risk of confusing the
      model between incorrect rollouts versus correct-but-long rollouts"; with the bonus after the baseline
      that holds for any ``lam``: every row of S keeps ``A > 0`` (at least its pre-bonus advantage), every
      other row keeps its pre-bonus advantage. Example (Dr. GRPO): r̂ = [1, 1, 1, 0] → A = [.25, .25, .25,
      −.75], lengths [6, 5, 9, ·], lam 1 → bonus ≈ [.39, .98, 0, 0]; recomputed, the long row 2 (a
      replacement) gets A ≈ −0.093; after the baseline it keeps 0.25.

    * ``lengths``: tokens of the *final* completion, i.e. after :func:`one_sided_replacement` (kept prefix
      + continuation) — the sequence that is actually trained on and whose length the bonus rewards.
      The caller counts them the same way for every rollout (e.g. completion tokens incl. EOS).
    * std: population std (``unbiased_std=False``, divide by |S|) by default — the z-score describes S
      itself rather than estimating a wider population, and |S| = 2 then gives z = ±1 instead of ±0.71.
      ``unbiased_std=True`` divides by |S| - 1. When |S| = 1 (or all lengths in S equal) z = 0: no bonus.
    * ``lam`` up to 3 in the paper ("3 per z-score").

    Shapes: all ``(B,)``; returns ``(B,)`` float.
    """
    B = revised.shape[0]
    if not (advantages.shape == lengths.shape == group.shape == (B,)):
        raise ValueError("revised, advantages, lengths, group must all be (B,)")
    out_dtype = revised.dtype if revised.is_floating_point() else torch.get_default_dtype()
    in_s = advantages > 0  # (B,)
    if lam == 0 or not bool(in_s.any()):
        return revised.to(out_dtype).clone()
    z = _subset_length_z(lengths, group, in_s, ddof=1 if unbiased_std else 0, eps=eps)  # (B,)
    bonus = lam * torch.clamp(-z, min=0.0) * in_s.to(torch.float64)  # (B,) upward only, S only
    return (revised.to(torch.float64) + bonus).to(out_dtype)


def length_penalty_az(
    rewards: Tensor,
    correct: Tensor,
    lengths: Tensor,
    group: Tensor,
    alpha: float,
    eps: float = 1e-6,
) -> Tensor:
    """Arora & Zanette's length penalty ("Training Language Models to Reason Efficiently", arXiv 2502.04463),
    the comparator of DR Fig. 3.

    Per group (prompt), over its correct rollouts ``C = {i : correct_i}``::

        z_i = (len_i - mean_C len) / (std_C len + eps);   r_i ← r_i · (1 - α · σ(z_i))    for i in C

    Incorrect rollouts keep their reward (0 for a 0/1 verifier, as in the paper, whose reward is
    ``1{correct} · (1 - α σ(z))``); every correct rollout is penalised, the shorter ones less, so with
    α < 1 a correct answer always beats a wrong one. std is the population std over C (the paper's
    ``VAR(x)``); |C| = 1 or equal lengths give z = 0, a constant α/2 penalty: with mean-centred
    advantages (Dr. GRPO, the default here) it shrinks the correct-vs-wrong advantage gap by (1 - α/2);
    only std-scaled advantages cancel it. α in the paper: 0.05 - 0.4. Unlike :func:`length_bonus` this
    is a *penalty* on all correct rollouts, computed from the verifier's correctness, not from the advantage sign.

    Shapes: all ``(B,)`` (``correct`` bool); returns ``(B,)`` float.
    """
    B = rewards.shape[0]
    if not (correct.shape == lengths.shape == group.shape == (B,)):
        raise ValueError("rewards, correct, lengths, group must all be (B,)")
    if not 0 <= alpha < 1:
        raise ValueError(f"alpha must be in [0, 1), got {alpha}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    c = correct.bool()  # (B,)
    if alpha == 0 or not bool(c.any()):
        return rewards.to(out_dtype).clone()
    z = _subset_length_z(lengths, group, c, ddof=0, eps=eps)  # (B,) population std over C
    factor = torch.where(c, 1.0 - alpha * torch.sigmoid(z), torch.ones_like(z))  # (B,)
    return (rewards.to(torch.float64) * factor).to(out_dtype)


def pass_rate_filter(pass_rates: Tensor, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Data-profiling keep mask: ``low < pass_rate < high`` (strict), i.e. drop prompts solved by none or
    by all of the profiling samples (their GRPO advantages would be all zero).

    Shape: ``(P,)`` → ``(P,)`` bool. ``pass_rates`` may also be ``(P, n)`` 0/1 correctness, averaged over
    the samples first.
    """
    p = pass_rates.to(torch.float64)
    if p.ndim == 2:
        p = p.mean(dim=1)  # (P,)
    return (p > low) & (p < high)
