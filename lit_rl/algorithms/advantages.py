"""Reward -> advantage processing for mixed on-policy / external rollout groups (ERILS §IV-B).

Spec: docs/erils.md. Every rollout has a reward ``r (B,)``, a ``source (B,)`` (0 = on-policy
from the current dLLM, 1 = external from the fixed pool) and a ``group (B,)`` id (its prompt).

* Source-specific (ERILS Eq. 9, the ERILS default): ``A_on = r_on − mean(r_on of the group)``;
  ``A_ext = r_ext`` (no centring).
* Joint (ERILS Eq. 11–12, the ablation that collapses): ``A = r − mean(r of the whole group)``.
* On-policy only (SPG): Eq. 9's on-policy part; external rollouts are dropped.
* External only: Eq. 9's external part (``A = r``, optionally centred); on-policy rollouts are dropped.

No std division by default (SPG, ERILS); ``scale_std=True`` divides the centred on-policy / joint
advantages by the group's (unbiased) std + ``eps``, as GRPO. A group whose (member) rewards are all equal
gets exactly zero centred advantages, with no division by zero.

NaN rewards (e.g. a TRL reward function returned None): the pure functions raise ``ValueError`` unless the
caller passes ``valid`` to exclude those rows. The processor classes, with ``nan_policy="drop"``
(default), exclude NaN rows from every group mean/std, give them advantage 0 and ``keep = False`` and warn;
with ``nan_policy="raise"`` they raise.
"""

from __future__ import annotations

import warnings

import torch

__all__ = [
    "group_centered",
    "source_specific_advantages",
    "joint_advantages",
    "AdvantageProcessor",
    "SourceSpecific",
    "Joint",
    "OnPolicyOnly",
    "ExternalOnly",
]

ON_POLICY, EXTERNAL = 0, 1


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
    bad = (source != ON_POLICY) & (source != EXTERNAL)
    if bad.any():
        raise ValueError(f"source must hold 0 (on-policy) or 1 (external), got {source[bad].unique().tolist()}")
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    if torch.isnan(rewards[valid]).any():
        raise ValueError("rewards contain NaN; pass valid= to exclude those rollouts (or use nan_policy='drop')")
    return valid


def group_centered(
    rewards: torch.Tensor,
    group: torch.Tensor,
    members: torch.Tensor,
    *,
    scale_std: bool = False,
    eps: float = 1e-4,
) -> torch.Tensor:
    """``r − mean`` (optionally ``/ (std + eps)``) where mean/std run over the ``members`` of each row's group.

    Rows that are not members still get ``r − (their group's member mean)``; a group without members has
    mean 0. A group whose member rewards are all equal gives exactly 0 to its members. Statistics run in
    float64. Shapes: ``rewards, group, members (B,)`` -> ``(B,)``.
    """
    members = members.bool()
    r = torch.where(members, rewards.double(), 0.0)  # (B,) NaN-free on non-members
    _, g = torch.unique(group, return_inverse=True)  # (B,) dense ids
    G = int(g.max()) + 1 if g.numel() else 0
    count = torch.zeros(G, dtype=torch.float64, device=r.device).index_add_(0, g, members.double())  # (G,)
    total = torch.zeros(G, dtype=torch.float64, device=r.device).index_add_(0, g, r)  # (G,)
    mean = total / count.clamp(min=1)  # (G,)
    adv = rewards.double() - mean[g]  # (B,)

    big = torch.finfo(torch.float64).max
    hi = torch.full((G,), -big, dtype=torch.float64, device=r.device).scatter_reduce(
        0, g, torch.where(members, r, -big), reduce="amax"
    )
    lo = torch.full((G,), big, dtype=torch.float64, device=r.device).scatter_reduce(
        0, g, torch.where(members, r, big), reduce="amin"
    )
    constant = (hi <= lo)[g] & members  # (B,) all member rewards equal (exact zero, no rounding residue)
    if scale_std:
        sq = torch.zeros(G, dtype=torch.float64, device=r.device).index_add_(
            0, g, torch.where(members, (r - mean[g]) ** 2, 0.0)
        )
        std = (sq / (count - 1).clamp(min=1)).sqrt()  # (G,) unbiased, as torch.std / TRL
        adv = adv / (std[g] + eps)
    adv = torch.where(constant, 0.0, adv)
    return adv.to(rewards.dtype)


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
    keep ``A = r``. Rows with ``valid == False`` get 0 and are excluded from the means.

    Shapes: ``rewards, source, group, valid (B,)`` -> ``(B,)``.
    """
    valid = _check(rewards, source, group, valid)
    on = (source == ON_POLICY) & valid
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


class AdvantageProcessor:
    """Base for the injectable processors: ``__call__(rewards, source, group) -> (advantages (B,), keep (B,))``.

    ``keep`` is False for rollouts the variant drops (and for NaN rewards under ``nan_policy="drop"``); their
    advantage is 0. Callers should leave ``keep == False`` rows out of the loss.
    """

    def __init__(self, scale_std: bool = False, eps: float = 1e-4, nan_policy: str = "drop") -> None:
        if nan_policy not in ("drop", "raise"):
            raise ValueError(f"nan_policy must be 'drop' or 'raise', got {nan_policy!r}")
        self.scale_std = scale_std
        self.eps = eps
        self.nan_policy = nan_policy

    def _valid(self, rewards: torch.Tensor) -> torch.Tensor:
        nan = torch.isnan(rewards)
        if nan.any():
            if self.nan_policy == "raise":
                raise ValueError(f"{int(nan.sum())} NaN reward(s) at rows {nan.nonzero().squeeze(-1).tolist()}")
            warnings.warn(f"dropping {int(nan.sum())} rollout(s) with NaN reward", RuntimeWarning, stacklevel=3)
        return ~nan

    def __call__(
        self, rewards: torch.Tensor, source: torch.Tensor, group: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale_std={self.scale_std}, eps={self.eps}, nan_policy={self.nan_policy!r})"


class SourceSpecific(AdvantageProcessor):
    """ERILS (Eq. 9): on-policy centred within its own on-policy group, external ``A = r``; keeps all."""

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards)
        adv = source_specific_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        return adv, valid


class Joint(AdvantageProcessor):
    """Joint processing (Eq. 11): one mean over on-policy and external members of the group; keeps all."""

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards)
        adv = joint_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        return adv, valid


class OnPolicyOnly(AdvantageProcessor):
    """SPG baseline: on-policy rows centred within their group; external rows dropped (``keep = False``)."""

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards) & (source == ON_POLICY)
        adv = source_specific_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        return adv, valid


class ExternalOnly(AdvantageProcessor):
    """External rollouts only, ``A = r`` (Eq. 9's external part); ``center=True`` centres them within their
    group instead (``scale_std`` then applies). On-policy rows dropped (``keep = False``)."""

    def __init__(self, center: bool = False, scale_std: bool = False, eps: float = 1e-4, nan_policy: str = "drop"):
        super().__init__(scale_std=scale_std, eps=eps, nan_policy=nan_policy)
        self.center = center

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards) & (source == EXTERNAL)
        if self.center:
            adv = joint_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        else:
            adv = source_specific_advantages(rewards, source, group, valid=valid)
        return adv, valid
