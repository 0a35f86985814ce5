"""A reproduce plan (``conf/reproduce/*.yaml``): a study's jobs as fit configs plus training-config overlays.

A plan is data, read here with the place of every key, so that a mistake names the file, line and field::

    study: erils                     # the report that reads the runs (erils | double-rollout); the lit_rl.reproduce tag
    experiment: lit_rl-reproduce-erils
    metric: val/sudoku/greedy/accuracy   # the study's headline metric (the report's, a sweep's objective)
    data_seed: 42                    # data.init_args.seed = data_seed + seed
    warm_start: {callback: callbacks.FormatWarmup, cache: "format_warmup_sudoku_*.pt", boost: false}
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
``callbacks~`` edits, ``callbacks+`` appends). A job is ``python -m lit_rl fit --config <configs>... --config
<run folder>/overlay.yaml`` plus its seeds, threads, run folder and the study's MLflow store; ``overlay.yaml``
composes, in order, the job's ``overlay`` (a mapping, or a list of them), in quick mode the plan's ``quick`` and
the job's own ``quick`` mapping, and the warm-start callback's ``cache_dir`` (one cached warm start for the
study). Keyed edits (``callbacks~``) of these parts are applied one after another.

Job keys: ``group`` (``--only`` selects groups; the report reads them), ``method`` (a tag), ``configs``,
``seeds`` (``each``, the default, or ``first``), ``threads: other`` (the first seed at the other thread count:
1 <-> 2), ``overlay``, ``tags``, ``quick`` (``true``, or an overlay, runs the job in quick mode too; default: not
in quick mode), ``sweep`` (an Optuna grid over one key on ``configs``, seed 0: ``key``, ``values``,
``quick_values``). The job's name is its key with ``{seed}`` and ``{threads}`` filled in. Jobs start group by
group in the order the groups first appear, each group's seeds in turn (every job of seed 0, then of seed 1).
An evaluation is a ``python -m lit_rl validate`` job on the last checkpoint of every fit of its ``of`` groups,
with the fit's saved config and its ``configs`` (``callbacks+`` overlays); its group is its name.

This is a third config dialect beside fit and sweep: a sweep is one Optuna study over one base, a plan a fixed
list of different bases (methods) across seeds, with evaluations that read the fits' checkpoints; what each job
changes stays in the fit dialect.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.config.lines import ConfigView, fail, load_yaml_with_lines
from lit_rl.errors import ConfigError

__all__ = ["Entry", "Evaluation", "Plan", "StudyPlan", "SweepSpec", "WarmStart", "expand", "load_plan",
           "merge_overlays"]

_TOP = {"study", "experiment", "metric", "data_seed", "warm_start", "tags", "report", "quick", "jobs", "evaluations"}
_JOB = {"group", "method", "configs", "seeds", "threads", "overlay", "tags", "quick", "sweep"}
_EVAL = {"of", "configs", "quick"}
STUDIES = ("erils", "double-rollout")


@dataclass(frozen=True)
class WarmStart:
    callback: str  # the class path of the warm-up callback whose cache_dir the study shares
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
    quick: dict[str, Any] | None
    entries: tuple[Entry, ...]
    evaluations: tuple[Evaluation, ...]

    @property
    def groups(self) -> list[str]:
        """Job groups in the order they first appear, then the evaluations'."""
        return list(dict.fromkeys([*(e.group for e in self.entries), *(ev.name for ev in self.evaluations)]))

    def methods(self, group: str = "main") -> list[str]:
        """The methods of ``group``'s jobs, in order."""
        return list(dict.fromkeys(e.method for e in self.entries if e.group == group and e.method))

    def stems(self, group: str) -> list[str]:
        """The names of ``group``'s jobs without their seed (``dr_nemo`` of ``dr_nemo_s{seed}``): the reports find
        a run as ``<stem>_s<seed>``."""
        return [e.name.replace("_s{seed}", "") for e in self.entries if e.group == group]

    def entries_of(self, group: str) -> list[Entry]:
        return [e for e in self.entries if e.group == group]


@dataclass
class Plan:
    """The jobs of one run of a study (:func:`expand`)."""

    jobs: list  # list[Job]
    out: Path
    quick: bool
    seeds: list[int]
    threads: int
    study: StudyPlan
    #: no warm start is cached yet: run the first job alone, so that the others load its cache
    first_alone: bool = True
    #: the first job, alone, may use every thread the workers would share
    boost_first: bool = False
    #: jobs that read the fits' checkpoints: they run after every fit
    eval_jobs: list = field(default_factory=list)


