"""Sweep config errors and the small value checks every sweep module shares."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Sequence

from lit_rl.errors import ConfigError

__all__ = ["ObjectiveNotLoggedError", "SweepConfigError"]  # and the shared helpers _bad, _is_int, _is_num, _unknown


class SweepConfigError(ConfigError):
    """A bad sweep YAML, or a derived rule that fails for a sampled point: one line naming the sweep file
    and line (when loaded from a file) and the key. ``key`` is the key path the location is looked up by."""

    key: tuple[str, ...] = ()


class ObjectiveNotLoggedError(SweepConfigError):
    """A trial trained to its end and never logged ``objective.metric``: every other trial would do the same, so the
    sweep stops after the first one (names that the base config check cannot know, such as ``train/...``, end
    here)."""

    key = ("objective", "metric")


def _bad(key: Sequence[str], problem: str, at: Sequence[str] | None = None) -> SweepConfigError:
    """``<dotted key>: <problem>``; ``at``: the key path whose line the file location names (default ``key``)."""
    err = SweepConfigError(f"{'.'.join(map(str, key))}: {problem}" if key else problem)
    err.key = tuple(key if at is None else at)
    return err


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unknown(key: Sequence[str], given: Iterable[str], allowed: Sequence[str]) -> None:
    """Refuse keys of a mapping at ``key`` that are not in ``allowed`` (a typo names its likely fix)."""
    for k in given:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"allowed: {', '.join(allowed)}"
            raise _bad(key, f"unknown key {k!r} ({hint})", at=(*key, k))
