"""The sweep YAML (:class:`SweepConfig`): base configs, overrides, space, derived keys, objective, sampler,
pruner, storage; loaded with the place of every key so that errors name the file and line."""

from __future__ import annotations

import itertools
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_rl.config.lines import load_yaml_with_lines
from lit_rl.sweep.derived import DerivedRule
from lit_rl.errors import ConfigError
from lit_rl.sweep.errors import SweepConfigError, _bad, _is_int, _unknown
from lit_rl.sweep.space import ParamSpec

__all__ = ["Objective", "SweepConfig", "build_pruner"]


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
        storage: an SQLAlchemy URL (``sqlite:///runs/sweeps/optuna.db``,
            ``postgresql+psycopg://user@host:5432/db``).
        storage_retry_s: a server storage (not SQLite) retries each call through a dropped or refused
            connection with exponential backoff (0.5 s doubling, at most 15 s a wait) for up to this many
            seconds before the worker fails naming the URL; 0: fail at once (:mod:`lit_rl.sweep.retry`).
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
    storage_retry_s: int = 300
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
        for key, least in (("n_trials", 1), ("report_every_n_steps", 1), ("heartbeat_interval", 1), ("grace_period", 1),
                           ("max_retry", 0), ("storage_retry_s", 0)):
            v = getattr(self, key)
            if not (_is_int(v) and v >= least) and not (key == "n_trials" and v is None):
                raise _bad((key,), f"must be an integer >= {least}, got {v!r}")
        for key in ("wait_for_running", "catch_exceptions"):
            if not isinstance(getattr(self, key), bool):
                raise _bad((key,), f"must be true or false, got {getattr(self, key)!r}")
        if self.n_trials is None and self.sampler_name != "grid":
            raise _bad(("n_trials",), "required unless sampler.name is grid")
        if self.grace_period <= self.heartbeat_interval:
            raise _bad(("grace_period",),
                       f"must exceed heartbeat_interval ({self.heartbeat_interval}), got {self.grace_period}")
        if "://" not in self.storage:
            raise _bad(("storage",),
                       f"use a database URL such as sqlite:///runs/sweeps/optuna.db, got {self.storage!r}")
        if self.tracking_uri.startswith(("file:", "./", "/")) or "://" not in self.tracking_uri:
            raise _bad(("tracking_uri",),
                       f"use a database URI such as sqlite:///runs/mlflow.db, got {self.tracking_uri!r}")
        if self.sampler_name == "grid":
            for spec in self.space.values():
                if spec.type == "float" and spec.grid is None:
                    raise _bad(("space", spec.name), "a float parameter needs `grid: [...]` under the grid sampler")

    @property
    def sampler_name(self) -> str:
        return str(self.sampler.get("name", "tpe")).lower()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | os.PathLike | None = None,
                  where: dict[tuple, str] | None = None) -> "SweepConfig":
        """Build and check a sweep. A problem raises :class:`SweepConfigError`; with ``source`` (the sweep file)
        its message starts with ``<file>:<line>`` of the key (``where``: key path → ``file:line``, as
        :func:`lit_rl.config.lines.load_yaml_with_lines` returns it)."""
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
        """Load a sweep YAML; ``overrides``: key path → (value, where it came from, e.g.
        ``command line (--storage)``)."""
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
        cfg = cls.from_dict(raw, source=path, where=where)
        cfg.source, cfg.where = str(path), where  # for the checks against the base config (lit_rl.sweep.validate)
        return cfg

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
        kwargs: dict[str, Any] = {}
        cls = optuna.storages.RDBStorage
        if self.storage.startswith("sqlite:///"):
            Path(self.storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            engine_kwargs = {"connect_args": {"timeout": 60}}
        elif not self.storage.startswith("sqlite:"):
            from lit_rl.sweep.retry import Backoff, RetryingRDBStorage

            # a server: a pooled connection that died with a server restart is replaced on checkout, and
            # a call that meets a dropped/refused connection is retried with backoff
            engine_kwargs = {"pool_pre_ping": True}
            cls, kwargs = RetryingRDBStorage, {"backoff": Backoff(timeout=self.storage_retry_s)}
        # Optuna 4.9 renamed the stale-trial hook (``failed_trial_callback`` is removed in 6.0)
        import inspect

        hook = "heartbeat_stale_trial_callback"
        if hook not in inspect.signature(optuna.storages.RDBStorage).parameters:  # Optuna < 4.9
            hook = "failed_trial_callback"
        return cls(
            self.storage,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=self.heartbeat_interval,
            grace_period=self.grace_period,
            **kwargs,
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
            "--trainer.logger.class_path=lit_rl.loggers.MLFlowLogger",
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
