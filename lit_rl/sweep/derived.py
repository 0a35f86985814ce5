"""Derived sweep keys: a config key computed from the sampled ones (``data.init_args.g_on: 6 - g_ext``).

Expressions are evaluated by `simpleeval <https://pypi.org/project/simpleeval/>`_ (no ``eval``: names,
numbers, ``+ - * / // % **``, comparisons, ``a if c else b`` and the functions ``min max int float round
abs``), with lit_rl's tighter bounds on ``**`` (exponent <= 1000, result <= 4096 bits), string repetition
(10,000 characters) and ``round`` digits, and no ``%`` string formatting, so that no rule can hang or fill
memory. Dotted config keys are the names (``data.init_args.g_ext``), or their last part when unambiguous.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

import simpleeval

from lit_rl.sweep.errors import SweepConfigError, _bad, _is_num

__all__ = ["DerivedRule"]

_MAX_EXPONENT = 1000
_MAX_BITS = 4096  # an integer result of ``**`` (10**1000 has 3,322 bits)
_MAX_STR = 10_000  # a string repeated with ``*``


def _pow(a: Any, b: Any) -> Any:
    if _is_num(b) and abs(b) > _MAX_EXPONENT:
        raise ValueError(f"exponent {b} is too large (|exponent| <= {_MAX_EXPONENT})")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a).bit_length() * b > _MAX_BITS:
        raise ValueError(f"the result of ** would have about {abs(a).bit_length() * b} bits (at most {_MAX_BITS})")
    return a**b


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):
        text, n = (a, b) if isinstance(a, str) else (b, a)
        if isinstance(n, int) and len(text) * n > _MAX_STR:
            raise ValueError(f"a string repeated to more than {_MAX_STR} characters")
    return a * b


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, str):  # '%0999999999d' % 1 would build a gigabyte string
        raise ValueError("string formatting with % is not supported")
    return a % b


def _round(x: Any, ndigits: Any = None) -> Any:
    if _is_num(ndigits) and abs(ndigits) > _MAX_EXPONENT:
        raise ValueError(f"round() digits {ndigits} out of range (|digits| <= {_MAX_EXPONENT})")
    return round(x) if ndigits is None else round(x, ndigits)


_OPERATORS = {
    **simpleeval.DEFAULT_OPERATORS,
    ast.Mult: _mul, ast.Pow: _pow, ast.Mod: _mod, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
}
_FUNCTIONS = {"min": min, "max": max, "int": int, "float": float, "round": _round, "abs": abs}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _names(node: ast.AST) -> list[str]:
    """The parameter names an expression reads, in order (function names excluded)."""
    name = _dotted(node)
    if name is not None:
        return [name]
    children = [c for c in ast.iter_child_nodes(node) if not (isinstance(node, ast.Call) and c is node.func)]
    return [n for c in children for n in _names(c)]


@dataclass
class DerivedRule:
    """A config key computed from the sampled ones, e.g. ``data.init_args.g_on: 6 - data.init_args.g_ext``
    (module docstring). A rule that fails for a sampled point (``6 / (g_ext - 2)`` at ``g_ext=2``) raises
    :class:`~lit_rl.sweep.errors.SweepConfigError` naming the rule and the values."""

    name: str
    expr: str

    def __post_init__(self) -> None:
        key = ("derived", self.name)
        if not isinstance(self.expr, str) and not _is_num(self.expr):
            raise _bad(key, f"must be an expression (a string or a number), got {self.expr!r}")
        try:
            self._tree = ast.parse(str(self.expr), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise _bad(key, f"cannot parse {self.expr!r}: {getattr(e, 'msg', None) or e}") from None
        self._names = list(dict.fromkeys(_names(self._tree)))

    def check_names(self, keys: list[str]) -> None:
        """Every name the rule reads is one of ``keys`` (dotted) or the unambiguous last part of one;
        raises :class:`SweepConfigError` at load time otherwise (not at the first trial)."""
        short: dict[str, list[str]] = {}
        for key in keys:
            short.setdefault(key.rsplit(".", 1)[-1], []).append(key)
        for name in self._names:
            if name not in keys and len(short.get(name, [])) != 1:
                why = "ambiguous" if short.get(name) else "unknown"
                raise _bad(("derived", self.name),
                           f"{why} name {name!r} in {self.expr!r} (known: {', '.join(keys) or 'none'})")

    def __call__(self, params: dict[str, Any]) -> Any:
        short: dict[str, list[str]] = {}
        for key in params:
            short.setdefault(key.rsplit(".", 1)[-1], []).append(key)

        def lookup(name: str) -> Any:
            if name in params:
                return params[name]
            if len(short.get(name, [])) == 1:
                return params[short[name][0]]
            raise _bad(("derived", self.name), f"unknown or ambiguous name {name!r} in {self.expr!r}")

        # each dotted name the rule reads becomes one plain identifier for simpleeval
        values = {f"_v{i}": lookup(n) for i, n in enumerate(self._names)} if self._names else {}
        tree = _Rename({n: f"_v{i}" for i, n in enumerate(self._names)}).visit(
            ast.parse(str(self.expr).strip()).body[0])
        evaluator = simpleeval.SimpleEval(operators=_OPERATORS, functions=_FUNCTIONS, names=values)
        try:
            return evaluator.eval(str(self.expr), previously_parsed=tree)
        except SweepConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - ZeroDivisionError, OverflowError, TypeError, the bounds above, ...
            if isinstance(e, (simpleeval.FeatureNotAvailable, simpleeval.FunctionNotDefined)):
                raise _bad(("derived", self.name), f"unsupported expression in {self.expr!r}: {e}") from None
            used = ", ".join(f"{n}={v!r}" for n, v in zip(self._names, values.values()))
            raise _bad(("derived", self.name),
                       f"{self.expr!r} failed{' for ' + used if used else ''}: {e or type(e).__name__}") from None


class _Rename(ast.NodeTransformer):
    """Replace each dotted name (``Name`` or ``Attribute`` chain) by its plain identifier."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def _swap(self, node: ast.AST) -> ast.AST:
        name = _dotted(node)
        if name is not None and name in self.names:
            return ast.copy_location(ast.Name(id=self.names[name], ctx=ast.Load()), node)
        return self.generic_visit(node)

    visit_Name = _swap  # noqa: N815
    visit_Attribute = _swap  # noqa: N815
