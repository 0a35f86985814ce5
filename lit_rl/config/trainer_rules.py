"""lit_rl's rules for Lightning ``Trainer`` options that Lightning itself accepts but cannot run: one home,
called by the config preflight (:mod:`lit_rl.config.preflight`, which adds the file:line) and by the CLI on the
trainer it built (:meth:`lit_rl.lightning_cli.LitRLCLI.instantiate_trainer`)."""

from __future__ import annotations

from typing import Any

from lit_rl.errors import FieldError

__all__ = ["check_trainer_args"]


def check_trainer_args(val_check_interval: Any = None) -> None:
    """Raise :class:`~lit_rl.errors.FieldError` for an option the run would die on.

    ``val_check_interval``: an integer is a number of rollout batches (>= 1; Lightning takes 0 and divides by it
    after the first batch); a float a fraction of an epoch in (0, 1]."""
    v = val_check_interval
    if isinstance(v, bool) or v is None:
        return
    if isinstance(v, int) and v < 1:
        raise FieldError("val_check_interval", f"must be >= 1 rollout batches (or a fraction in (0, 1]), got {v}")
    if isinstance(v, float) and not 0.0 < v <= 1.0:
        raise FieldError("val_check_interval", f"a float is a fraction of an epoch and must be in (0, 1], got {v}")
