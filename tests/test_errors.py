"""Tests lit_rl/errors.py."""

from __future__ import annotations

from lit_rl.errors import FieldError


def test_field_error_names_its_argument_first():
    err = FieldError("steps", "must be >= 1, got 0")
    assert str(err) == "steps: must be >= 1, got 0"
    assert (err.field, err.problem) == ("steps", "must be >= 1, got 0")  # what the preflight re-locates
    assert isinstance(err, ValueError)  # the settings' tests and callers catch ValueError


def test_one_line_cuts_at_a_sentence_or_a_word_never_mid_word():
    from lit_rl.errors import one_line

    notice = ("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. Please migrate to a "
              "database backend. See https://mlflow.org/docs/latest/self-hosting/migrate-from-file-store\nsecond")
    assert one_line(notice, 120) == ("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. "
                                     "Please migrate to a database backend. …")  # was cut at "See htt"
    assert one_line("alpha beta gamma delta", 12) == "alpha beta…"
    assert one_line("x" * 20, 10) == "x" * 9 + "…"  # one word longer than the limit: cut, marked
    assert one_line("short\nmore", 10) == "short" and one_line("", 10) == ""
    assert one_line(notice, 100) == "The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. …"
