"""Lightning callbacks: format warm-up, Pass@k checkpoint evaluation, length and reward tracking."""

from callbacks.progress import RolloutProgressBar
from callbacks.warmup import FormatWarmup

__all__ = ["FormatWarmup", "RolloutProgressBar"]