def _str_list(cfg: ConfigView, path: tuple, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail(cfg, path, f"must be a non-empty list of config files, got {value!r}")
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
    return {str(k): str(v) for k, v in value.items()}


def _unknown(cfg: ConfigView, path: tuple, value: dict, known: set[str]) -> None:
    for k in value:
        if k not in known:
            raise fail(cfg, (*path, k), f"unknown key (known: {', '.join(sorted(known))})")


def _entry(cfg: ConfigView, name: Any, raw: Any) -> Entry:
    p = ("jobs", name)
    if not isinstance(name, str) or not name:
        raise fail(cfg, p, "a job's key is its name (e.g. erils_s{seed})")
    if not isinstance(raw, dict):
        raise fail(cfg, p, f"must be a mapping of job keys, got {raw!r}")
    _unknown(cfg, p, raw, _JOB)
    group = raw.get("group")
    if not isinstance(group, str) or not group:
        raise fail(cfg, (*p, "group"), f"every job names its group (e.g. main), got {group!r}")
    seeds = raw.get("seeds", "each")
    if seeds not in ("each", "first"):
        raise fail(cfg, (*p, "seeds"), f"must be each or first, got {seeds!r}")
    threads = raw.get("threads")
    if threads not in (None, "other"):
        raise fail(cfg, (*p, "threads"), f"must be other (the first seed at the other thread count), got {threads!r}")
    try:
        name.format(seed=0, threads=1)
    except (KeyError, IndexError, ValueError) as e:
        raise fail(cfg, p, f"a job name may hold {{seed}} and {{threads}} only ({type(e).__name__}: {e})") from None
    overlay = raw.get("overlay")
    parts = overlay if isinstance(overlay, list) else ([] if overlay is None else [overlay])
    parts = tuple(_overlay(cfg, (*p, "overlay"), o) for o in parts)
    quick = raw.get("quick", False)
    if not isinstance(quick, (bool, dict)):
        raise fail(cfg, (*p, "quick"), f"must be true, false or an overlay, got {quick!r}")
    method = raw.get("method")
    if method is not None and not isinstance(method, str):
        raise fail(cfg, (*p, "method"), f"must be a name, got {method!r}")
    sweep = raw.get("sweep")
    spec = None
    if sweep is not None:
        sp = (*p, "sweep")
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
        spec = SweepSpec(key, tuple(values), tuple(qv))
        if overlay is not None or threads is not None or seeds != "each":
            raise fail(cfg, sp, "a sweep job takes configs, group and sweep (its trials run seed 0)")
    if spec is None and seeds == "each" and "{seed}" not in name:
        raise fail(cfg, p, "a job run with each seed needs {seed} in its name (e.g. erils_s{seed})")
    return Entry(name, group, _str_list(cfg, (*p, "configs"), raw.get("configs")), cfg.loc(p), method, seeds,
                 threads, parts, _tags(cfg, (*p, "tags"), raw.get("tags")), quick is not False,
                 _overlay(cfg, (*p, "quick"), quick) if isinstance(quick, dict) else None, spec)


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
            raise ConfigError(f"{path}: {key}: missing (a plan needs study, experiment, metric, warm_start and jobs)")
    if not isinstance(data["study"], str) or not data["study"]:
        raise fail(cfg, ("study",), f"must name the study whose report reads the runs ({', '.join(STUDIES)}), "
                                    f"got {data['study']!r}")
    if not isinstance(data["experiment"], str) or not data["experiment"]:
        raise fail(cfg, ("experiment",), f"must be an MLflow experiment name, got {data['experiment']!r}")
    if not isinstance(data["metric"], str) or not data["metric"]:
        raise fail(cfg, ("metric",), f"must be a logged metric name, got {data['metric']!r}")
    data_seed = data.get("data_seed", 42)
    if not isinstance(data_seed, int) or isinstance(data_seed, bool):
        raise fail(cfg, ("data_seed",), f"must be an integer, got {data_seed!r}")
    ws = data["warm_start"]
    if not isinstance(ws, dict) or not isinstance(ws.get("callback"), str):
        raise fail(cfg, ("warm_start",), "must give the warm-up callback's class path: {callback: ..., cache: ...}")
    _unknown(cfg, ("warm_start",), ws, {"callback", "cache", "boost"})
    if not isinstance(ws.get("boost", False), bool):
        raise fail(cfg, ("warm_start", "boost"), f"must be true or false, got {ws['boost']!r}")
    jobs = data["jobs"]
    if not isinstance(jobs, dict) or not jobs:
        raise fail(cfg, ("jobs",), "must map job names to jobs")
    entries = tuple(_entry(cfg, name, raw) for name, raw in jobs.items())
    evaluations = []
    evs = data.get("evaluations") or {}
    if not isinstance(evs, dict):
        raise fail(cfg, ("evaluations",), "must map evaluation names to evaluations")
    groups = {e.group for e in entries}
    for name, raw in evs.items():
        p = ("evaluations", name)
        if not isinstance(raw, dict):
            raise fail(cfg, p, f"must be a mapping (of, configs, quick), got {raw!r}")
        _unknown(cfg, p, raw, _EVAL)
        of = raw.get("of")
        if not isinstance(of, list) or not of or any(g not in groups for g in of):
            raise fail(cfg, (*p, "of"), f"must list job groups of this plan ({', '.join(sorted(groups))}), got {of!r}")
        quick = raw.get("quick")
        evaluations.append(Evaluation(str(name), tuple(of), _str_list(cfg, (*p, "configs"), raw.get("configs")),
                                      None if quick is None else _overlay(cfg, (*p, "quick"), quick)))
    quick = data.get("quick")
    if isinstance(quick, str):  # a training overlay file (shared by plans)
        quick_path = Path(quick)
        if not quick_path.is_file():
            raise fail(cfg, ("quick",), f"{quick}: no such overlay file")
        quick = load_yaml_with_lines(quick_path)[0]
    report = data.get("report") or {}
    if not isinstance(report, dict):
        raise fail(cfg, ("report",), f"must be a mapping, got {report!r}")
    return StudyPlan(path, data["study"], data["experiment"], data["metric"], data_seed,
                     WarmStart(ws["callback"], ws.get("cache"), ws.get("boost", False)),
                     _tags(cfg, ("tags",), data.get("tags")), report,
                     None if quick is None else _overlay(cfg, ("quick",), quick), entries, tuple(evaluations))


def merge_overlays(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One overlay that means ``parts`` applied in order: mappings merge key by key, a later list replaces an
    earlier one, and keyed edits (``key~`` lists) add up (each edit merges into its entry in turn)."""

    def merge(a: Any, b: Any, key: Any = None) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for k, v in b.items():
                out[k] = merge(out[k], v, k) if k in out else copy.deepcopy(v)
            return out
        if isinstance(key, str) and key.endswith("~") and isinstance(a, list) and isinstance(b, list):
            return [*a, *copy.deepcopy(b)]
        return copy.deepcopy(b)

    out: dict[str, Any] = {}
    for part in parts:
        out = merge(out, part)
    return out


def _write_overlay(folder: Path, parts: Sequence[dict[str, Any]], name: str = "overlay.yaml") -> Path | None:
    merged = merge_overlays([p for p in parts if p])
    if not merged:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    atomic_write_text(path, yaml.safe_dump(merged, sort_keys=False))
    return path


def expand(study: StudyPlan, out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
           cache_dir: str | None = None) -> Plan:
    """Every job of ``study`` for these seeds (quick: only the jobs marked ``quick``, with the quick overlays),
    its overlay files written into the jobs' folders, in the order they should start."""
    from lit_rl.reproduce.runner import fit_job, sweep_jobs, validate_job

    out = Path(out)
    if not seeds:
        raise ValueError("a study needs at least one seed")
    cache = cache_dir or (str(out / "cache") if quick else "runs/cache")
    warm = {"trainer": {"callbacks~": [{"class_path": study.warm_start.callback, "init_args": {"cache_dir": cache}}]}}
    quick_parts = [study.quick] if quick and study.quick else []
    entries = [e for e in study.entries if e.quick or not quick]
    jobs: list = []
    for group in dict.fromkeys(e.group for e in entries):
        in_group = [e for e in entries if e.group == group]
        for seed, e in itertools.product(seeds, in_group):  # seed-major within a group
            if e.seeds == "first" and seed != seeds[0]:
                continue
            extra = [e.quick_overlay] if quick and e.quick_overlay else []
            if e.sweep is not None:
                if seed == seeds[0]:
                    values = e.sweep.quick_values if quick else e.sweep.values
                    jobs += sweep_jobs(study, e, values, out, workers, threads, [*quick_parts, *extra, warm])
                continue
            n_threads = (2 if threads == 1 else 1) if e.threads == "other" else threads
            name = e.name.format(seed=seed, threads=n_threads)
            tags = {"lit_rl.reproduce": study.study, "lit_rl.job": name, **({"method": e.method} if e.method else {}),
                    "seed": str(seed), "threads": str(n_threads), "group": e.group, **study.tags, **e.tags}
            folder = out / "runs" / name
            overlay = _write_overlay(folder, [*e.overlay, *quick_parts, *extra, warm])
            jobs.append(fit_job(name, [*e.configs, *([str(overlay)] if overlay else [])], seed,
                                study.data_seed + seed, n_threads, out, study.experiment, tags))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{study.path}: jobs: two jobs are named {dup!r} (give each a distinct name)")
    evals = []
    for ev in study.evaluations:
        files = list(ev.configs)
        if quick and ev.quick_overlay:
            files.append(str(_write_overlay(out, [ev.quick_overlay], f"{ev.name}_quick.yaml")))
        evals += [validate_job(f"{fit.name}_{ev.name}", fit.folder, files,
                               {**fit.tags, "group": ev.name, "lit_rl.job": f"{fit.name}_{ev.name}",
                                "evaluates": fit.name}, after=fit)
                  for fit in jobs if fit.tags.get("group") in ev.of]
    pattern = study.warm_start.cache
    first_alone = pattern is None or not any(Path(cache).glob(pattern))
    return Plan(jobs, out, quick, list(seeds), threads, study, first_alone, study.warm_start.boost, evals)
