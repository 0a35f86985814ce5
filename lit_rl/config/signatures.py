"""Constructor signatures of the classes a config names: arguments, type hints, and a scalar type check."""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any

__all__ = ["import_class", "params", "type_problem"]


# -- class signatures ---------------------------------------------------------------------------------
def import_class(class_path: str) -> Any:
    module, _, attr = class_path.rpartition(".")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def params(cls: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """Accepted keyword parameters of ``cls`` (following ``**kwargs`` up the MRO), their resolved type
    hints, and whether arbitrary keywords are accepted."""
    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    chain = [c for c in cls.__mro__ if c is not object] if isinstance(cls, type) else [cls]
    open_kwargs = True
    for c in chain:
        init = c.__init__ if isinstance(c, type) else c
        if isinstance(c, type) and "__init__" not in vars(c):
            continue
        try:
            sig = inspect.signature(init)
        except (TypeError, ValueError):
            return params, hints, True
        try:
            hints.update({k: v for k, v in typing.get_type_hints(init).items() if k not in hints})
        except Exception:  # noqa: BLE001 - unresolvable annotations: no type checks for them
            pass
        var_kw = False
        for name, p in sig.parameters.items():
            if name == "self" or p.kind == p.VAR_POSITIONAL:
                continue
            if p.kind == p.VAR_KEYWORD:
                var_kw = True
                continue
            params.setdefault(name, p)
        if not var_kw:
            open_kwargs = False
            break
    return params, hints, open_kwargs


_SCALARS = (int, float, bool, str)


def type_problem(hint: Any, value: Any) -> str | None:
    """A message if ``value`` (from YAML) clearly cannot be ``hint`` (scalar types and their unions only)."""
    origin = typing.get_origin(hint)
    members = (typing.get_args(hint) if origin in (typing.Union, getattr(__import__("types"), "UnionType", None))
               else (hint,))
    if not all(m is type(None) or m in _SCALARS for m in members):
        return None  # a class, a list, a Literal ...: left to jsonargparse
    if value is None:
        return None if type(None) in members else "must not be null"
    for m in members:
        if m is bool and isinstance(value, bool):
            return None
        if m is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if m is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if m is str and isinstance(value, str):
            return None
    names = " | ".join("null" if m is type(None) else m.__name__ for m in members)
    return f"expected {names}, got {type(value).__name__} {value!r}"
