"""``python -m lit_rl sweep``: Optuna studies over any training-config key, linked to MLflow.

A sweep YAML (``conf/sweeps/*.yaml``, fields documented on :class:`SweepConfig`) names the base training
configs, the objective (a logged metric name and direction), the sampler, the pruner, the storage and the
search space. Each trial builds a fresh model/trainer with :func:`lit_rl.cli.run_lightning_cli`
(``run=False``) from ``base`` + ``overrides`` + ``--<key>=<value>`` for every sampled and derived
parameter, then calls ``trainer.fit``.

How it departs from a plain ``study.optimize`` loop, and why:

* **Exact trial counts under several workers.** The process that creates the study enqueues ``n_trials``
  WAITING slots (TPE/random: empty slots the sampler fills when a worker pops one; grid: one slot per grid
  point). Workers pop slots atomically in the storage, so two workers on one SQLite file (or PostgreSQL)
  never run more than ``n_trials`` trials and never repeat a grid point; Optuna's ``GridSampler`` picks
  unvisited points at random and can repeat them under concurrency.
* **Crash-safe resume.** Storage is an ``RDBStorage`` (``sqlite:///`` by default, any SQLAlchemy URL) with
  a heartbeat: a RUNNING trial whose process died stops beating, is marked FAIL by the next worker (after
  ``grace_period`` seconds) and re-enqueued with the same parameters by ``RetryFailedTrialCallback`` (up to
  ``max_retry`` times). Its MLflow child run is marked FAILED. ``load_if_exists`` semantics: re-running the
  same command resumes the study.
* **Step-based pruning.** :class:`StepPruningCallback` reports the monitored metric at ``global_step``
  (RL runs are step-based; optuna-integration's ``PyTorchLightningPruningCallback`` reports
  ``current_epoch`` from ``on_validation_end``, which is one value per epoch here). It never raises inside
  ``fit``: it sets ``trainer.should_stop`` (agreed across DDP ranks by a broadcast) and records the
  decision in the trial's system attributes; :meth:`StepPruningCallback.check_pruned` raises
  ``TrialPruned`` after ``fit`` — in the main process too under ``ddp_spawn``, where the callback that
  decided ran in a child process (the same protocol as optuna-integration's ``check_pruned()``).
* **MLflow without the deprecated ``MLflowCallback``.** One parent run per study; one nested child run
  per trial (tag ``mlflow.parentRunId``) created before the trial starts and handed to the trial's own
  ``MLFlowLogger`` (``run_id``), so training metrics, the sampled/derived parameters, the Optuna trial
  number and state (``optuna.trial_state``: COMPLETE/PRUNED/FAIL; run status FINISHED/KILLED/FAILED)
  and the objective all sit on one run, which the MLflow UI's compare view can line up.

DDP: use ``trainer.strategy: ddp_spawn`` in ``overrides`` (the trial's trainer then runs in spawned
children and the sweep process keeps its Optuna/MLflow state; Lightning's ``ddp`` launcher would re-run
the whole ``sweep`` command on every rank). The trainer, its callbacks and the pruning callback are pickled
into the spawned ranks (the CLI classes live at module level in :mod:`lit_rl.lightning_cli` for that);
``tests/test_sweep.py::test_ddp_spawn_trials_complete_and_prune_across_processes`` runs real 2-process gloo
trials, one completed and one pruned by the children's rank 0. Every rank needs at least one eval batch
(``data.eval_size / data.eval_batch_size >= devices``).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import itertools
import json
import logging
import math
import operator
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.reliability import ConfigError, load_yaml_with_lines
from lit_rl.cli_args import LitArgumentParser

__all__ = [
    "DerivedRule",
    "Objective",
    "ParamSpec",
    "StepPruningCallback",
    "SweepConfig",
    "SweepConfigError",
    "main",
    "run_sweep",
]

log = logging.getLogger("lit_rl.sweep")

PRUNED_STEP_KEY = "lit_rl:pruned_step"
INTERMEDIATE_KEY = "lit_rl:intermediate_values"
SURPLUS_KEY = "lit_rl:slot"


# --------------------------------------------------------------------------------------------- config


class SweepConfigError(ConfigError):
    """A bad sweep YAML, or a derived rule that fails for a sampled point: one line naming the sweep file
    and line (when loaded from a file) and the key. ``key`` is the key path the location is looked up by."""

    key: tuple[str, ...] = ()


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
            raise _bad(key, f"needs low <= high for a {self.type} parameter, got low={self.low}, high={self.high}", at=(*key, "low"))
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


# Derived values are config numbers: these bounds only refuse what could run for hours or fill memory
# (``10**10**10`` is one C-level big-integer power that no signal interrupts).
_MAX_EXPONENT = 1000
_MAX_BITS = 4096  # an integer result of ``**`` (10**1000 has 3,322 bits)
_MAX_STR = 10_000  # a string repeated with ``*``


def _pow(a: Any, b: Any) -> Any:
    if _is_num(b) and abs(b) > _MAX_EXPONENT:
        raise ValueError(f"exponent {b} is too large (|exponent| <= {_MAX_EXPONENT})")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a).bit_length() * b > _MAX_BITS:
        raise ValueError(f"the result of ** would have about {abs(a).bit_length() * b} bits (at most {_MAX_BITS})")
    return a ** b


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
    if _is_num(ndigits) and abs(ndigits) > _MAX_EXPONENT:  # round(5, -10**8) computes 10**(10**8)
        raise ValueError(f"round() digits {ndigits} out of range (|digits| <= {_MAX_EXPONENT})")
    return round(x) if ndigits is None else round(x, ndigits)


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: _mod, ast.Pow: _pow,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "int": int, "float": float, "round": _round, "abs": abs}


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
    """A config key computed from the sampled ones, e.g. ``data.init_args.g_on: 6 - data.init_args.g_ext``.

    The expression is arithmetic (``+ - * / // % **``, comparisons, ``a if c else b``, ``min max int float
    round abs``) over numbers and parameter names written as their dotted config keys (or the last
    component alone when unambiguous: ``6 - g_ext``). Evaluated without ``eval``, with bounded ``**``,
    string repetition and ``round`` digits so that no rule can hang. A rule that fails for a sampled point
    (``6 / (g_ext - 2)`` at ``g_ext=2``) raises :class:`SweepConfigError` naming the rule and the values.
    """

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
                raise _bad(("derived", self.name), f"{why} name {name!r} in {self.expr!r} (known: {', '.join(keys) or 'none'})")

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

        def ev(node: ast.AST) -> Any:
            name = _dotted(node)
            if name is not None:
                return lookup(name)
            if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
                return node.value
            if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
                return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                v = ev(node.operand)
                return -v if isinstance(node.op, ast.USub) else (+v if isinstance(node.op, ast.UAdd) else not v)
            if isinstance(node, ast.Compare):
                left = ev(node.left)
                for op, comp in zip(node.ops, node.comparators):
                    right = ev(comp)
                    if type(op) not in _CMPOPS or not _CMPOPS[type(op)](left, right):
                        return False
                    left = right
                return True
            if isinstance(node, ast.IfExp):
                return ev(node.body) if ev(node.test) else ev(node.orelse)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
                return _FUNCS[node.func.id](*[ev(a) for a in node.args])
            raise _bad(("derived", self.name), f"unsupported expression {ast.dump(node)} in {self.expr!r}")

        try:
            return ev(self._tree)
        except SweepConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - ZeroDivisionError, OverflowError, TypeError, the bounds above, ...
            known = [n for n in self._names if n in params or len(short.get(n, [])) == 1]
            used = ", ".join(f"{n}={lookup(n)!r}" for n in known)
            raise _bad(("derived", self.name), f"{self.expr!r} failed{' for ' + used if used else ''}: {e or type(e).__name__}") from None


@dataclass
class Objective:
    """What a trial returns.

    Args:
        metric: a logged metric name, as in ``trainer.callback_metrics`` (``val/sudoku/greedy/accuracy``,
            ``val/sudoku/det64/pass@1``); looked up in the trial's MLflow run (``@`` → ``_at_``) when absent.
        direction: ``maximize`` or ``minimize``.
        reduce: ``last`` (the final value) or ``best`` (best over the run's MLflow history, by ``direction``).
    """

    metric: str = "val/sudoku/greedy/accuracy"
    direction: str = "maximize"
    reduce: str = "last"

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise _bad(("objective", "metric"), f"must be a metric name, got {self.metric!r}")
        if self.direction not in ("maximize", "minimize"):
            raise _bad(("objective", "direction"), f"must be maximize or minimize, got {self.direction!r}")
        if self.reduce not in ("last", "best"):
            raise _bad(("objective", "reduce"), f"must be last or best, got {self.reduce!r}")


@dataclass
class SweepConfig:
    """A sweep (one Optuna study).

    Args:
        study_name: the Optuna study name; also names the MLflow parent run and tags every trial's run.
        base: training configs, applied in order (``--config`` each), e.g. ``[conf/erils.yaml]``.
        overrides: a config overlay (same nesting as the training YAMLs) applied after ``base`` to every
            trial, e.g. a shorter ``trainer.max_steps``.
        space: ``{dotted.key: {type, low, high, log, step, choices, grid}}`` (see :class:`ParamSpec`).
        derived: ``{dotted.key: expression}`` computed from the sampled values (see :class:`DerivedRule`).
        objective: metric, direction and reduction (see :class:`Objective`).
        n_trials: total trials of the study over all workers and resumes (grid: defaults to the grid size).
        sampler: ``{name: tpe|random|grid|<class path>, ...constructor kwargs}`` (TPE by default).
        pruner: ``{name: none|median|percentile|successive_halving|hyperband|threshold|patient|<class path>,
            ...kwargs}``.
        prune_monitor: the metric reported for pruning (default: ``objective.metric``).
        report_every_n_steps: report every this many optimizer steps (``global_step``), from
            ``on_train_batch_end``.
        storage: an SQLAlchemy URL (``sqlite:///runs/sweeps/optuna.db``, ``postgresql://...``).
        heartbeat_interval: seconds between a running trial's heartbeats in the storage.
        grace_period: seconds without a heartbeat after which a RUNNING trial counts as crashed.
        max_retry: how many times a crashed trial is re-enqueued with the same parameters.
        wait_for_running: when no slot is left, keep polling while other workers' trials run (so a
            crashed one is retried here once it goes stale) instead of exiting.
        catch_exceptions: a trial that raises is marked FAIL and the sweep continues (else it re-raises).
        tracking_uri: the MLflow store (``sqlite:///`` — MLflow 3's file store is not supported here).
        experiment_name: the MLflow experiment of the parent and child runs.
        output_dir: trial run folders (``<output_dir>/trial_<n>``) and the resolved overlay.
    """

    study_name: str
    base: list[str]
    space: dict[str, ParamSpec]
    overrides: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, DerivedRule] = field(default_factory=dict)
    objective: Objective = field(default_factory=Objective)
    n_trials: int | None = None
    sampler: dict[str, Any] = field(default_factory=lambda: {"name": "tpe", "seed": 0})
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "median"})
    prune_monitor: str | None = None
    report_every_n_steps: int = 1
    storage: str = "sqlite:///runs/sweeps/optuna.db"
    heartbeat_interval: int = 20
    grace_period: int = 60
    max_retry: int = 1
    wait_for_running: bool = True
    catch_exceptions: bool = True
    tracking_uri: str = "sqlite:///runs/mlflow.db"
    experiment_name: str = "lit_rl-sweeps"
    output_dir: str = "runs/sweeps"

    def __post_init__(self) -> None:
        for key in ("study_name", "storage", "tracking_uri", "experiment_name", "output_dir", "prune_monitor"):
            v = getattr(self, key)
            if not (isinstance(v, str) and v) and not (key == "prune_monitor" and v is None):
                raise _bad((key,), f"must be a non-empty string, got {v!r}")
        if not isinstance(self.base, list) or not self.base or not all(isinstance(b, str) and b for b in self.base):
            raise _bad(("base",), f"must list at least one training config path, got {self.base!r}")
        for key in ("overrides", "sampler", "pruner"):
            if not isinstance(getattr(self, key), dict):
                raise _bad((key,), f"must be a mapping, got {getattr(self, key)!r}")
        for key in ("sampler", "pruner"):
            if not isinstance(getattr(self, key).get("name", ""), str):
                raise _bad((key, "name"), f"must be an alias or a class path, got {getattr(self, key)['name']!r}")
        if not isinstance(self.space, dict) or not self.space:
            raise _bad(("space",), "must define at least one parameter")
        clash = set(self.space) & set(self.derived)
        if clash:
            raise _bad(("derived", sorted(clash)[0]), "is also in space")
        for key, least in (("n_trials", 1), ("report_every_n_steps", 1), ("heartbeat_interval", 1), ("grace_period", 1), ("max_retry", 0)):
            v = getattr(self, key)
            if not (_is_int(v) and v >= least) and not (key == "n_trials" and v is None):
                raise _bad((key,), f"must be an integer >= {least}, got {v!r}")
        for key in ("wait_for_running", "catch_exceptions"):
            if not isinstance(getattr(self, key), bool):
                raise _bad((key,), f"must be true or false, got {getattr(self, key)!r}")
        if self.n_trials is None and self.sampler_name != "grid":
            raise _bad(("n_trials",), "required unless sampler.name is grid")
        if self.grace_period <= self.heartbeat_interval:
            raise _bad(("grace_period",), f"must exceed heartbeat_interval ({self.heartbeat_interval}), got {self.grace_period}")
        if "://" not in self.storage:
            raise _bad(("storage",), f"use a database URL such as sqlite:///runs/sweeps/optuna.db, got {self.storage!r}")
        if self.tracking_uri.startswith(("file:", "./", "/")) or "://" not in self.tracking_uri:
            raise _bad(("tracking_uri",), f"use a database URI such as sqlite:///runs/mlflow.db, got {self.tracking_uri!r}")
        if self.sampler_name == "grid":
            for spec in self.space.values():
                if spec.type == "float" and spec.grid is None:
                    raise _bad(("space", spec.name), "a float parameter needs `grid: [...]` under the grid sampler")

    @property
    def sampler_name(self) -> str:
        return str(self.sampler.get("name", "tpe")).lower()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | os.PathLike | None = None, where: dict[tuple, str] | None = None) -> "SweepConfig":
        """Build and check a sweep. A problem raises :class:`SweepConfigError`; with ``source`` (the sweep file)
        its message starts with ``<file>:<line>`` of the key (``where``: key path → ``file:line``, as
        :func:`lit_rl.reliability.load_yaml_with_lines` returns it)."""
        try:
            return cls._from_dict(raw)
        except SweepConfigError as e:
            if source is None and not where:
                raise
            found = [where[e.key[:n]] for n in range(len(e.key), -1, -1) if e.key[:n] in (where or {})]
            raise _bad((), f"{found[0] if found else source}: {e}", at=e.key) from None

    @classmethod
    def _from_dict(cls, raw: Any) -> "SweepConfig":
        if not isinstance(raw, dict):
            raise _bad((), f"expected a mapping at the top level, got {type(raw).__name__}")
        _unknown((), raw, list(cls.__dataclass_fields__))
        raw = dict(raw)
        for key in ("space", "derived", "objective", "overrides", "sampler", "pruner"):
            if raw.get(key) is None and key in raw:
                raw[key] = {} if key != "pruner" else {"name": "none"}
            if not isinstance(raw.get(key, {}), dict):
                raise _bad((key,), f"must be a mapping, got {raw[key]!r}")
        base = raw.pop("base", None)
        raw["base"] = [base] if isinstance(base, str) else ([] if base is None else base)
        space = {}
        for k, v in raw.get("space", {}).items():
            if not isinstance(v, dict):
                raise _bad(("space", k), f"must be a mapping of {', '.join(ParamSpec.KEYS)}, got {v!r}")
            _unknown(("space", k), v, ParamSpec.KEYS)
            space[k] = ParamSpec(name=k, **v)
        raw["space"] = space
        raw["derived"] = {k: DerivedRule(k, v) for k, v in raw.get("derived", {}).items()}
        known = list(space)  # a rule reads sampled keys and the derived keys above it
        for name, rule in raw["derived"].items():
            rule.check_names(known)
            known.append(name)
        _unknown(("objective",), raw.get("objective", {}), list(Objective.__dataclass_fields__))
        raw["objective"] = Objective(**raw.get("objective", {}))
        cfg = cls(**raw)
        for key, make in (("sampler", cfg.make_sampler), ("pruner", cfg.make_pruner)):
            try:  # a wrong class path or keyword fails here, not in the first worker's first trial
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    make()
            except Exception as e:  # noqa: BLE001 - whatever the constructor raises, report it on its key
                raise _bad((key,), f"cannot build {getattr(cfg, key)}: {type(e).__name__}: {e}") from None
        return cfg

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict[tuple, tuple[Any, str]] | None = None) -> "SweepConfig":
        """Load a sweep YAML; ``overrides``: key path → (value, where it came from, e.g. ``command line (--storage)``)."""
        raw, where = _load_sweep_yaml(Path(path))
        for key, (value, origin) in (overrides or {}).items():
            node = raw
            for k in key[:-1]:
                if node.get(k) is None:
                    node[k] = {}
                node = node[k]
                if not isinstance(node, dict):  # e.g. `sampler: tpe`: the check reports the file's line
                    break
            else:
                node[key[-1]] = value
                where[key] = origin
        return cls.from_dict(raw, source=path, where=where)

    # ----------------------------------------------------------------------------------------- pieces

    def grid(self) -> list[dict[str, Any]]:
        names = list(self.space)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.space[n].grid_values() for n in names))]

    def target_trials(self) -> int:
        if self.sampler_name == "grid":
            size = len(self.grid())
            return min(size, self.n_trials) if self.n_trials else size
        assert self.n_trials is not None
        return self.n_trials

    def make_sampler(self):
        import optuna

        kwargs = {k: v for k, v in self.sampler.items() if k != "name"}
        name = self.sampler_name
        if name == "tpe":
            return optuna.samplers.TPESampler(**kwargs)
        if name in ("random", "grid"):  # grid: every trial arrives with all parameters fixed (enqueued)
            return optuna.samplers.RandomSampler(seed=kwargs.get("seed"))
        return _import(self.sampler["name"])(**kwargs)

    def make_pruner(self):
        return build_pruner(self.pruner)

    def make_storage(self, failed_trial_callback=None):
        import optuna

        engine_kwargs: dict[str, Any] = {}
        if self.storage.startswith("sqlite:///"):
            Path(self.storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            engine_kwargs = {"connect_args": {"timeout": 60}}
        # Optuna 4.9 renamed the stale-trial hook (``failed_trial_callback`` is removed in 6.0)
        import inspect

        hook = "heartbeat_stale_trial_callback"
        if hook not in inspect.signature(optuna.storages.RDBStorage).parameters:  # Optuna < 4.9
            hook = "failed_trial_callback"
        return optuna.storages.RDBStorage(
            self.storage,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=self.heartbeat_interval,
            grace_period=self.grace_period,
            **{hook: failed_trial_callback},
        )

    def trial_values(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """Sampled values plus the derived ones (derived rules may use earlier derived keys)."""
        values = dict(sampled)
        for name, rule in self.derived.items():
            values[name] = rule(values)
        return values

    def cli_args(self, values: dict[str, Any], trial_dir: Path, overlay: Path, run_id: str, run_name: str) -> list[str]:
        """The LightningCLI arguments of one trial (no subcommand: ``run_lightning_cli(args, run=False)``)."""
        args: list[str] = []
        for path in self.base:
            args += ["--config", path]
        args += ["--config", str(overlay)]
        for key, value in values.items():
            args.append(f"--{key}={_cli_value(value)}")
        args += [
            f"--trainer.default_root_dir={trial_dir}",
            "--trainer.logger.class_path=lightning.pytorch.loggers.MLFlowLogger",
            f"--trainer.logger.init_args.tracking_uri={self.tracking_uri}",
            f"--trainer.logger.init_args.experiment_name={self.experiment_name}",
            f"--trainer.logger.init_args.run_name={run_name}",
            f"--trainer.logger.init_args.run_id={run_id}",
        ]
        return args


def _load_sweep_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple, str]]:
    """The sweep YAML and where each key is (``file:line``); a missing file or a YAML error names the file."""
    try:
        return load_yaml_with_lines(path)
    except UnicodeDecodeError as e:
        raise SweepConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except ConfigError as e:
        raise SweepConfigError(str(e)) from None


def build_pruner(spec: dict[str, Any] | None):
    """``{name: alias or class path, **kwargs}`` → an Optuna pruner (``patient`` takes ``wrapped: {...}``)."""
    import optuna

    spec = dict(spec or {"name": "none"})
    name = str(spec.pop("name", "none"))
    aliases = {
        "none": optuna.pruners.NopPruner, "nop": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner, "percentile": optuna.pruners.PercentilePruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner, "threshold": optuna.pruners.ThresholdPruner,
        "patient": optuna.pruners.PatientPruner, "wilcoxon": optuna.pruners.WilcoxonPruner,
    }
    if name.lower() == "patient":
        spec["wrapped_pruner"] = build_pruner(spec.pop("wrapped")) if spec.get("wrapped") else None
        spec.pop("wrapped", None)
    cls = aliases.get(name.lower()) or _import(name)
    return cls(**spec)


def _import(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"unknown name {path!r}: use an alias or a dotted class path")
    return getattr(importlib.import_module(module), name)


def _cli_value(value: Any) -> str:
    """How a value is written after ``--key=``: strings as they are, the rest as JSON (jsonargparse's syntax)."""
    return value if isinstance(value, str) else json.dumps(value)


# ------------------------------------------------------------------------------------------ pruning


def _backend(storage):
    """The uncached storage behind Optuna's ``_CachedStorage`` (what another process wrote)."""
    return getattr(storage, "_backend", storage)


try:  # Lightning is a hard dependency of lit_rl; the guard keeps `--help` importable without it
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object  # type: ignore[assignment,misc]


class StepPruningCallback(_Callback):
    """Report ``monitor`` to an Optuna trial at ``global_step`` and stop unpromising trials.

    Every ``every_n_steps`` optimizer steps (checked in ``on_train_batch_end``, after the callbacks that log
    there, e.g. :class:`callbacks.PassAtKEvaluation`) and after every validation, rank 0 reports
    ``trainer.callback_metrics[monitor]`` at step ``global_step`` if it is a new value (a validation metric
    is reported once, at the step it was computed) and asks the pruner. The decision is broadcast so every DDP rank stops together
    (``trainer.should_stop``); nothing is raised inside ``fit`` (the MLflow run ends cleanly and the last
    checkpoint is written). Call :meth:`check_pruned` right after ``fit``: it raises ``TrialPruned``.

    Under DDP rank 0 also writes the reported values and the decision to the trial's system attributes,
    so :meth:`check_pruned` in the launching process (``ddp_spawn``) can replay them; this needs an
    ``RDBStorage`` (like optuna-integration's callback).
    """

    def __init__(self, trial, monitor: str, every_n_steps: int = 1) -> None:
        super().__init__()
        self._trial = trial
        self.monitor = monitor
        self.every_n_steps = every_n_steps
        self.pruned_step: int | None = None
        self.reported: dict[int, float] = {}
        self._last_train_step: int | None = None
        self._last_value: Any = None
        self._is_ddp = False
        self._warned = False

    def on_fit_start(self, trainer, pl_module) -> None:
        self._is_ddp = trainer.world_size > 1
        if self._is_ddp:
            from optuna.storages import RDBStorage

            if not isinstance(_backend(self._trial.storage), RDBStorage):
                raise ValueError("StepPruningCallback under DDP needs an RDBStorage (sqlite:/// or another database URL)")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # The same condition on every rank (global_step agrees), so the broadcast in _report is collective.
        if step == self._last_train_step or step % self.every_n_steps or self.pruned_step is not None:
            return
        self._last_train_step = step
        self._report(trainer, step)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.pruned_step is not None:
            return
        self._report(trainer, trainer.global_step)

    def _report(self, trainer, step: int) -> None:
        """Rank 0 reports a *fresh* monitor value (a tensor it has not reported yet: a validation metric is
        reported at the step it was computed, not again at later training steps) and asks the pruner."""
        should_stop = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.monitor)
            if value is None:
                if not self._warned:
                    log.warning("pruning monitor %r is not in trainer.callback_metrics at step %d", self.monitor, step)
                    self._warned = True
            elif value is not self._last_value and step not in self.reported:
                self._last_value = value
                number = float(value)
                if math.isfinite(number):
                    self._trial.report(number, step=step)
                    self.reported[step] = number
                    should_stop = self._trial.should_prune()
                    if self._is_ddp:
                        self._trial.storage.set_trial_system_attr(self._trial._trial_id, INTERMEDIATE_KEY, {str(k): v for k, v in self.reported.items()})
        should_stop = bool(trainer.strategy.broadcast(should_stop))
        if should_stop:
            self.pruned_step = step
            trainer.should_stop = True
            if trainer.is_global_zero:
                self._trial.storage.set_trial_system_attr(self._trial._trial_id, PRUNED_STEP_KEY, step)

    def check_pruned(self) -> None:
        """Raise ``optuna.TrialPruned`` if this trial was pruned (in this process or a DDP child)."""
        import optuna

        if self.pruned_step is None:
            attrs = _backend(self._trial.storage).get_trial_system_attrs(self._trial._trial_id)
            for step, value in sorted((int(k), v) for k, v in (attrs.get(INTERMEDIATE_KEY) or {}).items()):
                if step not in self.reported:  # replay what a spawned rank 0 reported
                    self._trial.report(value, step=step)
                    self.reported[step] = value
            if attrs.get(PRUNED_STEP_KEY) is not None:
                self.pruned_step = int(attrs[PRUNED_STEP_KEY])
        if self.pruned_step is not None:
            raise optuna.TrialPruned(f"pruned at step {self.pruned_step}")


# ------------------------------------------------------------------------------------------- MLflow


class StudyTracker:
    """MLflow bookkeeping: the study's parent run and one nested child run per trial."""

    def __init__(self, cfg: SweepConfig) -> None:
        from mlflow.tracking import MlflowClient

        if cfg.tracking_uri.startswith("sqlite:///"):
            Path(cfg.tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        exp = self.client.get_experiment_by_name(cfg.experiment_name)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(cfg.experiment_name)
            except Exception:  # another worker created it first
                self.experiment_id = self.client.get_experiment_by_name(cfg.experiment_name).experiment_id
        else:
            self.experiment_id = exp.experiment_id

    def create_parent(self, study) -> str:
        cfg = self.cfg
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"study:{cfg.study_name}",
            tags={"lit_rl.sweep": cfg.study_name, "lit_rl.role": "study", "optuna.study_name": cfg.study_name},
        )
        params = {
            "objective.metric": cfg.objective.metric, "objective.direction": cfg.objective.direction,
            "sampler": json.dumps(cfg.sampler), "pruner": json.dumps(cfg.pruner), "n_trials": cfg.target_trials(),
            "base": ",".join(cfg.base), "space": json.dumps({k: {kk: vv for kk, vv in vars(v).items() if vv not in (None, False) and kk != "name"} for k, v in cfg.space.items()}),
            "derived": json.dumps({k: v.expr for k, v in cfg.derived.items()}),
        }
        for k, v in params.items():
            self.client.log_param(run.info.run_id, k, str(v)[:6000])
        return run.info.run_id

    def create_child(self, parent_id: str, trial_number: int, values: dict[str, Any], derived: Iterable[str]) -> str:
        from mlflow.entities import Param, RunTag
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        cfg = self.cfg
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cfg.study_name}-trial-{trial_number}",
            tags={
                MLFLOW_PARENT_RUN_ID: parent_id, "lit_rl.sweep": cfg.study_name, "lit_rl.role": "trial",
                "optuna.study_name": cfg.study_name, "optuna.trial_number": str(trial_number),
                "optuna.trial_state": "RUNNING", "optuna.direction": cfg.objective.direction,
                "lit_rl.space": ",".join(cfg.space), "lit_rl.worker": f"{socket.gethostname()}:{os.getpid()}",
            },
        )
        self.client.log_batch(
            run.info.run_id,
            params=[Param(k, str(v)) for k, v in values.items()],
            tags=[RunTag("lit_rl.derived", ",".join(derived))] if derived else [],
        )
        return run.info.run_id

    _STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}

    def finish_child(self, run_id: str, state: str, value: float | None = None, step: int | None = None, error: str | None = None) -> None:
        self.client.set_tag(run_id, "optuna.trial_state", state)
        if value is not None and math.isfinite(value):
            self.client.log_metric(run_id, "sweep/objective", value, step=step or 0)
        if error:
            self.client.set_tag(run_id, "lit_rl.error", error[:4000])
        self.client.set_terminated(run_id, self._STATUS[state])

    def update_parent(self, parent_id: str, study) -> None:
        import optuna

        trials = study.get_trials(deepcopy=False)
        states = [t.state for t in trials]
        TS = optuna.trial.TrialState
        counts = {s.name.lower(): states.count(s) for s in (TS.COMPLETE, TS.PRUNED, TS.FAIL, TS.RUNNING, TS.WAITING)}
        for k, v in counts.items():
            self.client.log_metric(parent_id, f"study/n_{k}", v, step=len(trials))
        try:
            best = study.best_trial
        except ValueError:
            return
        self.client.log_metric(parent_id, "study/best_value", best.value, step=best.number)
        self.client.set_tag(parent_id, "optuna.best_trial_number", str(best.number))
        self.client.set_tag(parent_id, "optuna.best_params", json.dumps(best.params))
        run = best.user_attrs.get("mlflow_run_id")
        if run:
            self.client.set_tag(parent_id, "optuna.best_run_id", run)


