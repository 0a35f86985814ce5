"""Tests lit_rl/sweep/derived.py."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from lit_rl.sweep.derived import DerivedRule
from lit_rl.sweep.errors import SweepConfigError


def test_derived_rules_use_dotted_or_short_names_and_reject_code():
    params = {"data.init_args.g_ext": 2, "model.init_args.rho": 0.9}
    assert DerivedRule("data.init_args.g_on", "6 - data.init_args.g_ext")(params) == 4
    assert DerivedRule("x", "6 - g_ext")(params) == 4
    assert DerivedRule("x", "max(1, round((1 - rho) * 10))")(params) == 1  # round(0.1 * 10) = 1
    assert DerivedRule("x", "1e-4 if g_ext < 3 else 0.1")(params) == 1e-4
    with pytest.raises(ValueError, match="unknown or ambiguous name 'nope'"):
        DerivedRule("x", "nope + 1")(params)
    with pytest.raises(ValueError, match="unsupported expression"):
        DerivedRule("x", "__import__('os')")(params)


def _refuses_quickly(expr: str) -> None:
    """In a forked child (``10**10**10`` is one C call no signal interrupts): exit 0 iff the rule is refused."""
    try:
        DerivedRule("x", expr)({"g_ext": 2})
    except SweepConfigError:
        os._exit(0)
    os._exit(1)


@pytest.mark.parametrize(("expr", "problem"), [
    ("10**10**10", "exponent 10000000000 is too large"),
    ("(10**1000)**1000", "the result of \\*\\* would have about 3322000 bits"),
    ("2 ** -10**9", "exponent -1000000000 is too large"),
    ("'a' * 10**9", "a string repeated to more than"),
    ("'%0999999999d' % g_ext", "string formatting with % is not supported"),
    ("round(g_ext, -10**8)", "round\\(\\) digits -100000000 out of range"),
])
def test_derived_rules_cannot_hang(expr, problem):
    child = multiprocessing.get_context("fork").Process(target=_refuses_quickly, args=(expr,))
    child.start()
    child.join(30)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join()
    assert not alive and child.exitcode == 0, f"{expr!r} ran for 30 s or was not refused (exit {child.exitcode})"
    with pytest.raises(SweepConfigError, match=f"^derived.x: .* failed.*: {problem}"):
        DerivedRule("x", expr)({"g_ext": 2})
    assert DerivedRule("x", "10**3 + 2**10 + round(g_ext / 3, 2)")({"g_ext": 2}) == 1000 + 1024 + 0.67
