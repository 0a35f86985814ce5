"""Moved: the durable checkpoint writes are :mod:`lit_rl.checkpoint_io` (configs name
``lit_rl.checkpoint_io.AtomicCheckpointIO`` in ``trainer.plugins``), the preflight :mod:`lit_rl.config`, the
errors :mod:`lit_rl.errors`. The old names still resolve for one release, with a warning (:mod:`lit_rl.deprecation`).
"""

from lit_rl.deprecation import moved_names, old_names

_HOMES = {
    **dict.fromkeys(("AtomicCheckpointIO", "atomic_torch_save", "capture_rng_state", "restore_rng_state"),
                    "lit_rl.checkpoint_io"),
    "load_yaml_with_lines": "lit_rl.config.lines",
    "preflight": "lit_rl.config.preflight",
    "ConfigError": "lit_rl.errors",
    "FieldError": "lit_rl.errors",
    "tracking_uri_problem": "lit_rl.tracking",
}
__getattr__ = moved_names(__name__, _HOMES)
__all__ = old_names(_HOMES)
