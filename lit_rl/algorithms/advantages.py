"""Advantage processors for mixed on-policy / external rollout groups (ERILS §IV-B): the injectable classes
``SourceSpecific`` (ERILS Eq. 9), ``Joint`` (Eq. 11), ``OnPolicyOnly`` (SPG), ``ExternalOnly``.

The math is :mod:`lit_rl.core.advantages`. No std division by default (SPG, ERILS);
``scale_std=True`` divides the centred on-policy / joint advantages by the group's (unbiased) std + ``eps``.
NaN rewards: with ``nan_policy="drop"`` (default) those rows are excluded from every group mean/std, get
advantage 0 and ``keep = False``, with a warning; with ``nan_policy="raise"`` they raise.
"""

from __future__ import annotations

import warnings

import torch

from lit_rl.algorithms.processors import Processor
from lit_rl.errors import FieldError
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.core.sources import rows_where
from lit_rl.core.advantages import (
    joint_advantages,
    source_specific_advantages,
)

__all__ = [
    "AdvantageProcessor",
    "SourceSpecific",
    "Joint",
    "OnPolicyOnly",
    "ExternalOnly",
]


class AdvantageProcessor(Processor):
    """Base of ERILS's processors: ``__call__(rewards, source, group) -> (advantages (B,), keep (B,))``, and as a
    pipeline stage (:mod:`lit_rl.algorithms.processors`) ``process(rollouts, batch)``, which sets them on the rows.

    ``keep`` is False for rollouts the variant drops (and for NaN rewards under ``nan_policy="drop"``); their
    advantage is 0. The loss leaves ``keep == False`` rows out.
    """

    @staticmethod
    def check_args(nan_policy: str = "drop") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if nan_policy not in ("drop", "raise"):
            raise FieldError("nan_policy", f"must be 'drop' or 'raise', got {nan_policy!r}")

    def __init__(self, scale_std: bool = False, eps: float = 1e-4, nan_policy: str = "drop") -> None:
        AdvantageProcessor.check_args(nan_policy=nan_policy)
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

    def process(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        adv, keep = self(rollouts.rewards, rollouts.source, rollouts.group)  # (N,), (N,)
        return rollouts.with_advantages(adv, keep)

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
    """SPG baseline: on-policy rows centred within their group; external rows dropped (``keep = False``).
    Double rollout's ``CONTINUATION`` rows (a policy decode from the policy's own cut) count as on-policy."""

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards) & rows_where(source, decoded=True)
        adv = source_specific_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        return adv, valid


class ExternalOnly(AdvantageProcessor):
    """External rollouts only, ``A = r`` (Eq. 9's external part); ``center=True`` centres them within their
    group instead (``scale_std`` then applies). On-policy rows dropped (``keep = False``)."""

    def __init__(self, center: bool = False, scale_std: bool = False, eps: float = 1e-4, nan_policy: str = "drop"):
        super().__init__(scale_std=scale_std, eps=eps, nan_policy=nan_policy)
        self.center = center

    def __call__(self, rewards, source, group):
        valid = self._valid(rewards) & rows_where(source, decoded=False)
        if self.center:
            adv = joint_advantages(rewards, source, group, scale_std=self.scale_std, eps=self.eps, valid=valid)
        else:
            adv = source_specific_advantages(rewards, source, group, valid=valid)
        return adv, valid