# --------------------------------------------------------------------------------------------- study


class _Heartbeat:
    """Record the trial's heartbeat every ``interval`` seconds while it runs (Optuna does this only
    inside ``study.optimize``; this sweep drives trials itself to pop enqueued slots exactly)."""

    def __init__(self, storage, trial_id: int, interval: int) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as e:  # a transient lock on SQLite must not kill the trial
                log.debug("heartbeat failed: %s", e)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "_Heartbeat":
        self.storage.record_heartbeat(self.trial_id)  # a heartbeat row from the start
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def _sqlite_lock(*urls: str):
    """Serialise schema creation/migration of fresh SQLite stores between workers on one machine: two
    processes running MLflow's alembic migrations on one new file corrupt it (``_alembic_tmp_*`` tables)."""
    import fcntl

    paths = sorted({u[len("sqlite:///"):] for u in urls if u.startswith("sqlite:///")})
    handles = []
    try:
        for path in paths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fh = open(f"{path}.lock", "w")
            fcntl.flock(fh, fcntl.LOCK_EX)
            handles.append(fh)
        yield
    finally:
        for fh in reversed(handles):
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()


def _retry(fn: Callable[[], Any], what: str, attempts: int = 5) -> Any:
    """SQLite schema creation races when two fresh workers start together: retry briefly."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any DB error here is worth a retry
            if i == attempts - 1:
                raise
            log.warning("%s failed (%s); retrying", what, e)
            time.sleep(0.5 + i)


class _StaleTrialHandler:
    """The storage's stale-trial hook: a RUNNING trial stopped beating (its process died), so its MLflow
    child run is marked FAILED and the trial re-enqueued with the same parameters (up to ``max_retry``).
    Small and picklable: the storage (and so this hook) travels with the trial into ``ddp_spawn`` ranks."""

    def __init__(self, tracking_uri: str, max_retry: int) -> None:
        import optuna

        self.tracking_uri = tracking_uri
        retry_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
        self.retry = retry_cls(max_retry=max_retry)

    def __call__(self, study, trial) -> None:
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id:
            from mlflow.tracking import MlflowClient

            try:
                client = MlflowClient(tracking_uri=self.tracking_uri)
                client.set_tag(run_id, "optuna.trial_state", "FAIL")
                client.set_tag(run_id, "lit_rl.error", "stale heartbeat: the worker process died")
                client.set_terminated(run_id, "FAILED")
            except Exception as e:  # noqa: BLE001 - MLflow bookkeeping must not stop the sweep
                log.warning("could not mark MLflow run %s failed: %s", run_id, e)
        log.warning("trial %d went stale (crashed worker); re-enqueueing it", trial.number)
        self.retry(study, trial)


class SweepRunner:
    """Drives one worker of a study: create or join it, pop slots, run trials, keep MLflow in sync."""

    def __init__(self, cfg: SweepConfig, fit_trial: Callable[..., float] | None = None) -> None:
        import optuna

        self.cfg = cfg
        with _sqlite_lock(cfg.tracking_uri, cfg.storage):
            self.tracker = _retry(lambda: StudyTracker(cfg), "opening the MLflow store")
            self._on_stale = _StaleTrialHandler(cfg.tracking_uri, cfg.max_retry)
            self.storage = _retry(lambda: cfg.make_storage(failed_trial_callback=self._on_stale), "opening the storage")
        self.fit_trial = fit_trial or fit_trial_with_lightning_cli
        self._retry_cb = self._on_stale.retry
        direction = cfg.objective.direction
        try:
            self.study = optuna.create_study(
                study_name=cfg.study_name, storage=self.storage, sampler=cfg.make_sampler(),
                pruner=cfg.make_pruner(), direction=direction, load_if_exists=False,
            )
            self.creator = True
        except optuna.exceptions.DuplicatedStudyError:
            self.study = optuna.load_study(study_name=cfg.study_name, storage=self.storage, sampler=cfg.make_sampler(), pruner=cfg.make_pruner())
            self.creator = False
            if self.study.direction.name.lower() != direction:
                raise _bad(("objective", "direction"), f"study {cfg.study_name!r} exists in {cfg.storage} with direction {self.study.direction.name.lower()}, the config says {direction}")
        self.out = Path(cfg.output_dir) / cfg.study_name
        self.out.mkdir(parents=True, exist_ok=True)
        self.overlay = self.out / "overrides.yaml"
        atomic_write_text(self.overlay, yaml.safe_dump(cfg.overrides or {}, sort_keys=False))
        self.ran: list[int] = []

    # -- setup: exactly one worker (the creator) creates the parent run and the slots -----------------

    def setup(self, n_trials: int | None = None, wait_s: float = 120.0) -> None:
        attrs = self.study.user_attrs
        if self.creator:
            parent = self.tracker.create_parent(self.study)
            self.study.set_user_attr("mlflow_parent_run_id", parent)
            self.study.set_user_attr("mlflow_experiment_id", self.tracker.experiment_id)
            self._top_up(n_trials or self.cfg.target_trials())
            self.study.set_user_attr("ready", True)
        else:
            deadline = time.time() + wait_s
            while not attrs.get("ready") and time.time() < deadline:
                time.sleep(0.5)
                attrs = self.study.user_attrs
            if not attrs.get("ready"):  # the creator died before finishing setup: finish it here
                log.warning("study %s was never set up by its creator; setting it up", self.cfg.study_name)
                if "mlflow_parent_run_id" not in attrs:
                    self.study.set_user_attr("mlflow_parent_run_id", self.tracker.create_parent(self.study))
                self._top_up(n_trials or self.cfg.target_trials())
                self.study.set_user_attr("ready", True)
            elif n_trials is not None and n_trials != attrs.get("n_trials"):
                self._top_up(n_trials)
        self.parent_id = self.study.user_attrs["mlflow_parent_run_id"]
        self.tracker.client.set_terminated(self.parent_id, "RUNNING")

    def _top_up(self, n_trials: int) -> None:
        """Enqueue slots until the study holds ``n_trials`` trials that are not FAIL."""
        import optuna

        TS = optuna.trial.TrialState
        live = [t for t in self.study.get_trials(deepcopy=False) if t.state != TS.FAIL]
        self.study.set_user_attr("n_trials", n_trials)
        missing = n_trials - len(live)
        if missing <= 0:
            return
        if self.cfg.sampler_name == "grid":
            def key(params: dict[str, Any]) -> tuple:
                return tuple(sorted((k, json.dumps(v)) for k, v in params.items() if k in self.cfg.space))

            seen = {key({**t.params, **t.system_attrs.get("fixed_params", {})}) for t in live}
            todo = [p for p in self.cfg.grid() if key(p) not in seen][:missing]
            for params in todo:
                self.study.enqueue_trial(params, user_attrs={SURPLUS_KEY: "grid"})
        else:
            for _ in range(missing):
                self.study.enqueue_trial({}, user_attrs={SURPLUS_KEY: "slot"})

    # -- crashed trials ------------------------------------------------------------------------------

    # -- the loop ------------------------------------------------------------------------------------

    def _pop(self):
        import optuna

        TS = optuna.trial.TrialState
        for t in self.study.get_trials(deepcopy=False, states=(TS.WAITING,)):
            try:
                if self.study._storage.set_trial_state_values(t._trial_id, state=TS.RUNNING):
                    return optuna.Trial(self.study, t._trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        return None

    def run(self, max_trials: int | None = None) -> list[int]:
        """Pop and run waiting trials until none is left (or this worker has run ``max_trials``)."""
        import optuna

        TS = optuna.trial.TrialState
        while max_trials is None or len(self.ran) < max_trials:
            with warnings.catch_warnings():  # experimental since Optuna 2.9, still the public entry point
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
            trial = self._pop()
            if trial is None:
                running = self.study.get_trials(deepcopy=False, states=(TS.RUNNING,))
                if running and self.cfg.wait_for_running:
                    time.sleep(min(2.0, self.cfg.heartbeat_interval))
                    continue
                break
            self._run_one(trial)
        self.tracker.update_parent(self.parent_id, self.study)
        if not self.study.get_trials(deepcopy=False, states=(TS.RUNNING, TS.WAITING)):
            self.tracker.client.set_terminated(self.parent_id, "FINISHED")
        return self.ran

    def _run_one(self, trial) -> None:
        import optuna

        TS = optuna.trial.TrialState
        cfg = self.cfg
        with _Heartbeat(self.storage, trial._trial_id, cfg.heartbeat_interval):
            sampled = {name: spec.suggest(trial) for name, spec in cfg.space.items()}
            try:  # a derived rule that fails at this point (6 / (g_ext - 2) at g_ext=2) fails the trial below
                values, derived_error = cfg.trial_values(sampled), None
            except SweepConfigError as e:
                values, derived_error = dict(sampled), e
            derived = [name for name in cfg.derived if name in values]
            for name in derived:
                trial.set_user_attr(name, values[name])
            run_id = self.tracker.create_child(self.parent_id, trial.number, values, derived)
            trial.set_user_attr("mlflow_run_id", run_id)
            trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
            log.info("trial %d: %s", trial.number, values)
            state, value, error = "FAIL", None, None
            try:
                if derived_error is not None:
                    raise derived_error
                value = self.fit_trial(cfg, trial, values, run_id, self.out / f"trial_{trial.number}", self.overlay)
                state = "COMPLETE"
            except optuna.TrialPruned as e:
                state, error = "PRUNED", str(e)
            except (KeyboardInterrupt, SystemExit):  # interrupted: FAIL now, retried on the next run
                self.tracker.finish_child(run_id, "FAIL", error="interrupted")
                frozen = self.study.tell(trial, state=TS.FAIL)
                self._retry_cb(self.study, frozen)
                raise
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"
                log.error("trial %d failed: %s", trial.number, error, exc_info=not isinstance(e, SweepConfigError))
                if not cfg.catch_exceptions:
                    self.tracker.finish_child(run_id, "FAIL", error=error)
                    self.study.tell(trial, state=TS.FAIL)
                    raise
        if state == "COMPLETE" and (value is None or not math.isfinite(value)):
            state, error = "FAIL", f"objective {cfg.objective.metric} is {value}"
        # skip_if_finished: another worker may have declared this trial stale (its heartbeat came late, e.g.
        # on an overloaded machine) and failed + re-enqueued it meanwhile; then that decision stands.
        if state == "COMPLETE":
            frozen = self.study.tell(trial, value, skip_if_finished=True)
        elif state == "PRUNED":
            frozen = self.study.tell(trial, state=TS.PRUNED, skip_if_finished=True)
        else:
            frozen = self.study.tell(trial, state=TS.FAIL, skip_if_finished=True)
        if frozen.state.name != state:
            log.warning("trial %d was declared stale by another worker while it ran; its %s result is dropped (it was re-enqueued)", trial.number, state)
            self.tracker.client.set_tag(run_id, "lit_rl.error", f"declared stale while running (late heartbeat); its {state} result (value {value}) was dropped and the trial re-enqueued")
            self.tracker.client.set_tag(run_id, "optuna.trial_state", frozen.state.name)
            self.tracker.client.set_terminated(run_id, "FAILED")
            self.ran.append(trial.number)
            return
        if state == "PRUNED":
            value = frozen.value
        last_step = max(frozen.intermediate_values) if frozen.intermediate_values else None
        if frozen.state == TS.PRUNED:
            self.tracker.client.set_tag(run_id, "optuna.pruned_step", str(last_step))
            error = None
            if (cfg.prune_monitor or cfg.objective.metric) != cfg.objective.metric:
                value = None  # Optuna's value of a pruned trial is the last *monitor* value: not the objective
        self.tracker.finish_child(run_id, frozen.state.name, value, last_step, error)
        self.tracker.update_parent(self.parent_id, self.study)
        self.ran.append(trial.number)
        log.info("trial %d %s value=%s", trial.number, frozen.state.name, value)


def objective_from_mlflow(tracking_uri: str, run_id: str, objective: Objective) -> float | None:
    """The objective from a run's MLflow history (``last`` value or ``best`` by direction)."""
    from mlflow.tracking import MlflowClient

    name = objective.metric.replace("@", "_at_")
    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, name)
    if not history:
        return None
    if objective.reduce == "last":
        return sorted(history, key=lambda m: (m.step, m.timestamp))[-1].value
    pick = max if objective.direction == "maximize" else min
    return pick(m.value for m in history)


