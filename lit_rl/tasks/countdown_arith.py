"""Safe evaluation of Countdown answers: plain arithmetic only, never ``eval``.

The reference (d1/SPG ``evaluate_equation``) checks the text against ``^[\\d+\\-*/().\\s]+$`` and calls
Python's ``eval``. Here the same text is *parsed* with :func:`ast.parse` (Python's own grammar, so every
syntax error ``eval`` would raise is raised here too; parsing executes nothing) and the tree is walked
with an explicit whitelist:

* numeric literals (``int`` or ``float``; at most :data:`MAX_LITERAL_DIGITS` characters each),
* binary ``+ - * /`` (``/`` is true division, as in Python), unary ``-`` and ``+``, parentheses.

Departures from ``eval``, which only matter for adversarial text: ``**`` and ``//`` (which the character
whitelist lets through) are rejected, as are texts longer than :data:`MAX_EXPR_CHARS`, operator trees deeper
than :data:`MAX_DEPTH`, literals longer than :data:`MAX_LITERAL_DIGITS` and values above
:data:`MAX_ABS_VALUE`; division by zero is "not evaluable" (the
reference's ``eval`` raises and the reward code returns its format score). Arithmetic is done with Python
ints and floats in the same order as ``eval``, so results are bit-identical to the reference.
"""

from __future__ import annotations

import ast
import re
import warnings

MAX_EXPR_CHARS = 1000
"""Longer expressions are not evaluated (a 3-number Countdown answer is ~15 characters)."""
MAX_PAREN_DEPTH = 200
"""Maximum parenthesis nesting (CPython's own parser limit, so ``eval`` fails beyond it too)."""
MAX_DEPTH = 100
"""Maximum syntax-tree depth (operators nested in operators)."""
MAX_LITERAL_DIGITS = 32
"""Maximum characters of one numeric literal."""
MAX_ABS_VALUE = 1e18
"""Intermediate values beyond this magnitude make the expression not evaluable."""

_ALLOWED_CHARS = re.compile(r"^[\d+\-*/().\s]+$")  # the reference whitelist, kept as a first filter


class _Reject(Exception):
    pass


def _paren_depth(expr: str) -> int:
    depth = best = 0
    for ch in expr:
        if ch == "(":
            depth += 1
            best = max(best, depth)
        elif ch == ")":
            depth -= 1
    return best


def _walk(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise _Reject("too deep")
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Reject("not a number")
        return v
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _walk(node.operand, depth + 1)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a = _walk(node.left, depth + 1)
        b = _walk(node.right, depth + 1)
        if isinstance(node.op, ast.Add):
            v = a + b
        elif isinstance(node.op, ast.Sub):
            v = a - b
        elif isinstance(node.op, ast.Mult):
            v = a * b
        else:
            if b == 0:
                raise _Reject("division by zero")
            v = a / b
        if abs(v) > MAX_ABS_VALUE:
            raise _Reject("value too large")
        return v
    raise _Reject(f"{type(node).__name__} not allowed")


def safe_eval(expr: str) -> int | float | None:
    """Value of a plain arithmetic expression, or ``None`` when it is not one (or is out of bounds).

    >>> safe_eval("(49 + 55) - 53"), safe_eval("6/4"), safe_eval("2**3"), safe_eval("1/0")
    (51, 1.5, None, None)
    >>> safe_eval("__import__('os')") is None
    True
    """
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS or not _ALLOWED_CHARS.match(expr):
        return None
    if _paren_depth(expr) > MAX_PAREN_DEPTH:
        return None
    literal = re.search(r"[\d.]{%d,}" % (MAX_LITERAL_DIGITS + 1), expr)
    if literal:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for "(1)(2)"
            # eval() of a string drops leading spaces and tabs; ast.parse would call them an indent
            tree = ast.parse(expr.lstrip(" \t"), mode="eval")
        return _walk(tree.body, 0)
    except (_Reject, SyntaxError, ValueError, TypeError, OverflowError, RecursionError, MemoryError, ZeroDivisionError):
        return None


_INT_RUN = re.compile(r"\d+")


def numbers_in(text: str) -> list[int] | None:
    """Every ``\\d+`` of ``text`` as an int (reference ``validate_equation``); ``None`` if one is unparsable.

    Runs longer than Python's int-string limit (4300 digits) make ``int`` raise, so the reference returns
    "invalid"; returning ``None`` keeps that.
    """
    try:
        return [int(n) for n in _INT_RUN.findall(text)]
    except ValueError:
        return None


def uses_exactly(text: str, numbers: list[int] | tuple[int, ...]) -> bool:
    """Whether the numbers in ``text`` are exactly the multiset ``numbers``."""
    found = numbers_in(text)
    if found is None or len(found) != len(numbers):
        return False
    return sorted(found) == sorted(int(n) for n in numbers)
