"""Tests lit_rl/sweep/space.py."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from lit_rl.sweep.errors import SweepConfigError
from lit_rl.sweep.space import ParamSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_grid_values_take_the_grid_the_choices_or_every_int_step_up_to_high():
    assert ParamSpec("k", "int", low=2, high=9, step=3).grid_values() == [2, 5, 8]
    assert ParamSpec("k", "int", low=1, high=3).grid_values() == [1, 2, 3]  # high is inclusive
    assert ParamSpec("k", "int", low=1, high=16, grid=[1, 4, 16]).grid_values() == [1, 4, 16]
    assert ParamSpec("r", "float", low=0.5, high=0.99, grid=[0.99, 0.5]).grid_values() == [0.99, 0.5]
    assert ParamSpec("c", "categorical", choices=["a", None, 3]).grid_values() == ["a", None, 3]
    with pytest.raises(ValueError, match=r"^space\.r: a float parameter needs `grid: \[\.\.\.\]`"):
        ParamSpec("r", "float", low=0.5, high=0.99).grid_values()


def test_suggest_asks_optuna_for_the_declared_distribution():
    specs = [ParamSpec("i", "int", low=2, high=8, step=3), ParamSpec("li", "int", low=1, high=64, log=True),
             ParamSpec("f", "float", low=0.5, high=1.0, step=0.25),
             ParamSpec("lf", "float", low=1e-4, high=1e-2, log=True), ParamSpec("c", "categorical", choices=["a", "b"])]
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    values = {s.name: s.suggest(trial) for s in specs}
    assert trial.distributions == {
        "i": IntDistribution(2, 8, step=3), "li": IntDistribution(1, 64, log=True),
        "f": FloatDistribution(0.5, 1.0, step=0.25), "lf": FloatDistribution(1e-4, 1e-2, log=True),
        "c": CategoricalDistribution(["a", "b"])}
    assert values["i"] in (2, 5, 8) and values["f"] in (0.5, 0.75, 1.0) and values["c"] in ("a", "b")


def test_a_bad_spec_is_located_at_the_key_that_is_wrong():
    def key_of(**kwargs):
        with pytest.raises(SweepConfigError) as info:
            ParamSpec("p", **kwargs)
        return info.value.key, str(info.value)

    assert key_of(type="float", low=1.0, high=0.5) == (
        ("space", "p", "low"), "space.p: needs low <= high for a float parameter, got low=1.0, high=0.5")
    assert key_of(type="categorical", choices=["a"], low=0) == (
        ("space", "p", "low"), "space.p.low: applies to float and int parameters only (this one is categorical)")
    assert key_of(type="float", low=0.1, high=1.0, choices=[0.1]) == (
        ("space", "p", "choices"), "space.p.choices: applies to categorical parameters only (this one is float)")
    assert key_of(type="float", low=0.1, high=1.0, log=True, step=0.1) == (
        ("space", "p", "step"),
        "space.p.step: cannot be combined with log: true (Optuna samples a log scale without a step)")
    ParamSpec("p", "int", low=1, high=8, log=True, step=1)  # the one step a log scale allows
    assert key_of(type="categorical", choices=[["a"]]) == (
        ("space", "p", "choices"), "space.p.choices: values must be numbers, strings, booleans or null, got ['a']")