def fit_trial_with_lightning_cli(cfg: SweepConfig, trial, values: dict[str, Any], run_id: str, trial_dir: Path, overlay: Path) -> float:
    """Build a fresh model/trainer through the LightningCLI, fit, check pruning, return the objective."""
    import gc

    from lit_rl.cli import run_lightning_cli

    trial_dir.mkdir(parents=True, exist_ok=True)
    args = cfg.cli_args(values, trial_dir, overlay, run_id, f"{cfg.study_name}-trial-{trial.number}")
    atomic_write_text(trial_dir / "cli_args.json", json.dumps(args, indent=1))
    try:
        cli = run_lightning_cli(args, run=False)
    except SystemExit as e:  # jsonargparse exits on a bad config: a failed trial, not a dead sweep
        raise ValueError(f"the trial's config did not parse (exit {e.code}); see stderr") from None
    trainer = cli.trainer
    for cb in trainer.checkpoint_callbacks:  # the base config's dirpath is shared by all trials
        cb.dirpath = str(trial_dir / "checkpoints")
    pruning = StepPruningCallback(trial, cfg.prune_monitor or cfg.objective.metric, cfg.report_every_n_steps)
    trainer.callbacks.append(pruning)
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule)
        pruning.check_pruned()
        value = None
        if cfg.objective.reduce == "last" and cfg.objective.metric in trainer.callback_metrics:
            value = float(trainer.callback_metrics[cfg.objective.metric])
        if value is None:
            value = objective_from_mlflow(cfg.tracking_uri, run_id, cfg.objective)
        if value is None:
            raise KeyError(f"objective metric {cfg.objective.metric!r} was not logged")
        return value
    finally:
        del cli, trainer
        gc.collect()


