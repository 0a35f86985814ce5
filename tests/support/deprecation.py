"""The checks every moved-name stub (:mod:`lit_rl.deprecation`) passes, shared by the stubs' own test files
(tests/test_reliability.py, tests/callbacks/test_reliability.py, tests/algorithms/test_sft.py,
tests/algorithms/test_sft_module.py) and tests/test_deprecation.py."""

from __future__ import annotations

import importlib
from typing import Sequence

import pytest


def assert_moved(old: str, name: str, new: str) -> None:
    """``old.name`` is the object ``new.name``, and reading it warns with the new path."""
    with pytest.warns(FutureWarning, match=rf"{old}\.{name} moved to {new}\.{name}"):
        obj = getattr(importlib.import_module(old), name)
    assert obj is getattr(importlib.import_module(new), name)


def assert_old_names_resolve(old: str, names: Sequence[str]) -> None:
    """The stub ``old`` exports exactly ``names`` (frozen by the caller: a stub that forgets one fails); each
    resolves with a warning naming it, and a star import brings them all."""
    module = importlib.import_module(old)
    assert sorted(module.__all__) == sorted(names)
    for name in names:
        with pytest.warns(FutureWarning, match=rf"{old}\.{name} "):
            assert getattr(module, name) is not None
    with pytest.warns(FutureWarning):
        namespace: dict = {}
        exec(f"from {old} import *", namespace)  # noqa: S102
    assert set(names) <= namespace.keys()
