"""A reproduce plan (``conf/reproduce/*.yaml``): a study's jobs as fit configs plus training-config overlays.

A plan is data, read here with the place of every key, so that a mistake names the file, line and field::

    study: erils                     # the report that reads the runs (erils | double-rollout); the lit_rl.reproduce tag
    experiment: lit_rl-reproduce-erils
    metric: val/sudoku/greedy/accuracy   # the study's headline metric (the report's, a sweep's objective)
    data_seed: 42                    # data.init_args.seed = data_seed + seed
    warm_start: {callback: callbacks.FormatWarmup, cache: "format_warmup_sudoku_*.pt", boost: false}   # or null
    tags: {task: sudoku}             # on every job's MLflow run
    report: {...}                    # what the report says (read by the study's report module)
    quick: <overlay>                 # --quick: added to every job that runs in quick mode (or an overlay file)
    jobs:
      erils_s{seed}: {group: main, method: erils, configs: [conf/erils.yaml], quick: true}
      spg_lr0.0001_s{seed}: {group: spg_lr, method: spg, configs: [...], seeds: first, tags: {lr: "0.0001"},
                             overlay: {model: {init_args: {optimizer: {init_args: {lr: 1.0e-4}}}}}}
      rho: {group: rho, configs: [...], sweep: {key: model.init_args.double_rollout.rho, values: [0.5, 0.99]}}
    evaluations:
      lengths: {of: [main, spg_lr], configs: [conf/eval/erils_lengths.yaml], quick: <overlay>}

Every ``<overlay>`` is a training config (the fit dialect: nested ``trainer`` / ``model`` / ``data`` keys,
``callbacks~`` edits, ``callbacks+`` appends). A job is ``python -m lit_rl fit --config <configs>...`` followed by
its overlays, each its own ``--config`` file, so the CLI composes them exactly as it composes any configs: the job's
``overlay`` (a mapping, or a list of them), in quick mode the plan's ``quick`` and the job's own ``quick`` mapping,
and the warm-start callback's ``cache_dir`` (one cached warm start for the study); then its seeds, threads, run
folder and the study's MLflow store (:mod:`lit_rl.reproduce.plan_jobs`). Paths are relative to the repository root
(the working directory), as on the command line.

Job keys: ``group`` (``--only`` selects groups; the report reads them), ``method`` (a tag), ``configs``,
``seeds`` (``each``, the default, or ``first``), ``threads: other`` (with ``seeds: first``: the first seed at the
other thread count, 1 <-> 2), ``overlay``, ``tags``, ``quick`` (``true``, or an overlay, runs the job in quick mode
too; default: not in quick mode), ``sweep`` (an Optuna grid over one key on ``configs``, seed 0: ``key``,
``values``, ``quick_values``). The job's name is its key with ``{seed}`` and ``{threads}`` filled in. Jobs start
group by group in the order the groups first appear, each group's seeds in turn (every job of seed 0, then of
seed 1). An evaluation is a ``python -m lit_rl validate`` job on the last checkpoint of every fit of its ``of``
groups, with the fit's saved config and its ``configs`` (``callbacks+`` overlays); its group is its name.

Beside the fit and sweep dialects and the pool builds' (``rollouts build``), this is a fourth: a sweep is one
Optuna study over one base, a plan a fixed list of different bases (methods) across seeds, with evaluations that
read the fits' checkpoints; what each job changes stays in the fit dialect (docs/configuration.md).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_rl.config.lines import ConfigView, fail, load_yaml_with_lines
from lit_rl.errors import ConfigError

__all__ = ["RESERVED_TAGS", "Entry", "Evaluation", "StudyPlan", "SweepSpec", "WarmStart", "load_plan"]

_TOP = {"study", "experiment", "metric", "data_seed", "warm_start", "tags", "report", "quick", "jobs", "evaluations"}
_JOB = {"group", "method", "configs", "seeds", "threads", "overlay", "tags", "quick", "sweep"}
_EVAL = {"of", "configs", "quick"}
#: the tags every job gets from the plan's structure; a plan's own tags may not set them
RESERVED_TAGS = ("lit_rl.reproduce", "lit_rl.job", "method", "seed", "threads", "group", "evaluates")
_NAME = re.compile(r"^[A-Za-z0-9_.{}+-]+$")


@dataclass(frozen=True)
class WarmStart:
    callback: str | None  # the class path of the warm-up callback whose cache_dir the study shares (None: no warm-up)
    cache: str | None = None  # a glob under the cache folder: a match means the warm start is cached
    boost: bool = False  # the first job, alone, may use every worker's threads


@dataclass(frozen=True)
class SweepSpec:
    key: str
    values: tuple[Any, ...]
    quick_values: tuple[Any, ...]


@dataclass(frozen=True)
class Entry:
    name: str  # a template: {seed}, {threads}
    group: str
    configs: tuple[str, ...]
    where: str  # file:line of the entry
    method: str | None = None
    seeds: str = "each"
    threads: str | None = None
    overlay: tuple[dict[str, Any], ...] = ()
    tags: dict[str, str] = field(default_factory=dict)
    quick: bool = False
    quick_overlay: dict[str, Any] | None = None
    sweep: SweepSpec | None = None


@dataclass(frozen=True)
class Evaluation:
    name: str
    of: tuple[str, ...]
    configs: tuple[str, ...]
    quick_overlay: dict[str, Any] | None = None


@dataclass(frozen=True)
class StudyPlan:
    path: Path
    study: str
    experiment: str
    metric: str
    data_seed: int
    warm_start: WarmStart
    tags: dict[str, str]
    report: dict[str, Any]
    quick: dict[str, Any] | str | None  # an overlay, or an overlay file's path
    entries: tuple[Entry, ...]
    evaluations: tuple[Evaluation, ...]

    def stems(self, group: str) -> list[str]:
        """The names of ``group``'s jobs without their seed (``dr_nemo`` of ``dr_nemo_s{seed}``): the reports find
        a run as ``<stem>_s<seed>``."""
        return [e.name.replace("_s{seed}", "") for e in self.entries if e.group == group]

    def entries_of(self, group: str) -> list[Entry]:
        return [e for e in self.entries if e.group == group]


def _configs(cfg: ConfigView, path: tuple, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail(cfg, path, f"must be a non-empty list of config files, got {value!r}")
    for i, file in enumerate(value):
        if not Path(file).is_file():
            raise fail(cfg, (*path, i), f"{file}: no such config file (paths are relative to the repository root)")
    return tuple(value)


def _overlay(cfg: ConfigView, path: tuple, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(cfg, path, f"must be a training-config mapping (trainer / model / data keys), got {value!r}")
    return value


def _tags(cfg: ConfigView, path: tuple, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
        raise fail(cfg, path, f"must map tag names to strings, got {value!r}")
    for k in value:
        if k in RESERVED_TAGS:
            raise fail(cfg, (*path, k), f"a reserved tag (the plan sets {', '.join(RESERVED_TAGS)})")
    return {str(k): str(v) for k, v in value.items()}


def _unknown(cfg: ConfigView, path: tuple, value: dict, known: set[str]) -> None:
    for k in value:
        if k not in known:
            raise fail(cfg, (*path, k), f"unknown key (known: {', '.join(sorted(known))})")


def _name_fields(cfg: ConfigView, p: tuple, name: str) -> set[str]:
    """The fields of a job's name template: only ``{seed}`` and ``{threads}``, plain (no index, attribute,
    conversion or format spec); a name that is one path component."""
    if not _NAME.match(name) or ".." in name:
        raise fail(cfg, p, "a job name is one folder name: letters, digits and _ . + - (and {seed}, {threads})")
    fields = set()
    try:
        parsed = list(string.Formatter().parse(name))
    except ValueError as e:
        raise fail(cfg, p, f"a job name may hold {{seed}} and {{threads}} only ({e})") from None
    for _text, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if field_name not in ("seed", "threads") or spec or conversion:
            raise fail(cfg, p, f"a job name may hold {{seed}} and {{threads}} only, got {{{field_name}}}")
        fields.add(field_name)
    return fields


def _sweep(cfg: ConfigView, p: tuple, raw: dict) -> SweepSpec:
    sp = (*p, "sweep")
    sweep = raw["sweep"]
    if not isinstance(sweep, dict):
        raise fail(cfg, sp, f"must be a mapping (key, values, quick_values), got {sweep!r}")
    _unknown(cfg, sp, sweep, {"key", "values", "quick_values"})
    key, values = sweep.get("key"), sweep.get("values")
    if not isinstance(key, str) or not key:
        raise fail(cfg, (*sp, "key"), f"must be a dotted config key, got {key!r}")
    if not isinstance(values, list) or not values:
        raise fail(cfg, (*sp, "values"), f"must be a non-empty list, got {values!r}")
    qv = sweep.get("quick_values", values[:1])
    if not isinstance(qv, list) or not qv:
        raise fail(cfg, (*sp, "quick_values"), f"must be a non-empty list, got {qv!r}")
    for k in ("overlay", "threads", "seeds", "tags", "method"):
        if k in raw:
            raise fail(cfg, (*p, k), "a sweep job takes group, configs, quick and sweep (its trials run seed 0)")
    return SweepSpec(key, tuple(values), tuple(qv))


def _entry(cfg: ConfigView, name: Any, raw: Any) -> Entry:
    p = ("jobs", name)
    if not isinstance(name, str) or not name:
        raise fail(cfg, p, "a job's key is its name (e.g. erils_s{seed})")
    if not isinstance(raw, dict):
        raise fail(cfg, p, f"must be a mapping of job keys, got {raw!r}")
    _unknown(cfg, p, raw, _JOB)
    group = raw.get("group")
    if not isinstance(group, str) or not _NAME.match(group) or "{" in group:
        raise fail(cfg, (*p, "group"), f"every job names its group (letters, digits, _ . + -), got {group!r}")
    seeds = raw.get("seeds", "each")
    if seeds not in ("each", "first"):
        raise fail(cfg, (*p, "seeds"), f"must be each or first, got {seeds!r}")
    threads = raw.get("threads")
    if threads not in (None, "other"):
        raise fail(cfg, (*p, "threads"), f"must be other (the first seed at the other thread count), got {threads!r}")
    if threads == "other" and seeds != "first":
        raise fail(cfg, (*p, "threads"), "threads: other runs the first seed only: add seeds: first")
    fields = _name_fields(cfg, p, name)
    overlay = raw.get("overlay")
    parts = overlay if isinstance(overlay, list) else ([] if overlay is None else [overlay])
    parts = tuple(_overlay(cfg, (*p, "overlay", i) if isinstance(overlay, list) else (*p, "overlay"), o)
                  for i, o in enumerate(parts))
    quick = raw.get("quick", False)
    if not isinstance(quick, (bool, dict)):
        raise fail(cfg, (*p, "quick"), f"must be true, false or an overlay, got {quick!r}")
    method = raw.get("method")
    if method is not None and not isinstance(method, str):
        raise fail(cfg, (*p, "method"), f"must be a name, got {method!r}")
    spec = _sweep(cfg, p, raw) if "sweep" in raw else None
    if spec is not None and fields:
        raise fail(cfg, p, "a sweep job's name is its study's (no {seed} or {threads})")
    if spec is None and seeds == "each" and "seed" not in fields:
        raise fail(cfg, p, "a job run with each seed needs {seed} in its name (e.g. erils_s{seed})")
    return Entry(name, group, _configs(cfg, (*p, "configs"), raw.get("configs")), cfg.loc(p), method, seeds,
                 threads, parts, _tags(cfg, (*p, "tags"), raw.get("tags")), quick is not False,
                 _overlay(cfg, (*p, "quick"), quick) if isinstance(quick, dict) else None, spec)


def _evaluations(cfg: ConfigView, evs: Any, entries: tuple[Entry, ...]) -> tuple[Evaluation, ...]:
    if not isinstance(evs, dict):
        raise fail(cfg, ("evaluations",), "must map evaluation names to evaluations")
    fit_groups = {e.group for e in entries if e.sweep is None}
    out = []
    for name, raw in evs.items():
        p = ("evaluations", name)
        if not isinstance(raw, dict):
            raise fail(cfg, p, f"must be a mapping (of, configs, quick), got {raw!r}")
        _unknown(cfg, p, raw, _EVAL)
        if name in {e.group for e in entries} or not isinstance(name, str) or not _NAME.match(name):
            raise fail(cfg, p, "an evaluation's name is its group: a name no job group has")
        of = raw.get("of")
        if not isinstance(of, list) or not of or any(g not in fit_groups for g in of):
            raise fail(cfg, (*p, "of"), f"must list groups of fit jobs ({', '.join(sorted(fit_groups))}), got {of!r}")
        quick = raw.get("quick")
        out.append(Evaluation(name, tuple(of), _configs(cfg, (*p, "configs"), raw.get("configs")),
                              None if quick is None else _overlay(cfg, (*p, "quick"), quick)))
    return tuple(out)


def load_plan(path: str | Path) -> StudyPlan:
    """Read and check a plan file; a mistake raises :class:`ConfigError` naming the file, line and key."""
    path = Path(path)
    data, where = load_yaml_with_lines(path)
    cfg = ConfigView(data if isinstance(data, dict) else {}, where, [str(path)])
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: a reproduce plan is a mapping (study, experiment, jobs, ...)")
    _unknown(cfg, (), data, _TOP)
    for key in ("study", "experiment", "metric", "warm_start", "jobs"):
        if key not in data:
            raise ConfigError(f"{path}:1: {key}: missing (a plan needs study, experiment, metric, warm_start and jobs)")
    for key, what in (("study", "the study whose report reads the runs (erils, double-rollout)"),
                      ("experiment", "an MLflow experiment name"), ("metric", "a logged metric name")):
        if not isinstance(data[key], str) or not data[key]:
            raise fail(cfg, (key,), f"must be {what}, got {data[key]!r}")
    data_seed = data.get("data_seed", 42)
    if not isinstance(data_seed, int) or isinstance(data_seed, bool):
        raise fail(cfg, ("data_seed",), f"must be an integer, got {data_seed!r}")
    ws = data["warm_start"]
    if ws is None:  # no warm-up (a real pretrained model): said on purpose, not forgotten
        ws = {"callback": None}
    elif not isinstance(ws, dict) or not isinstance(ws.get("callback"), str):
        raise fail(cfg, ("warm_start",), "must give the warm-up callback's class path: {callback: ..., cache: ...}, "
                   "or be null (no warm-up)")
    _unknown(cfg, ("warm_start",), ws, {"callback", "cache", "boost"})
    if not isinstance(ws.get("boost", False), bool):
        raise fail(cfg, ("warm_start", "boost"), f"must be true or false, got {ws['boost']!r}")
    if not isinstance(ws.get("cache", ""), str):
        raise fail(cfg, ("warm_start", "cache"), f"must be a file pattern (e.g. ar_sft_*.pt), got {ws['cache']!r}")
    jobs = data["jobs"]
    if not isinstance(jobs, dict) or not jobs:
        raise fail(cfg, ("jobs",), "must map job names to jobs")
    entries = tuple(_entry(cfg, name, raw) for name, raw in jobs.items())
    evaluations = _evaluations(cfg, data.get("evaluations") or {}, entries)
    quick = data.get("quick")
    if isinstance(quick, str):  # a training overlay file (shared by plans), passed to each job as it is
        if not Path(quick).is_file():
            raise fail(cfg, ("quick",), f"{quick}: no such overlay file (paths are relative to the repository root)")
    elif quick is not None:
        _overlay(cfg, ("quick",), quick)
    report = data.get("report") or {}
    if not isinstance(report, dict):
        raise fail(cfg, ("report",), f"must be a mapping, got {report!r}")
    return StudyPlan(path, data["study"], data["experiment"], data["metric"], data_seed,
                     WarmStart(ws["callback"], ws.get("cache"), ws.get("boost", False)),
                     _tags(cfg, ("tags",), data.get("tags")), report, quick, entries, evaluations)
