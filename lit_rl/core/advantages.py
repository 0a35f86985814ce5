"""Reward -> advantage math: group centring (GRPO, RLOO, Dr. GRPO, ERILS Eq. 9 and Eq. 11), one function.

Every rollout has a reward ``r (B,)``, a ``group (B,)`` id (its prompt) and, for ERILS, a ``source (B,)``
(:class:`~lit_rl.core.sources.Source`: 0 on-policy, 1 external). Spec: docs/erils.md, docs/double_rollout.md.

* :func:`group_centered`: ``r − mean`` over the *members* of each row's group (every non-NaN row by default),
  optionally the leave-one-out mean (RLOO, Ahmadian et al. 2024) and a division by a std: the group's sample
  std ``+ eps`` (``std_of="group"``; GRPO, Shao et al. 2024, and TRL) or NeMo-RL's rule, the std of the rewards
  the row's baseline averages (``std_of="baseline"``). ``scale_std=False`` (mean-centring only) is Dr. GRPO /
  SPG / ERILS. The DR paper's GRPO baseline is NeMo-RL's, whose configs divide by the std with the
  leave-one-out baseline (``scale_std=True, leave_one_out=True, std_of="baseline"``; docs/double_rollout.md).
* ERILS (§IV-B) source-specific, Eq. 9: ``A_on = r_on − mean(r_on of the group)``, ``A_ext = r_ext``
  (:func:`source_specific_advantages`); joint, Eq. 11-12: one mean over both sources (:func:`joint_advantages`).

A group whose member rewards are all equal gets exactly zero centred advantages (set explicitly: no division
by zero and no round-off residue). Statistics run in float64. NaN rewards (a TRL reward function returned
None): :func:`group_centered` leaves them out of every mean and gives them 0; the ERILS functions raise
unless ``valid`` excludes those rows (their processors in :mod:`lit_rl.algorithms.advantages` do that).
"""

from __future__ import annotations

import torch

from lit_rl.core.sources import describe, known, rows_where

__all__ = [
    "STD_OF",
    "frac_reward_zero_std",
    "group_centered",
    "joint_advantages",
    "source_specific_advantages",
]

STD_OF = ("group", "baseline")
"""The std rules of :func:`group_centered` (``std_of``)."""

def frac_reward_zero_std(rewards: torch.Tensor, group: torch.Tensor) -> float:
    """Share of groups whose rewards are all equal (TRL's ``frac_reward_zero_std``): those rows get zero
    group-centred advantage, so the share says how much of a batch carries no learning signal.

    Shapes: ``rewards (B,)``, ``group (B,)`` ids -> a float in [0, 1] (0 for an empty batch).
    """
    if rewards.numel() == 0:
        return 0.0
    ids, inv = torch.unique(group, return_inverse=True)  # (K,), (B,)
    r = rewards.float()
    hi = torch.full((len(ids),), float("-inf"), device=r.device).scatter_reduce(0, inv, r, "amax")  # (K,)
    lo = torch.full((len(ids),), float("inf"), device=r.device).scatter_reduce(0, inv, r, "amin")  # (K,)
    return float((hi == lo).float().mean())


def _check(rewards: torch.Tensor, source: torch.Tensor, group: torch.Tensor, valid: torch.Tensor | None):
    if rewards.dim() != 1 or source.shape != rewards.shape or group.shape != rewards.shape:
        raise ValueError(
            f"rewards, source and group must all be (B,), got {tuple(rewards.shape)}, "
            f"{tuple(source.shape)}, {tuple(group.shape)}"
        )
    bad = ~known(source)
    if bad.any():
        raise ValueError(f"source must hold a row kind ({describe()}), got {source[bad].unique().tolist()}")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    if torch.isnan(rewards[valid]).any():
        raise ValueError("rewards contain NaN; pass valid= to exclude those rollouts (or use nan_policy='drop')")
    return valid


