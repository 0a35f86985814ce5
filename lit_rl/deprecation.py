"""Moved import paths that keep working for one release: the old name warns and names the new path.

A module that moved keeps a stub whose ``__getattr__`` is :func:`moved_names`: ``lit_rl.reliability.AtomicCheckpointIO``
(the path a config's ``class_path`` may still name) resolves to ``lit_rl.checkpoint_io.AtomicCheckpointIO`` with a
:class:`FutureWarning` (shown to users by default, unlike ``DeprecationWarning``) that says where it went. A value
the old module computed rather than imported comes from ``computed``: its factory, and what to use instead.
The stub's ``__all__`` is :func:`old_names`, so ``from old import *`` still works (and warns).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping

__all__ = ["moved_names", "old_names"]


def moved_names(old_module: str, new_homes: Mapping[str, str],
                computed: Mapping[str, tuple[Callable[[], Any], str]] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module``: each name of ``new_homes`` (``name -> new module``) is imported
    from its new module, each of ``computed`` (``name -> (factory, what to use instead)``) is built, both with a
    warning naming the replacement; any other name is an ``AttributeError``."""
    computed = computed or {}

    def __getattr__(name: str) -> Any:
        if name in new_homes:
            new = new_homes[name]
            warnings.warn(f"{old_module}.{name} moved to {new}.{name}; the old path goes in the next release",
                          FutureWarning, stacklevel=2)
            return getattr(importlib.import_module(new), name)
        if name in computed:
            factory, instead = computed[name]
            warnings.warn(f"{old_module}.{name} is deprecated: use {instead}; the old name goes in the next release",
                          FutureWarning, stacklevel=2)
            return factory()
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")

    return __getattr__


def old_names(new_homes: Mapping[str, str], computed: Mapping[str, Any] | None = None) -> list[str]:
    """The stub's ``__all__``: every name it still resolves."""
    return sorted({*new_homes, *(computed or {})})
