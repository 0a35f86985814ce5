"""A plan's jobs (:func:`expand`): each fit is its configs plus its overlays, each overlay its own ``--config`` file.

The CLI composes a job's files as it composes any configs (mappings key by key, ``callbacks+`` appends and
``callbacks~`` edits file after file), so a job means exactly what its plan entry says, however its parts combine.
An overlay file is named by a hash of its text (``<run folder>/overlay_<hash>.yaml``): a changed plan changes the
job's command line, so its ``done.json`` no longer counts (:attr:`lit_rl.reproduce.runner.Job.digest`), and a
finished run's files are never rewritten. The files are written when a job starts
(:meth:`~lit_rl.reproduce.runner.Job.write_inputs`), so a rejected command (a wrong ``--only``, ``--report_only``)
writes nothing. :func:`check_jobs` runs the fit preflight on every job before any starts.
"""

from __future__ import annotations

import hashlib
import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from lit_rl.errors import ConfigError
from lit_rl.reproduce.plan_file import Entry, StudyPlan
from lit_rl.reproduce.runner import Job, fit_job, sweep_jobs, validate_job

__all__ = ["Plan", "check_jobs", "expand", "overlay_file"]


@dataclass
class Plan:
    """The jobs of one run of a study."""

    jobs: list[Job]
    study: StudyPlan
    #: no warm start is cached yet: run the first job alone, so that the others load its cache
    first_alone: bool = True
    #: the first job, alone, may use every thread the workers would share
    boost_first: bool = False
    #: jobs that read the fits' checkpoints: they run after every fit
    eval_jobs: list[Job] = field(default_factory=list)


def overlay_file(folder: Path, label: str, part: dict[str, Any], inputs: dict[Path, str]) -> str:
    """The path of ``part`` as a YAML file in ``folder`` named by its text's hash; the text goes into ``inputs``."""
    text = yaml.safe_dump(part, sort_keys=False)
    path = folder / f"{label}_{hashlib.sha256(text.encode()).hexdigest()[:10]}.yaml"
    inputs[path] = text
    return str(path)


def _parts(study: StudyPlan, e: Entry, quick: bool, warm: dict[str, Any]) -> list[tuple[str, Any]]:
    """A job's overlays in order: its own, the plan's quick (a mapping or a file), its own quick, the warm start."""
    parts: list[tuple[str, Any]] = [("overlay" if i == 0 else f"overlay{i + 1}", o) for i, o in enumerate(e.overlay)]
    if quick and study.quick:
        parts.append(("quick", study.quick))
    if quick and e.quick_overlay:
        parts.append(("quick_job", e.quick_overlay))
    if warm:
        parts.append(("warm_start", warm))
    return parts


def _files(folder: Path, parts: list[tuple[str, Any]], inputs: dict[Path, str]) -> list[str]:
    return [p if isinstance(p, str) else overlay_file(folder, label, p, inputs) for label, p in parts]


def check_jobs(jobs: Sequence[Job]) -> None:
    """Run the fit preflight on each fit job's command line (its overlays written to a temporary folder first) and
    each sweep's grid on its base; a problem raises :class:`~lit_rl.errors.ConfigError` naming the plan's line and
    job, then the config file and line the preflight found."""
    from lit_rl.config.preflight import preflight
    from lit_rl.sweep.schema import SweepConfig
    from lit_rl.sweep.validate import check_against_base

    with tempfile.TemporaryDirectory(prefix="lit_rl-plan-check-") as tmp:
        for job in jobs:
            if job.argv[0] not in ("fit", "sweep"):
                continue
            moved = {str(p): str(Path(tmp) / f"{i}_{p.name}") for i, p in enumerate(job.inputs)}
            for p, text in job.inputs.items():
                Path(moved[str(p)]).write_text(text)
            argv = [moved.get(a, a) for a in job.argv]
            try:
                if argv[0] == "fit":
                    preflight(argv, data=False)
                else:
                    raw = yaml.safe_load(Path(argv[2]).read_text())
                    raw["base"] = [moved.get(b, b) for b in raw["base"]]
                    Path(argv[2]).write_text(yaml.safe_dump(raw))
                    check_against_base(SweepConfig.from_yaml(argv[2]))
            except (ConfigError, ValueError) as e:
                msg = str(e)
                for old, new in moved.items():
                    msg = msg.replace(new, old)
                raise ConfigError(f"{job.where or job.name}: {msg}") from None


def expand(study: StudyPlan, out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
           cache_dir: str | None = None, write: bool = True) -> Plan:
    """Every job of ``study`` for these seeds (quick: only the jobs marked ``quick``, with the quick overlays), in
    the order they should start. ``write``: write every job's files now (the CLI writes each job's when it starts)."""
    out = Path(out)
    if not seeds:
        raise ValueError("a study needs at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"each seed once, got {list(seeds)}")
    cache = cache_dir or (str(out / "cache") if quick else "runs/cache")
    warm = ({"trainer": {"callbacks~": [{"class_path": study.warm_start.callback, "init_args": {"cache_dir": cache}}]}}
            if study.warm_start.callback else {})
    entries = [e for e in study.entries if e.quick or not quick]
    jobs: list[Job] = []
    for group in dict.fromkeys(e.group for e in entries):
        in_group = [e for e in entries if e.group == group]
        for seed, e in itertools.product(seeds, in_group):  # seed-major within a group
            if (e.seeds == "first" or e.sweep is not None) and seed != seeds[0]:
                continue
            parts = _parts(study, e, quick, warm)
            if e.sweep is not None:
                values = e.sweep.quick_values if quick else e.sweep.values
                folder, inputs = out / "sweeps" / e.name, {}
                base = [*e.configs, *_files(folder, parts, inputs)]
                jobs += sweep_jobs(study, e, base, values, out, workers, threads, inputs)
                continue
            n_threads = (2 if threads == 1 else 1) if e.threads == "other" else threads
            name = e.name.format(seed=seed, threads=n_threads)
            tags = {**study.tags, **e.tags, "lit_rl.reproduce": study.study, "lit_rl.job": name,
                    **({"method": e.method} if e.method else {}), "seed": str(seed), "threads": str(n_threads),
                    "group": e.group}
            inputs: dict[Path, str] = {}
            files = _files(out / "runs" / name, parts, inputs)
            job = fit_job(name, [*e.configs, *files], seed, study.data_seed + seed, n_threads, out, study.experiment,
                          tags)
            job.inputs, job.where = inputs, f"{e.where}: jobs.{e.name}"
            jobs.append(job)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{study.path}: jobs: two jobs are named {dup!r} (give each a distinct name)")
    evals = []
    for ev in study.evaluations:
        inputs = {}
        files = list(ev.configs)
        if quick and ev.quick_overlay:
            files.append(overlay_file(out, f"{ev.name}_quick", ev.quick_overlay, inputs))
        for fit in (j for j in jobs if j.argv[0] == "fit" and j.tags.get("group") in ev.of):
            job = validate_job(f"{fit.name}_{ev.name}", fit.folder, files,
                               {**fit.tags, "group": ev.name, "lit_rl.job": f"{fit.name}_{ev.name}",
                                "evaluates": fit.name}, after=fit)
            job.inputs = dict(inputs)
            evals.append(job)
    pattern = study.warm_start.cache
    first_alone = study.warm_start.callback is not None and (pattern is None or not any(Path(cache).glob(pattern)))
    plan = Plan(jobs, study, first_alone, study.warm_start.boost, evals)
    if write:
        for job in [*jobs, *evals]:
            job.write_inputs()
    return plan
