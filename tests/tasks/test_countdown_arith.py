"""Tests lit_rl/tasks/countdown_arith.py."""

from lit_rl.tasks.countdown_arith import safe_eval, uses_exactly


def test_safe_eval():
    assert safe_eval("1 + 2 * 3") == 7
    assert safe_eval("(1 + 2) * 3") == 9
    assert safe_eval("7 / 2") == 3.5
    assert safe_eval(" 1+2") == 3  # eval() ignores leading spaces
    for bad in ["2**3", "1/0", "1 2", "abs(1)", "x", "1;2", "[1]", "1 if 1 else 2", "", "(" * 300 + "1" + ")" * 300,
                "-" * 2000 + "1"]:
        assert safe_eval(bad) is None, bad
    assert uses_exactly("(3 + 3) * 4", [3, 4, 3]) and not uses_exactly("3 * 4", [3, 4, 3])
