"""Lightning callbacks: format warm-up, Pass@k checkpoint evaluation, length and reward tracking."""

from callbacks.passk import PassAtKEvaluation
from callbacks.progress import RolloutProgressBar
from callbacks.tracking import RolloutTracker
from callbacks.warmup import FormatWarmup

__all__ = ["FormatWarmup", "PassAtKEvaluation", "RolloutProgressBar", "RolloutTracker"]
