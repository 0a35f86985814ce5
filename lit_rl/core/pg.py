"""Policy-gradient math: the token-level clipped policy-gradient loss (GRPO / DAPO / DR), k3 KL, aggregation
and truncation masks (group-relative advantages: :func:`lit_rl.core.advantages.group_centered`).

Pure functions over tensors; no module state. They follow:

* GRPO (Shao et al. 2024, DeepSeekMath §4.1): advantage = reward minus the mean reward of the prompt's
  group, optionally divided by the group standard deviation.
* RLOO (Ahmadian et al. 2024; Kool et al. 2019): leave-one-out baseline, i.e. the mean of the *other*
  rewards of the group.
* PPO (Schulman et al. 2017) clipped surrogate applied per token, with DAPO's (Yu et al. 2025)
  "clip-higher" (asymmetric ``eps_low`` / ``eps_high``), token-level aggregation and overlong filtering.
* k3 KL estimator (Schulman 2020, "Approximating KL divergence"), as used by GRPO:
  ``exp(ref - logp) - (ref - logp) - 1``, an unbiased, non-negative estimate of KL(π_θ || π_ref).

* CISPO (MiniMax-M1, arXiv 2506.13585, §3.1): the importance weight is clipped and its gradient stopped, and
  every token keeps a REINFORCE gradient (:func:`cispo_loss`): no token's update is dropped by the clip.

The objective of :class:`lit_rl.algorithms.losses.ClippedPGLoss` is a parameter (``loss.objective``, a dotted
path): any function with :func:`clipped_pg_loss`'s signature, e.g. :func:`cispo_loss`.

Double-rollout GRPO (DR §2) uses this loss unchanged: the rollout-time log-probs are ``old_logp``
(π_old) for the several optimizer updates made per rollout batch.

Loss aggregation (``aggregation=``), because this choice changes the gradient's weighting:

* ``"token-mean"`` (default; DAPO, TRL ``loss_type="dapo"``): sum of the per-token losses over every valid
  token of the batch divided by the number of valid tokens. Each token weighs the same, so long
  completions are not down-weighted per token.
* ``"seq-mean-token-mean"`` (original GRPO): mean over each sequence's valid tokens, then mean over
  sequences. Each sequence weighs the same, so a token of a long completion weighs less. Sequences with
  no valid token (e.g. dropped by :func:`truncation_mask`) are left out of the outer mean.
* ``"seq-mean-token-sum-norm"`` (Dr. GRPO, Liu et al. 2025): sum over all valid tokens divided by
  ``B * L`` where ``L = mask.shape[1]``. It is a constant normaliser only when callers pad completions to
  the generation limit (``max_new_tokens``); otherwise it changes with the batch's longest completion.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "cispo_loss",
    "clipped_pg_loss",
    "is_truncated",
    "k3_kl",
    "masked_mean",
    "truncation_mask",
]


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is true; 0 where nothing is valid.

    Shape: ``values``, ``mask`` ``(B, L)``; result scalar (``dim=None``) or reduced along ``dim``.
    """
    m = mask.to(values.dtype)
    v = torch.where(mask.bool(), values, torch.zeros_like(values))  # not values * m: inf * 0 is NaN
    if dim is None:
        return v.sum() / m.sum().clamp(min=1)
    return v.sum(dim) / m.sum(dim).clamp(min=1)


