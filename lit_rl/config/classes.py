"""The preflight's checks of every ``class_path`` node and settings mapping of a config
(:mod:`lit_rl.config.preflight`): the node's shape, its keys and scalar types, its class's own argument rules
(``check_args``, below) and the settings dataclasses built from their YAML.

One home per rule. A class whose constructor checks its own arguments does it in one static method::

    class SPGSurrogate:
        @staticmethod
        def check_args(num_t: int = 2, mode: str = "mix", ...) -> None:
            if num_t < 1:
                raise FieldError("num_t", f"must be >= 1, got {num_t}")

        def __init__(self, ..., num_t: int = 2, mode: str = "mix", ...) -> None:
            SPGSurrogate.check_args(num_t=num_t, mode=mode, ...)

The constructor calls it by its class's name (``self.check_args`` would find a subclass's); the preflight calls
the ``check_args`` of the class and of every base class that defines one, with the values of the config (the
constructor's defaults for the keys the config leaves out), and reports a :class:`~lit_rl.errors.FieldError` at
that key's file:line. ``check_args`` takes only arguments of the constructor, by the same names. A settings
argument (a dataclass, or a list of them) reaches it built, as the constructor gets it; a ``class_path`` argument
reaches it as its config mapping (the preflight builds no object a config names).

A rule that reads a class attribute a subclass sets (``Task.SYSTEM_PROMPTS``) is a ``classmethod``: the
preflight binds it to the configured class, and the constructor calls ``Task.check_args.__func__(type(self),
...)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import lit_rl.config.signatures as sig
from lit_rl.config.lines import ConfigView, fail
from lit_rl.errors import FieldError

__all__ = ["check_shapes", "run_check_args", "walk_classes", "walk_settings"]


def check_shapes(cfg: ConfigView, node: Any = None, path: tuple = ()) -> None:
    """Mappings where mappings belong: ``trainer``, ``model`` and ``data`` and every ``init_args``; run first, so
    no later check meets a list where it reads a mapping."""
    if not path:
        for key in ("trainer", "model", "data"):
            v = cfg.data.get(key)
            if v is not None and not isinstance(v, dict) and not (key != "trainer" and isinstance(v, str)):
                raise fail(cfg, (key,), f"expected a mapping, got {type(v).__name__}")
        node = cfg.data
    if isinstance(node, dict):
        if "class_path" in node and "init_args" in node and not isinstance(node["init_args"], (dict, type(None))):
            raise fail(cfg, path + ("init_args",), f"expected a mapping, got {type(node['init_args']).__name__}")
        for k, v in node.items():
            check_shapes(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_shapes(cfg, v, path + (i,))


def run_check_args(cfg: ConfigView, path: tuple, cls: Any, args: dict) -> None:
    """Call the ``check_args`` (module docstring) of ``cls`` and of each base class that has its own, base first,
    with the config's values, the constructor's defaults for the others; a
    :class:`~lit_rl.errors.FieldError` becomes a :class:`~lit_rl.errors.ConfigError` at the key."""
    if not isinstance(cls, type):
        return
    params, hints, _ = sig.params(cls)
    for owner in reversed(cls.__mro__):
        check = vars(owner).get("check_args")
        if isinstance(check, staticmethod):
            check = check.__func__
        elif isinstance(check, classmethod):
            check = check.__get__(None, cls)  # the configured class: its class attributes
        else:
            continue
        kwargs: dict[str, Any] = {}
        for name, p in inspect.signature(check).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if name in args:  # a settings argument built, as the constructor gets it
                kwargs[name] = build_settings(cfg, path + ("init_args", name), hints.get(name), args[name])
            elif name in params and params[name].default is not inspect.Parameter.empty:
                kwargs[name] = params[name].default
            elif p.default is inspect.Parameter.empty:
                break  # a required argument the config leaves out: LightningCLI names it
        else:
            try:
                check(**kwargs)
            except FieldError as e:
                raise fail(cfg, path + ("init_args", *e.field.split(".")), e.problem) from None
            except (TypeError, ValueError) as e:
                raise fail(cfg, path + ("init_args",), f"{owner.__name__}: {e}") from None


def _check_class(cfg: ConfigView, path: tuple, node: dict) -> None:
    cp = node.get("class_path")
    if not isinstance(cp, str):
        raise fail(cfg, path + ("class_path",), f"expected a dotted class path, got {cp!r}")
    if "." not in cp:
        return  # a short name that jsonargparse resolves among the subclasses
    try:
        cls = sig.import_class(cp)
    except (ImportError, AttributeError, ValueError) as e:
        what = "unknown task" if "task" in path else "cannot import"
        raise fail(cfg, path + ("class_path",), f"{what} {cp!r} ({type(e).__name__}: {e})") from None
    args = node.get("init_args") or {}
    if not isinstance(args, dict):
        raise fail(cfg, path + ("init_args",), f"expected a mapping, got {type(args).__name__}")
    params, hints, open_kwargs = sig.params(cls)
    for k, v in args.items():
        if k not in params:
            if open_kwargs:
                continue
            close = [p for p in params if p.lower().startswith(str(k).lower()[:4])] or sorted(params)
            raise fail(cfg, path + ("init_args", k), f"unknown key for {cp} (accepted: {', '.join(close)})")
        if k in hints:
            problem = sig.type_problem(hints[k], v)
            if problem:
                raise fail(cfg, path + ("init_args", k), problem)
    run_check_args(cfg, path, cls, args)


def walk_classes(cfg: ConfigView, node: Any, path: tuple) -> None:
    """Every ``class_path`` node: it imports, its keys exist, scalars have their types, ``check_args`` passes."""
    if isinstance(node, dict):
        if "class_path" in node:
            _check_class(cfg, path, node)
            for k, v in (node.get("init_args") or {}).items() if isinstance(node.get("init_args"), dict) else ():
                walk_classes(cfg, v, path + ("init_args", k))
        else:
            for k, v in node.items():
                walk_classes(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk_classes(cfg, v, path + (i,))


def _unwrap_optional(hint: Any) -> Any:
    """``X | None`` / ``Optional[X]`` -> ``X``; other hints unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a type hint names (``X``, ``X | None``, ``Optional[X]``), else ``None``."""
    hint = _unwrap_optional(hint)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def build_settings(cfg: ConfigView, path: tuple, hint: Any, value: Any) -> Any:
    """Build a settings dataclass (and the ones nested in it, and in lists of them) from its YAML mapping, so
    its own ``__post_init__`` rules run here; a :class:`~lit_rl.errors.FieldError` is reported at the
    argument's file:line, an unknown key with the accepted ones. Anything else is returned unchanged."""
    hint = _unwrap_optional(hint)
    if typing.get_origin(hint) is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [build_settings(cfg, path + (i,), item, v) for i, v in enumerate(value)]
    dc = _dataclass_in(hint)
    if dc is None or value is None:
        return value
    if not isinstance(value, dict):
        raise fail(cfg, path, f"expected a mapping ({dc.__name__}), got {type(value).__name__} {value!r}")
    if "class_path" in value:
        return value  # a class_path node: the key checks read it
    try:
        hints = typing.get_type_hints(dc)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: leave the check to the run
        return value
    fields = [f.name for f in dataclasses.fields(dc)]
    for k in value:
        if k not in fields:
            raise fail(cfg, path + (k,), f"unknown key for {dc.__name__} (accepted: {', '.join(fields)})")
    kwargs = {k: build_settings(cfg, path + (k,), hints[k], v) for k, v in value.items()}
    try:
        return dc(**kwargs)
    except FieldError as e:
        raise fail(cfg, path + tuple(e.field.split(".")), e.problem) from None
    except (TypeError, ValueError) as e:
        raise fail(cfg, path, str(e)) from None


def walk_settings(cfg: ConfigView, node: Any, path: tuple) -> None:
    """Every ``class_path`` node's settings arguments through :func:`build_settings`."""
    if isinstance(node, dict):
        if isinstance(node.get("class_path"), str) and "." in node["class_path"]:
            try:
                _, hints, _ = sig.params(sig.import_class(node["class_path"]))
            except Exception:  # noqa: BLE001 - reported by the key checks
                hints = {}
            args = node.get("init_args") if isinstance(node.get("init_args"), dict) else {}
            for k, v in args.items():
                if k in hints:
                    build_settings(cfg, path + ("init_args", k), hints[k], v)
        for k, v in node.items():
            walk_settings(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk_settings(cfg, v, path + (i,))
