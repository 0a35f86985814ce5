"""Reliability, as one import: durable checkpoint writes and RNG state (:mod:`lit_rl.checkpoint_io`), the
config preflight (:mod:`lit_rl.config`), and lit_rl's user-facing errors (:mod:`lit_rl.errors`).

Configs name ``lit_rl.reliability.AtomicCheckpointIO`` (``trainer.plugins``); that path stays.
"""

from lit_rl.checkpoint_io import AtomicCheckpointIO, atomic_torch_save, capture_rng_state, restore_rng_state
from lit_rl.config.lines import load_yaml_with_lines
from lit_rl.config.preflight import preflight
from lit_rl.errors import ConfigError, FieldError
from lit_rl.tracking import tracking_uri_problem

__all__ = [
    "AtomicCheckpointIO",
    "ConfigError",
    "FieldError",
    "atomic_torch_save",
    "capture_rng_state",
    "load_yaml_with_lines",
    "preflight",
    "restore_rng_state",
    "tracking_uri_problem",
]