def group_centered(
    rewards: torch.Tensor,
    group: torch.Tensor,
    members: torch.Tensor | None = None,
    *,
    scale_std: bool = False,
    leave_one_out: bool = False,
    eps: float = 1e-4,
    std_of: str = "group",
    bonus: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r − b`` where ``b`` is the mean reward over the ``members`` of the row's group; with ``scale_std`` also
    divided by a std (``std_of``).

    Args:
        rewards: ``(B,)`` float rewards (NaN = no reward: never a member, advantage 0).
        group: ``(B,)`` integer group ids (any values; rows need not be contiguous or sorted).
        members: ``(B,)`` bool, the rows whose rewards make the baseline (default: every non-NaN row).
            Rows that are not members still get ``r − (their group's member mean)``; a group without
            members has mean 0.
        scale_std: divide by a std (``std_of``): GRPO; ``False``: Dr. GRPO / SPG / ERILS.
        leave_one_out: for members, the mean of the group's *other* members (RLOO), i.e.
            ``n/(n-1)·(r − mean)``; a group of one member gets 0.
        eps: added to the std before dividing (TRL's 1e-4; NeMo-RL's 1e-6).
        std_of: which std (``scale_std`` only):

            * ``"group"`` (default): the members' sample std (Bessel-corrected, as ``torch.std`` and TRL), every
              row divided by ``std + eps``;
            * ``"baseline"``: NeMo-RL's rule (``calculate_baseline_and_std_per_prompt`` in
              ``nemo_rl/algorithms/utils.py`` and ``GRPOAdvantageEstimator`` in
              ``nemo_rl/algorithms/advantage_estimator.py``): ``σ_i`` = the sample std (Bessel-corrected) of
              the rewards row i's baseline averages, i.e. the *other* members under ``leave_one_out`` and all
              members otherwise, 0 when that set has fewer than two rewards; rows with ``σ_i > 0`` are divided
              by ``σ_i + eps``, rows with ``σ_i = 0`` keep the unscaled ``r − b``. Under ``leave_one_out`` a
              member that differs from identical others has ``σ_i = 0``: ``[1, 0, 0, 0]`` gives
              ``[1, −1/√3, −1/√3, −1/√3]`` (eps 0). Without ``leave_one_out`` it equals ``"group"`` (σ is 0
              only in a constant group, whose advantages are 0 anyway). ``σ_i = 0`` is decided exactly (the
              others' rewards all equal), not from a round-off variance.
        bonus: ``(B,)`` reward added to the rows *after* the baseline and std are taken from ``rewards``:
            ``A = (r + bonus − b) / σ`` with ``b`` and ``σ`` those of ``rewards`` (the bonus is unscaled where
            no std divides: ``scale_std`` off, or ``σ = 0``); ``None``: none. Double rollout's length bonus
            (:func:`lit_rl.core.double_rollout.length_bonus`) enters this way, so it never lowers another
            row's advantage.

    Returns:
        ``(B,)`` advantages in ``rewards``' dtype; exactly 0 for members of a group whose member rewards are
        all equal (plus their ``bonus``) and for NaN rows.
    """
    if rewards.ndim != 1 or group.shape != rewards.shape:
        raise ValueError(f"rewards and group must both be (B,), got {tuple(rewards.shape)} and {tuple(group.shape)}")
    if std_of not in STD_OF:
        raise ValueError(f"std_of must be one of {STD_OF}, got {std_of!r}")
    if bonus is not None and bonus.shape != rewards.shape:
        raise ValueError(f"bonus must be (B,) like rewards, got {tuple(bonus.shape)}")
    nan = torch.isnan(rewards)  # (B,)
    members = ~nan if members is None else members.bool() & ~nan
    r64 = torch.where(nan, 0.0, rewards.double())  # (B,)
    r = torch.where(members, r64, 0.0)  # (B,) member rewards
    _, g = torch.unique(group, return_inverse=True)  # (B,) dense ids
    G = int(g.max()) + 1 if g.numel() else 0
    zeros = torch.zeros(G, dtype=torch.float64, device=r.device)
    count = zeros.clone().index_add_(0, g, members.double())  # (G,)
    total = zeros.clone().index_add_(0, g, r)  # (G,)
    mean = total / count.clamp(min=1)  # (G,)
    adv = r64 - mean[g]  # (B,)
    big = torch.finfo(torch.float64).max
    hi = torch.full((G,), -big, dtype=torch.float64, device=r.device).scatter_reduce(
        0, g, torch.where(members, r, -big), reduce="amax"
    )
    lo = torch.full((G,), big, dtype=torch.float64, device=r.device).scatter_reduce(
        0, g, torch.where(members, r, big), reduce="amin"
    )
    if leave_one_out:
        n = count[g]  # (B,)
        loo = torch.where(n > 1, adv * n / (n - 1).clamp(min=1), torch.zeros_like(adv))
        adv = torch.where(members, loo, adv)
    scale = torch.ones_like(adv)  # (B,) the divisor of the bonus
    if scale_std:
        sq = zeros.clone().index_add_(0, g, torch.where(members, (r - mean[g]) ** 2, 0.0))  # (G,)
        if std_of == "group":
            std = (sq / (count - 1).clamp(min=1)).sqrt()  # (G,) sample std; 0 for groups of one
            adv = adv / (std[g] + eps)
            scale = torch.where(std[g] > 0, std[g] + eps, scale)
        else:
            sigma = _baseline_std(r64, g, members, count, mean, sq, hi, lo, leave_one_out)  # (B,)
            adv = torch.where(sigma > 0, adv / (sigma + eps), adv)
            scale = torch.where(sigma > 0, sigma + eps, scale)
    constant = (hi <= lo)[g] & members  # (B,) all member rewards equal (exact zero, no rounding residue)
    adv = torch.where(constant | nan, 0.0, adv)
    if bonus is not None:
        adv = torch.where(nan, 0.0, adv + bonus.double() / scale)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype())


def _baseline_std(
    r64: torch.Tensor,
    g: torch.Tensor,
    members: torch.Tensor,
    count: torch.Tensor,
    mean: torch.Tensor,
    sq: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    leave_one_out: bool,
) -> torch.Tensor:
    """NeMo-RL's ``σ_i`` (:func:`group_centered`, ``std_of="baseline"``): the sample std of the rewards row i's
    baseline averages. Shapes: ``r64, g, members (B,)``; ``count, mean, sq`` (member count, mean and sum of
    squared deviations per group), ``hi, lo`` (member max and min) ``(G,)`` -> ``(B,)`` float64.

    Leaving member i out of a group of ``n`` (mean ``μ``, ``Q = Σ (r − μ)²``) leaves ``m = n − 1`` rewards with
    ``Σ (r_j − b_i)² = Q − (r_i − μ)²·n/(n − 1)``. The others are all equal (``σ_i = 0`` exactly) when the group
    is constant or row i is the only one on its side of a two-valued group.
    """
    n = count[g]  # (B,)
    others = members if leave_one_out else torch.zeros_like(members)  # (B,) rows whose set leaves them out
    d = r64 - mean[g]  # (B,)
    ss = torch.where(others, sq[g] - d**2 * n / (n - 1).clamp(min=1), sq[g])  # (B,)
    m = torch.where(others, n - 1, n)  # (B,) size of the set
    sigma = (ss.clamp(min=0) / (m - 1).clamp(min=1)).sqrt()  # (B,)
    at_hi, at_lo = members & (r64 == hi[g]), members & (r64 == lo[g])  # (B,)
    n_hi = torch.zeros_like(count).index_add_(0, g, at_hi.double())[g]  # (B,) members at the group max
    n_lo = torch.zeros_like(count).index_add_(0, g, at_lo.double())[g]  # (B,) members at the group min
    alone = others & ((at_hi & (n_hi == 1) & (n_lo == n - 1)) | (at_lo & (n_lo == 1) & (n_hi == n - 1)))  # (B,)
    flat = (hi <= lo)[g] | alone | (m < 2)  # (B,) the set has no spread
    return torch.where(flat, torch.zeros_like(sigma), sigma)


def source_specific_advantages(
    rewards: torch.Tensor,
    source: torch.Tensor,
    group: torch.Tensor,
    *,
    scale_std: bool = False,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """ERILS Eq. 9: on-policy rows centred by the mean of their group's on-policy rows only; external rows
    keep ``A = r``. Rows with ``valid == False`` get 0 and are excluded from the means. A continuation row
    (double rollout's rebuilt rows, ``Source.CONTINUATION``) is the policy's own decode and counts as on-policy:
    the rows centred are the kinds with ``centred`` (:data:`lit_rl.core.sources.KINDS`).

    Shapes: ``rewards, source, group, valid (B,)`` -> ``(B,)``.
    """
    valid = _check(rewards, source, group, valid)
    on = rows_where(source, centred=True) & valid
    a_on = group_centered(rewards, group, on, scale_std=scale_std, eps=eps)
    adv = torch.where(on, a_on, rewards)
    return torch.where(valid, adv, torch.zeros_like(adv))


def joint_advantages(
    rewards: torch.Tensor,
    source: torch.Tensor,
    group: torch.Tensor,
    *,
    scale_std: bool = False,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """ERILS Eq. 11: every row centred by the mean over all (valid) members of its group, both sources.

    Shapes: ``rewards, source, group, valid (B,)`` -> ``(B,)``.
    """
    valid = _check(rewards, source, group, valid)
    adv = group_centered(rewards, group, valid, scale_std=scale_std, eps=eps)
    return torch.where(valid, adv, torch.zeros_like(adv))
