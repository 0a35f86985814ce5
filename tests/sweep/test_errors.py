"""Tests lit_rl/sweep/errors.py."""

from __future__ import annotations

import pytest

from lit_rl.errors import ConfigError
from lit_rl.sweep.errors import ObjectiveNotLoggedError, SweepConfigError, _bad, _is_int, _is_num, _unknown


def test_bad_joins_the_key_and_locates_the_line_by_at():
    err = _bad(("space", "lr"), "needs low <= high")
    assert isinstance(err, SweepConfigError) and isinstance(err, ConfigError) and isinstance(err, ValueError)
    assert str(err) == "space.lr: needs low <= high" and err.key == ("space", "lr")
    err = _bad(("space", "lr"), "needs low <= high", at=("space", "lr", "low"))
    assert str(err) == "space.lr: needs low <= high" and err.key == ("space", "lr", "low")
    assert str(_bad((), "no key")) == "no key" and _bad((), "no key").key == ()
    # the class default is not shared with the instances _bad fills in
    assert SweepConfigError.key == () and ObjectiveNotLoggedError.key == ("objective", "metric")
    assert issubclass(ObjectiveNotLoggedError, SweepConfigError)


def test_numbers_are_not_booleans():
    assert [_is_int(v) for v in (3, -1, True, False, 3.0, "3", None)] == [True, True, False, False, False, False, False]
    assert [_is_num(v) for v in (3, 2.5, float("inf"), True, "2.5", None)] == [True, True, True, False, False, False]


def test_unknown_names_the_likely_fix_or_the_allowed_keys():
    _unknown(("sampler",), ["name", "seed"], ("name", "seed"))  # all allowed: nothing raised
    with pytest.raises(SweepConfigError, match=r"^sampler: unknown key 'sed' \(did you mean 'seed'\?\)$") as info:
        _unknown(("sampler",), ["name", "sed"], ("name", "seed"))
    assert info.value.key == ("sampler", "sed")  # the line of the wrong key, not of its parent
    with pytest.raises(SweepConfigError, match=r"^sampler: unknown key 'xyz' \(allowed: name, seed\)$"):
        _unknown(("sampler",), ["xyz"], ("name", "seed"))
