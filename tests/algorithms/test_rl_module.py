"""The shared optimisation skeleton: both algorithms inherit it and differ only in their loss/advantages.
(Its NaN guard is exercised end to end in tests/robustness/test_nan_guards.py, its greedy evaluation in
the fit tests of both modules.)"""

from __future__ import annotations

import pytest

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO
from lit_rl.algorithms.erils import ERILSModule
from lit_rl.algorithms.rl_module import RLModule
from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import TinyCausalLM

SHARED = ("configure_optimizers", "optimizer_update", "on_validation_epoch_start", "validation_step",
          "on_validation_epoch_end", "test_step")


@pytest.mark.parametrize("cls", [ERILSModule, DoubleRolloutGRPO])
def test_both_modules_use_the_shared_skeleton(cls):
    assert issubclass(cls, RLModule)
    assert not [name for name in SHARED if name in vars(cls)]  # nothing re-implemented


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"updates_per_batch": 0}, "updates_per_batch: must be >= 1"),
        ({"micro_batch_size": 0}, "micro_batch_size: must be >= 1 or null"),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips: must be >= 1"),
    ],
)
def test_constructor_checks_name_the_field(kwargs, message):
    tiny = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    with pytest.raises(ValueError, match=message):
        ERILSModule(TinyDiffusionLM(**tiny), **kwargs)
    with pytest.raises(ValueError, match=message):
        DoubleRolloutGRPO(TinyCausalLM(**tiny), **kwargs)
