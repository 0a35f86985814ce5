"""Tests lit_rl/tasks/math_normalize.py."""

import pytest

from lit_rl.tasks.math_normalize import is_equiv, strip_string


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("x = 3", "3", True),
        ("\\dfrac{1}{2}", "0.5", True),
        ("3\\text{ cm}", "3", True),
        ("10\\%", "10", True),
        ("\\sqrt3", "\\sqrt{3}", True),
        ("90^\\circ", "90", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),
        (".5", "0.5", True),
        ("2", "3", False),
        ("\\frac", "\\frac", True),  # normaliser gives up -> raw equality
        ("\\frac", "\\frac ", False),
        ("1\\text{ a}\\text{ b}", "1\\text{ a}\\text{ b}", True),  # two unit markers: raw equality
        ("a/b", "a/b", True),
    ],
)
def test_is_equiv(a, b, equal):
    assert is_equiv(a, b) is equal


def test_strip_string_examples():
    assert strip_string("\\frac12") == "\\frac{1}{2}"
    assert strip_string("3/4") == "\\frac{3}{4}"
    assert strip_string("k = 7") == "7"
