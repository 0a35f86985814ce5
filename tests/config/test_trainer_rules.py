"""lit_rl/config/trainer_rules.py: the Trainer options Lightning accepts but a run would die on."""

from __future__ import annotations

import pytest


def test_val_check_interval_zero_is_refused_when_the_trainer_is_built():
    """The same rule guards a trainer built without the preflight (``LitRLCLI`` in code, sweeps' trial runs)."""
    from lit_rl.config.trainer_rules import check_trainer_args
    from lit_rl.errors import FieldError

    check_trainer_args(val_check_interval=1)
    check_trainer_args(val_check_interval=0.5)
    for bad in (0, -2, 1.5, 0.0):
        with pytest.raises(FieldError, match="val_check_interval"):
            check_trainer_args(val_check_interval=bad)
