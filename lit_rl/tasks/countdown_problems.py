"""Countdown problems: the exhaustive solver, the problem generator and every expression of three numbers.

Kept apart from :mod:`lit_rl.tasks.countdown` (the task: data, reward, evaluation) so that the scripted
traces (:mod:`lit_rl.tasks.scripted`) can enumerate expressions without the task's data files.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from fractions import Fraction
from typing import Sequence

from lit_rl.tasks.countdown_arith import safe_eval

NUMBER_RANGE = (1, 100)
TARGET_RANGE = (1, 100)
TOLERANCE = 1e-5

# -- solver / generator -------------------------------------------------------------------------------------

_OPS = ("+", "-", "*", "/")


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _strip_outer(expr: str) -> str:
    return expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr


def solve(numbers: Sequence[int], target: int | float) -> str | None:
    """An expression using every number exactly once with ``+ - * /`` that equals ``target``, or ``None``.

    Exhaustive search over orders, operators and bracketings with exact fractions (fine for up to ~5
    numbers). The returned text passes the task's own verifier.

    >>> solve([30, 100, 93], 23)
    '93 + (30 - 100)'
    >>> solve([1, 1, 1], 100) is None
    True
    """
    items = [(Fraction(int(n)), str(int(n))) for n in numbers]
    if not items:
        return None
    goal = Fraction(target).limit_denominator(10**9) if isinstance(target, float) else Fraction(int(target))
    found = _search(tuple(items), goal)
    if found is None:
        return None
    expr = _strip_outer(found)
    value = safe_eval(expr)
    return expr if value is not None and abs(value - float(goal)) < TOLERANCE else None


def _search(items: tuple[tuple[Fraction, str], ...], goal: Fraction) -> str | None:
    if len(items) == 1:
        return items[0][1] if items[0][0] == goal else None
    for i, j in itertools.permutations(range(len(items)), 2):
        (a, ea), (b, eb) = items[i], items[j]
        rest = tuple(items[k] for k in range(len(items)) if k not in (i, j))
        for op in _OPS:
            if op in "+*" and i > j:  # commutative: the other order is tried already
                continue
            v = _apply(op, a, b)
            if v is None:
                continue
            found = _search(rest + ((v, f"({ea} {op} {eb})"),), goal)
            if found is not None:
                return found
    return None


def generate_problem(rng: random.Random, number_range: tuple[int, int] = NUMBER_RANGE,
                     target_range: tuple[int, int] = TARGET_RANGE, max_draws: int = 100_000,
                     ordered: bool = False) -> tuple[list[int], int]:
    """One solvable 3-number problem: three integers uniform in ``number_range`` (repeats allowed), then a
    random expression over them whose exact value is an integer in ``target_range`` becomes the target.
    ``ordered``: the expression keeps the numbers in the order they are given (``a o (b o c)`` or
    ``(a o b) o c``), so every problem has a solution that writes them in the prompt's order; otherwise the
    order is random too. ``ValueError`` when ``max_draws`` draws give none (ranges that no expression connects)."""
    lo, hi = number_range
    for _ in range(max_draws):
        numbers = [rng.randint(lo, hi) for _ in range(3)]
        a, b, c = (Fraction(n) for n in (numbers if ordered else rng.sample(numbers, 3)))
        op1, op2 = rng.choice(_OPS), rng.choice(_OPS)
        if rng.random() < 0.5:
            inner = _apply(op1, a, b)
            value = None if inner is None else _apply(op2, inner, c)
        else:
            inner = _apply(op2, b, c)
            value = None if inner is None else _apply(op1, a, inner)
        if value is not None and value.denominator == 1 and target_range[0] <= value <= target_range[1]:
            return numbers, int(value)
    raise ValueError(f"no expression of numbers in {list(number_range)} hit a target in {list(target_range)} "
                     f"in {max_draws} draws")


def three_number_expressions(numbers: Sequence[int]) -> list[tuple[str, str, Fraction | None]]:
    """Every expression over three numbers, each used once: ``(expression, two-step trace, value)``.

    Orders (6) x operators (16) x bracketings ``(a o b) o c`` / ``a o (b o c)`` (2) = 192 rows, repeats kept.
    The trace writes the inner step, then the outer one: ``"3*4=12;12-5=7"`` (``value`` ``None`` and the
    trace ``""`` when a step divides by zero; non-integers are written as fractions, ``"7/2"``).

    >>> three_number_expressions([3, 4, 5])[0]
    ('3+4+5', '3+4=7;7+5=12', Fraction(12, 1))
    """
    return list(_expressions(tuple(int(n) for n in numbers)))


def in_order(expression: str, numbers: Sequence[int]) -> bool:
    """The expression writes exactly ``numbers``, in the given order (``in_order("5+(9-6)", [5, 9, 6])``)."""
    return re.findall(r"\d+", expression) == [str(int(n)) for n in numbers]


@functools.lru_cache(maxsize=8192)
def _expressions(numbers: tuple[int, ...]) -> tuple[tuple[str, str, Fraction | None], ...]:
    rows: list[tuple[str, str, Fraction | None]] = []
    for a, b, c in itertools.permutations(numbers):
        fa, fb, fc = Fraction(a), Fraction(b), Fraction(c)
        for o1, o2 in itertools.product(_OPS, repeat=2):
            inner = _apply(o1, fa, fb)  # (a o1 b) o2 c
            value = None if inner is None else _apply(o2, inner, fc)
            expr = f"{a}{o1}{b}{o2}{c}" if _left_assoc_ok(o1, o2) else f"({a}{o1}{b}){o2}{c}"
            rows.append((expr, "" if value is None else f"{a}{o1}{b}={_num(inner)};{_num(inner)}{o2}{c}={_num(value)}",
                         value))
            inner = _apply(o2, fb, fc)  # a o1 (b o2 c)
            value = None if inner is None else _apply(o1, fa, inner)
            expr = f"{a}{o1}{b}{o2}{c}" if _right_assoc_ok(o1, o2) else f"{a}{o1}({b}{o2}{c})"
            rows.append((expr, "" if value is None else f"{b}{o2}{c}={_num(inner)};{a}{o1}{_num(inner)}={_num(value)}",
                         value))
    return tuple(rows)


def _num(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def _left_assoc_ok(o1: str, o2: str) -> bool:
    """``(a o1 b) o2 c`` reads the same without brackets: o2 binds no tighter than o1."""
    return o1 in "*/" or o2 in "+-"


def _right_assoc_ok(o1: str, o2: str) -> bool:
    """``a o1 (b o2 c)`` reads the same without brackets: o2 binds tighter, or o1 is + or * over the same kind."""
    return (o2 in "*/" and o1 in "+-") or (o1 == "+" and o2 in "+-") or (o1 == "*" and o2 == "*")
