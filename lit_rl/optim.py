"""Optimizer and LR-schedule factories that LightningCLI can build from YAML."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from lit_rl.errors import FieldError


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
