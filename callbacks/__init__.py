"""Lightning callbacks: format warm-up, Pass@k checkpoint evaluation, length and reward tracking."""

from callbacks.warmup import FormatWarmup

__all__ = ["FormatWarmup"]
