"""Optimizer and LR-schedule factories that LightningCLI can build from YAML, and the modules' default optimizers.

The defaults (used when a config sets no ``model.init_args.optimizer``; every shipped top-level config sets one):

=====================  ===================================================  ===========================================
factory                AdamW                                                used by
=====================  ===================================================  ===========================================
:func:`rl_adamw`       lr 1e-6, betas (0.9, 0.99), weight decay 0            ``RLModule`` (a new module's default)
:func:`erils_adamw`    lr 3e-6, betas (0.9, 0.99), weight decay 0.1          ``ERILSModule``, ``DenoisingSFT`` (ERILS
                                                                             Table VIII)
:func:`grpo_adamw`     lr 1e-6, betas (0.9, 0.999), weight decay 0           ``DoubleRolloutGRPO`` (torch's betas)
=====================  ===================================================  ===========================================
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from lit_rl.errors import FieldError


def rl_adamw(params: Iterable) -> Optimizer:
    """AdamW lr 1e-6, betas (0.9, 0.99), no weight decay (module docstring)."""
    return torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0)


def erils_adamw(params: Iterable) -> Optimizer:
    """AdamW lr 3e-6, betas (0.9, 0.99), weight decay 0.1: ERILS Table VIII (module docstring)."""
    return torch.optim.AdamW(params, lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1)


def grpo_adamw(params: Iterable) -> Optimizer:
    """AdamW lr 1e-6, betas (0.9, 0.999), no weight decay (module docstring)."""
    return torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0)


class ConstantWithWarmup(LambdaLR):
    """Linear warm-up from 0 over ``warmup_steps`` optimizer steps, then a constant LR (ERILS Table VIII).

    Args:
        optimizer: the wrapped optimizer.
        warmup_steps: number of warm-up optimizer steps (0: constant from the start).
    """

    @staticmethod
    def check_args(warmup_steps: int = 0) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if warmup_steps < 0:
            raise FieldError("warmup_steps", f"must be >= 0, got {warmup_steps}")

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 0) -> None:
        ConstantWithWarmup.check_args(warmup_steps=warmup_steps)
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0)


class WarmupCosine(LambdaLR):
    """Linear warm-up over ``warmup_steps`` optimizer steps (as :class:`ConstantWithWarmup`), then half a cosine
    from the peak LR down to ``min_ratio`` x the peak at ``total_steps``, constant after it.

    The LR factor of optimizer step ``s`` (0-based), with ``w = warmup_steps`` and ``T = total_steps``::

        s < w:  (s + 1) / w
        s >= w: m + (1 - m) * (1 + cos(pi * min(1, (s - w) / (T - w)))) / 2,   m = min_ratio

    Args:
        optimizer: the wrapped optimizer.
        total_steps: the step where the cosine reaches ``min_ratio``; ``None`` (default): the run's
            ``trainer.max_steps``, which the module sets when it builds the optimizer (:meth:`set_total_steps`),
            so a run made longer or shorter on the command line decays over its own length.
        warmup_steps: warm-up optimizer steps (0: the cosine starts at once).
        min_ratio: the final LR as a fraction of the peak, in [0, 1].
    """

    @staticmethod
    def check_args(total_steps: int | None = None, warmup_steps: int = 0, min_ratio: float = 0.0) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if warmup_steps < 0:
            raise FieldError("warmup_steps", f"must be >= 0, got {warmup_steps}")
        if total_steps is not None and total_steps <= warmup_steps:
            raise FieldError("total_steps", f"must be > warmup_steps ({warmup_steps}), got {total_steps}")
        if not 0.0 <= min_ratio <= 1.0:
            raise FieldError("min_ratio", f"must be in [0, 1], got {min_ratio}")

    def __init__(self, optimizer: Optimizer, total_steps: int | None = None, warmup_steps: int = 0,
                 min_ratio: float = 0.0) -> None:
        WarmupCosine.check_args(total_steps=total_steps, warmup_steps=warmup_steps, min_ratio=min_ratio)
        self.total_steps, self.warmup_steps, self.min_ratio = total_steps, warmup_steps, min_ratio
        self.total_from_run = False  # set_total_steps gave total_steps (trainer.max_steps): a resume keeps it
        super().__init__(optimizer, self.factor)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix ``total_steps`` when it was left ``None`` (the module passes ``trainer.max_steps``). A run no longer
        than the warm-up ends inside it, as under :class:`ConstantWithWarmup`."""
        if total_steps is None or total_steps < 0:
            raise FieldError("total_steps", "is unset and trainer.max_steps is unlimited: set one of them (the "
                             "cosine needs to know where it ends)")
        self.total_steps = total_steps  # a run shorter than the warm-up never leaves it (as ConstantWithWarmup)
        self.total_from_run = True
        self._apply_current_lr()

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the step (and the rest of the schedule) from a checkpoint, but keep a ``total_steps`` that this
        run took from its own ``trainer.max_steps``: a run resumed with a larger ``max_steps`` decays over its new
        length instead of training at the old end's LR. The optimizer's LR is set to this step's value at once."""
        own = self.total_steps if self.total_from_run else None
        super().load_state_dict(state_dict)
        if own is not None:
            self.total_steps, self.total_from_run = own, True
            self._apply_current_lr()

    def _apply_current_lr(self) -> None:
        lrs = [base * self.factor(self.last_epoch) for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = lrs

    def factor(self, step: int) -> float:
        """The LR multiplier of optimizer step ``step`` (the formula above; the peak until ``total_steps`` is
        known)."""
        w, T, m = self.warmup_steps, self.total_steps, self.min_ratio
        if step < w:
            return (step + 1) / w
        if T is None:
            return 1.0
        progress = min(1.0, (step - w) / (T - w)) if T > w else 1.0
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))
