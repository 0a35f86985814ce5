"""Tests lit_rl/errors.py."""

from __future__ import annotations

from lit_rl.errors import FieldError


def test_field_error_names_its_argument_first():
    err = FieldError("steps", "must be >= 1, got 0")
    assert str(err) == "steps: must be >= 1, got 0"
    assert (err.field, err.problem) == ("steps", "must be >= 1, got 0")  # what the preflight re-locates
    assert isinstance(err, ValueError)  # the settings' tests and callers catch ValueError