def aggregate(per_token: Tensor, mask: Tensor, aggregation: str = "token-mean") -> Tensor:
    """Reduce a per-token loss ``(B, L)`` to a scalar; see the module docstring for the three choices.

    A batch with no valid token gives a zero that is still connected to the graph.
    """
    m = mask.to(per_token.dtype)  # (B, L)
    masked = torch.where(mask.bool(), per_token, torch.zeros_like(per_token))  # (B, L); not * m: inf * 0 = NaN
    if aggregation == "token-mean":
        return masked.sum() / m.sum().clamp(min=1)
    if aggregation == "seq-mean-token-mean":
        tokens = m.sum(dim=1)  # (B,)
        seq = masked.sum(dim=1) / tokens.clamp(min=1)  # (B,)
        has = (tokens > 0).to(per_token.dtype)  # (B,) sequences with no valid token are left out
        return (seq * has).sum() / has.sum().clamp(min=1)
    if aggregation == "seq-mean-token-sum-norm":
        B, L = per_token.shape
        return masked.sum() / max(B * L, 1)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ || π_ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` (≥ 0).

    Shape: ``(B, L)`` → ``(B, L)``.
    """
    d = ref_logp - logp  # (B, L)
    return torch.exp(d) - d - 1


def _check_pg_args(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, ref_logp: Tensor | None,
                   kl_beta: float) -> None:
    """The shape rules :func:`clipped_pg_loss` and :func:`cispo_loss` share."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            "logp, old_logp, mask must share (B, L); got "
            f"{tuple(logp.shape)}, {tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,)={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    if kl_beta > 0 and ref_logp is None:
        raise ValueError("kl_beta > 0 needs ref_logp")


def _k3_at_valid(logp: Tensor, ref_logp: Tensor | None, valid: Tensor) -> Tensor:
    """k3 KL per token ``(B, L)`` on valid tokens (masked positions compare logp with itself: 0); zeros without a
    reference."""
    if ref_logp is None:
        return torch.zeros_like(logp)
    return k3_kl(logp, torch.where(valid, ref_logp.detach(), logp.detach()))


def clipped_pg_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = 0.28,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
    aggregation: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level PPO clipped policy-gradient loss with clip-higher and an optional k3 KL penalty.

    Per valid token t of sequence i, with ``ratio = exp(logp - old_logp)``::

        pg_t = max(-A_i · ratio, -A_i · clip(ratio, 1 - eps_low, 1 + eps_high))
        loss_t = pg_t + kl_beta · k3(logp, ref_logp)

    then reduced with :func:`aggregate`. ``eps_high=None`` means symmetric clipping (``eps_low``).
    DAPO's defaults are ``eps_low=0.2, eps_high=0.28``. On the first update after a rollout
    ``old_logp == logp.detach()``, the ratio is 1 and the gradient equals the REINFORCE gradient.

    Args:
        logp: ``(B, L)`` log-probs of the completion tokens under the current policy (with grad).
        old_logp: ``(B, L)`` rollout-time log-probs (π_old); treated as constants.
        advantages: ``(B,)`` one advantage per sequence, broadcast over its tokens.
        mask: ``(B, L)`` bool/0-1, true on completion tokens that count.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]``.
        ref_logp: ``(B, L)`` reference-policy log-probs; required when ``kl_beta > 0``.
        kl_beta: KL coefficient (GRPO 0.04; DAPO / DR 0.0).
        aggregation: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum-norm"``.

    Returns:
        ``(loss, stats)``: scalar loss, and detached scalar stats, each a masked mean over all valid
        tokens of the batch (independent of ``aggregation``): ``pg_loss``, ``clip_frac`` (tokens where the
        clipped term is the one used, i.e. gradient is zero), ``clip_frac_low`` / ``clip_frac_high`` (ratio
        below / above the range with that side active), ``ratio_mean``, ``kl_mean`` (0 without ref).
    """
    _check_pg_args(logp, old_logp, advantages, mask, ref_logp, kl_beta)
    hi = eps_low if eps_high is None else eps_high
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    valid = mask.bool()  # (B, L)
    # padding / masked-out positions may hold any log-probs: a log-ratio > ~88 there is exp -> inf, and
    # inf * 0 (a masked reduction, or A = 0) is NaN. Their log-ratio is set to 0 before the exp (d1_loss does
    # the same), so the loss and its gradient only ever see valid tokens.
    ratio = torch.exp(torch.where(valid, logp - old_logp.detach(), torch.zeros_like(logp)))  # (B, L)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + hi)  # (B, L)
    pg_unclipped = -adv * ratio  # (B, L)
    pg_clipped = -adv * clipped_ratio  # (B, L)
    pg = torch.maximum(pg_unclipped, pg_clipped)  # (B, L) pessimistic bound
    kl = _k3_at_valid(logp, ref_logp, valid)  # (B, L); 0 at masked positions and without a reference
    per_token = pg + kl_beta * kl if ref_logp is not None and kl_beta != 0 else pg
    loss = aggregate(per_token, mask, aggregation)

    with torch.no_grad():
        active_clip = pg_clipped > pg_unclipped  # (B, L) clipped term chosen → no gradient
        stats = {
            "pg_loss": masked_mean(pg.detach(), mask),
            "clip_frac": masked_mean(active_clip.to(logp.dtype), mask),
            "clip_frac_low": masked_mean((active_clip & (ratio < 1.0 - eps_low)).to(logp.dtype), mask),
            "clip_frac_high": masked_mean((active_clip & (ratio > 1.0 + hi)).to(logp.dtype), mask),
            "ratio_mean": masked_mean(ratio.detach(), mask),
            "kl_mean": masked_mean(kl.detach(), mask),
        }
    return loss, stats


def is_truncated(completion_ids: Tensor, mask: Tensor, eos_ids: int | Sequence[int]) -> Tensor:
    """Which completions ended without an end token, i.e. hit the generation limit.

    A completion counts as truncated when none of its valid tokens is in ``eos_ids``. This holds when
    generation stops only at an end token or at ``max_new_tokens``; a backend that also stops on stop
    *strings* should pass those strings' final token ids too, or compute the flag itself.

    Shape: ``completion_ids``, ``mask`` ``(B, L)`` → ``(B,)`` bool.
    """
    eos = torch.as_tensor([eos_ids] if isinstance(eos_ids, int) else list(eos_ids), device=completion_ids.device)
    has_eos = (torch.isin(completion_ids, eos) & mask.bool()).any(dim=1)  # (B,)
    return ~has_eos


def truncation_mask(
    completion_ids: Tensor,
    mask: Tensor,
    eos_ids: int | Sequence[int],
    enabled: bool = True,
) -> Tensor:
    """DAPO overlong filtering: zero the loss mask of completions that hit max tokens without EOS.

    Such completions carry a reward for an unfinished answer; masking them keeps that noise out of the
    gradient (their rewards still enter the group baseline, which is computed before). With
    ``enabled=False`` the mask is returned unchanged, so the choice can be a config flag.

    Shape: ``(B, L)`` → ``(B, L)`` with ``mask``'s dtype.
    """
    if not enabled:
        return mask
    keep = ~is_truncated(completion_ids, mask, eos_ids)  # (B,)
    return mask * keep.unsqueeze(1).to(mask.dtype)  # (B, L)


def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = 0.28,
    ref_logp: Tensor | None = None,
    kl_beta: float = 0.0,
    aggregation: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO's loss (MiniMax-M1, arXiv 2506.13585, eq. 4-5): per valid token of sequence i::

        w_t = sg(clip(ratio_t, 1 - eps_low, 1 + eps_high))        ratio_t = exp(logp_t - old_logp_t)
        loss_t = -w_t · A_i · logp_t + kl_beta · k3(logp_t, ref_logp_t)

    then :func:`aggregate` (the paper's is token-level, ``"token-mean"``). Unlike the PPO clip of
    :func:`clipped_pg_loss`, a token outside the range keeps its gradient (scaled by the clipped weight); the paper
    sets no lower bound in practice (``eps_low`` 1 clips the weight at 0 from below) and tunes ``eps_high``. On the
    first update after a rollout the weight is 1 and the gradient is REINFORCE's, as for the PPO clip.

    Shapes and arguments as :func:`clipped_pg_loss`; the stats have the same keys (``clip_frac``: tokens whose
    weight was clipped; ``pg_loss``: the mean of ``-w·A·logp``).
    """
    _check_pg_args(logp, old_logp, advantages, mask, ref_logp, kl_beta)
    hi = eps_low if eps_high is None else eps_high
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    valid = mask.bool()  # (B, L)
    ratio = torch.exp(torch.where(valid, logp.detach() - old_logp.detach(), torch.zeros_like(logp)))  # (B, L)
    weight = ratio.clamp(1.0 - eps_low, 1.0 + hi)  # (B, L) constant: no gradient through the weight
    safe_logp = torch.where(valid, logp, torch.zeros_like(logp))  # padding may hold -inf: 0 there, as the mask
    pg = -adv * weight * safe_logp  # (B, L)
    kl = _k3_at_valid(logp, ref_logp, valid)  # (B, L); 0 at masked positions and without a reference
    per_token = pg + kl_beta * kl if ref_logp is not None and kl_beta != 0 else pg
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        low, high = ratio < 1.0 - eps_low, ratio > 1.0 + hi  # (B, L)
        stats = {
            "pg_loss": masked_mean(pg.detach(), mask),
            "clip_frac": masked_mean((low | high).to(logp.dtype), mask),
            "clip_frac_low": masked_mean(low.to(logp.dtype), mask),
            "clip_frac_high": masked_mean(high.to(logp.dtype), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "kl_mean": masked_mean(kl.detach(), mask),
        }
    return loss, stats
