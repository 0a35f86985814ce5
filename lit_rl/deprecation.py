"""Moved import paths that keep working for one release: the old name warns and names the new path.

A module that moved keeps a stub whose ``__getattr__`` is :func:`moved_names`: ``lit_rl.reliability.AtomicCheckpointIO``
(the path a config's ``class_path`` may still name) resolves to ``lit_rl.checkpoint_io.AtomicCheckpointIO`` with a
:class:`FutureWarning` (shown to users by default, unlike ``DeprecationWarning``) that says where it went.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping

__all__ = ["moved_names"]


def moved_names(old_module: str, new_homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module``: each name of ``new_homes`` (``name -> new module``) is
    imported from its new module with a warning naming the new path; any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        new = new_homes[name]
        warnings.warn(f"{old_module}.{name} moved to {new}.{name}; the old path goes in the next release",
                      FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
