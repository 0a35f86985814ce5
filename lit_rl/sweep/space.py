"""The search space of a sweep: one :class:`ParamSpec` per sampled config key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lit_rl.sweep.errors import _bad, _is_int, _is_num

__all__ = ["ParamSpec"]


@dataclass
class ParamSpec:
    """One searched config key.

    Args:
        name: the dotted training-config key, e.g. ``model.init_args.rho`` (passed as ``--<name>=<value>``).
        type: ``float``, ``int`` or ``categorical``.
        low: lower bound (float/int).
        high: upper bound (float/int), inclusive.
        log: sample on a log scale (float/int).
        step: discretisation step (float/int).
        choices: the values of a ``categorical`` parameter.
        grid: the values this parameter takes under the grid sampler (float/int; categoricals use ``choices``).
    """

    name: str
    type: str = "float"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] | None = None
    grid: list[Any] | None = None

    KEYS = ("type", "low", "high", "log", "step", "choices", "grid")

    def __post_init__(self) -> None:
        key = ("space", self.name)
        if self.type not in ("float", "int", "categorical"):
            raise _bad((*key, "type"), f"must be float, int or categorical, got {self.type!r}")
        if not isinstance(self.log, bool):
            raise _bad((*key, "log"), f"must be true or false, got {self.log!r}")
        if self.grid is not None and (not isinstance(self.grid, list) or not self.grid):
            raise _bad((*key, "grid"), f"must be a non-empty list of values, got {self.grid!r}")
        if self.type == "categorical":
            if not isinstance(self.choices, list) or not self.choices:
                raise _bad((*key, "choices"), f"must list the values of a categorical parameter, got {self.choices!r}")
            for v in self.choices:
                if v is not None and not isinstance(v, (bool, int, float, str)):
                    raise _bad((*key, "choices"), f"values must be numbers, strings, booleans or null, got {v!r}")
            for k in ("low", "high", "step"):
                if getattr(self, k) is not None:
                    raise _bad((*key, k), "applies to float and int parameters only (this one is categorical)")
            if self.log:
                raise _bad((*key, "log"), "applies to float and int parameters only (this one is categorical)")
            return
        if self.choices is not None:
            raise _bad((*key, "choices"), f"applies to categorical parameters only (this one is {self.type})")
        num, what = (_is_int, "an integer") if self.type == "int" else (_is_num, "a number")
        for k in ("low", "high"):
            if not num(getattr(self, k)):
                raise _bad((*key, k), f"must be {what} (type: {self.type}), got {getattr(self, k)!r}")
        if self.low > self.high:
            raise _bad(key, f"needs low <= high for a {self.type} parameter, got low={self.low}, high={self.high}",
                       at=(*key, "low"))
        if self.step is not None and (not num(self.step) or self.step <= 0):
            raise _bad((*key, "step"), f"must be {what} > 0, got {self.step!r}")
        if self.log and self.low <= 0:
            raise _bad((*key, "log"), f"a log scale needs low > 0, got low={self.low}")
        if self.log and self.step is not None and not (self.type == "int" and self.step == 1):
            raise _bad((*key, "step"), "cannot be combined with log: true (Optuna samples a log scale without a step)")
        for v in self.grid or []:
            if not _is_num(v):
                raise _bad((*key, "grid"), f"values must be numbers, got {v!r}")
            if not (self.low <= v <= self.high):
                raise _bad((*key, "grid"), f"value {v} lies outside [{self.low}, {self.high}]")

    def suggest(self, trial) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, self.choices)
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def grid_values(self) -> list[Any]:
        if self.grid is not None:
            return list(self.grid)
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise ValueError(f"space.{self.name}: a float parameter needs `grid: [...]` under the grid sampler")