def run_sweep(
    cfg: SweepConfig, n_trials: int | None = None, fit_trial: Callable[..., float] | None = None, max_trials: int | None = None,
) -> "Any":
    """Create or join the study, run trials until no slot is left, return the Optuna study.

    ``max_trials`` caps the trials *this worker* runs (e.g. one per SLURM array task); the study's total
    stays ``n_trials``, and the remaining slots wait for other workers or the next run.
    """
    if max_trials is not None and max_trials < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    runner = SweepRunner(cfg, fit_trial)
    runner.setup(n_trials)
    runner.run(max_trials)
    return runner.study


def summarize(study) -> str:
    import optuna

    TS = optuna.trial.TrialState
    lines = [f"study {study.study_name}:"]
    for t in study.get_trials(deepcopy=False):
        lines.append(f"  trial {t.number:>3} {t.state.name:<8} value={t.value} params={t.params}")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    lines.append(f"  complete={states.count(TS.COMPLETE)} pruned={states.count(TS.PRUNED)} failed={states.count(TS.FAIL)}")
    try:
        lines.append(f"  best: trial {study.best_trial.number} value={study.best_value} params={study.best_params}")
    except ValueError:
        lines.append("  best: none (no complete trial)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = LitArgumentParser(prog="python -m lit_rl sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a sweep YAML (conf/sweeps/<name>.yaml)")
    parser.add_argument("--n_trials", type=int, default=None, help="total trials of the study (tops up a resumed study)")
    parser.add_argument("--max_trials", type=int, default=None, help="this worker runs at most this many trials, then exits")
    parser.add_argument("--study_name", default=None, help="override study_name")
    parser.add_argument("--storage", default=None, help="override storage (any SQLAlchemy URL)")
    parser.add_argument("--tracking_uri", default=None, help="override the MLflow tracking URI")
    parser.add_argument("--sampler", default=None, help="override sampler.name (tpe, random, grid, class path)")
    parser.add_argument("--output_dir", default=None, help="override output_dir")
    args = parser.parse_args(argv)
    if args.max_trials is not None and args.max_trials < 1:
        parser.error(f"--max_trials must be >= 1, got {args.max_trials}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides: dict[tuple, tuple[Any, str]] = {}
    for key in ("study_name", "storage", "tracking_uri", "output_dir", "n_trials"):
        if getattr(args, key) is not None:
            overrides[(key,)] = (getattr(args, key), f"command line (--{key.replace('_', '-')})")
    if args.sampler:
        overrides[("sampler", "name")] = (args.sampler, "command line (--sampler)")
    try:  # a bad sweep file is one line naming the file, line and key (exit 2), not a traceback
        cfg = SweepConfig.from_yaml(args.config, overrides)
        study = run_sweep(cfg, args.n_trials, max_trials=args.max_trials)
    except SweepConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summarize(study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
