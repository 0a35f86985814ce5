"""Run a list of ``python -m lit_rl fit`` jobs and sweep workers as subprocesses, resumably.

Each job is the documented command line (``python -m lit_rl fit --config ...``) with its own run folder,
log file and MLflow tags; a job that finished writes ``done.json`` into its folder (atomically), so a
re-run of the same plan skips it and an interrupted plan loses at most the jobs in flight. Jobs run
``workers`` at a time; a failed job is reported with its log file and the others go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.tracking import get_or_create_experiment

__all__ = ["Job", "JobResult", "fit_job", "init_stores", "run_jobs", "sweep_jobs", "validate_job"]


@dataclass
class Job:
    """One subprocess: ``argv`` after ``python -m lit_rl``; ``folder`` holds its log and ``done.json``."""

    name: str
    argv: list[str]
    folder: Path
    tags: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: after exit 0, returns why the job is not complete (e.g. a sweep whose trials failed), or None
    check: Callable[[], str | None] | None = None
    #: the job it reads (an evaluation's fit): its digest is part of this one's, so a rerun fit's evaluation
    #: is not "done" from the old checkpoint's
    after: "Job | None" = None
    #: files its command line names, written when it starts (path -> text; a plan names them by their text's hash,
    #: so the command line, and the digest, change with them)
    inputs: dict[Path, str] = field(default_factory=dict)
    #: where the job comes from, for its errors (a plan's ``file:line: jobs.<name>``)
    where: str = ""

    def write_inputs(self) -> None:
        for path, text in self.inputs.items():
            if not (path.is_file() and path.read_text() == text):
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, text)

    @property
    def digest(self) -> str:
        """What the job runs: a ``done.json`` from another command line (or of another run of the job it reads)
        does not count as done."""
        # speed and how the process starts (a rerun resumes its own checkpoint), not results
        argv = [a for a in self.argv if not a.startswith("--threads=") and a != "--ckpt_path=last"]
        what = argv if self.after is None else [argv, self.after.digest]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]

    def is_done(self) -> bool:
        try:  # a done.json without argv_sha (older runner) counts as done
            return json.loads(self.done_file.read_text()).get("argv_sha", self.digest) == self.digest
        except (OSError, ValueError, AttributeError):
            return False

    @property
    def done_file(self) -> Path:
        return self.folder / "done.json"

    @property
    def log_file(self) -> Path:
        return self.folder / "log.txt"


@dataclass
class JobResult:
    name: str
    ok: bool
    seconds: float
    skipped: bool = False
    log: str = ""


def _check(job: Job) -> str | None:
    """Why a finished job is not complete (``job.check``), or None; a check that cannot run says so."""
    if job.check is None:
        return None
    try:
        return job.check()
    except Exception as e:  # noqa: BLE001  (e.g. a worker that died before it created its study)
        return f"its check failed: {type(e).__name__}: {e}"


def _start(job: Job, threads: int) -> subprocess.Popen:
    job.write_inputs()
    job.folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(job.env)
    log = open(job.log_file, "w")
    cmd = [sys.executable, "-m", "lit_rl", *job.argv]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd())
    proc._lit_rl_log = log  # type: ignore[attr-defined]
    proc._lit_rl_t0 = time.perf_counter()  # type: ignore[attr-defined]
    return proc


def jobs_to_run(jobs: Sequence[Job]) -> int:
    """How many of ``jobs`` are not done yet (those :func:`run_jobs` will run)."""
    return sum(not job.is_done() for job in jobs)


def _raise_on_sigterm():
    """SIGTERM (``kill``, a scheduler) ends the runner through ``finally`` like Ctrl-C does, so its children
    are terminated too (Python's default SIGTERM exits without unwinding: measured, a killed runner left
    its fit running). Returns the previous handler, or None off the main thread."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


def _clear_other_run(job: Job, echo: Callable[[str], None]) -> None:
    """A fit job resumes its own checkpoints (``--ckpt_path last``), not those of a run with another command line:
    when its ``done.json`` or ``started.json`` names another digest (a changed plan), its checkpoints go first."""
    shas = []
    for marker in (job.done_file, job.folder / "started.json"):
        try:
            shas.append(json.loads(marker.read_text()).get("argv_sha"))
        except (OSError, ValueError, AttributeError):
            continue
    if job.argv[:1] != ["fit"] or all(sha in (None, job.digest) for sha in shas):
        return
    from lit_rl.config.rerun import clear_run

    gone = clear_run([job.folder / "checkpoints"], job.folder)
    if gone:
        echo(f"[reproduce] {job.name}: started with another command line; removed its {', '.join(gone)}")


def run_jobs(
    jobs: Sequence[Job], workers: int = 1, threads: int = 2, echo: Callable[[str], None] = print,
    numbered_from: int = 0, total: int | None = None,
) -> list[JobResult]:
    """Run ``jobs`` (skipping those whose ``done.json`` has the same command line), at most ``workers`` at
    once; results in order. A job is done when it exits 0 and its ``check`` (if any) finds nothing missing.

    Progress lines count ``(k/total)``; a study that calls this more than once (its first job alone, then the
    rest) passes ``numbered_from`` (jobs to run counted before) and ``total`` (the study's jobs to run,
    :func:`jobs_to_run`), so the count runs over the whole study."""
    results: dict[str, JobResult] = {}
    pending = []
    for job in jobs:
        if job.is_done():
            results[job.name] = JobResult(job.name, True, 0.0, skipped=True, log=str(job.log_file))
            echo(f"[reproduce] {job.name}: done before, skipped")
        else:
            if job.done_file.exists():
                echo(f"[reproduce] {job.name}: done with another command line before, running again")
            _clear_other_run(job, echo)
            pending.append(job)
    running: list[tuple[Job, subprocess.Popen]] = []
    total, finished = (len(pending) if total is None else total), numbered_from
    previous = _raise_on_sigterm()
    try:
        while pending or running:
            while pending and len(running) < max(1, workers):
                job = pending.pop(0)
                job.folder.mkdir(parents=True, exist_ok=True)
                atomic_write_text(job.folder / "started.json", json.dumps({"name": job.name, "argv_sha": job.digest}))
                echo(f"[reproduce] start {job.name} ({finished + len(running) + 1}/{total}); log {job.log_file}")
                running.append((job, _start(job, threads)))
            time.sleep(0.5)
            for job, proc in list(running):
                rc = proc.poll()
                if rc is None:
                    continue
                running.remove((job, proc))
                proc._lit_rl_log.close()  # type: ignore[attr-defined]
                secs = time.perf_counter() - proc._lit_rl_t0  # type: ignore[attr-defined]
                finished += 1
                why = _check(job)
                problem = why if rc == 0 else f"exit {rc}" + (f"; {why}" if why else "")
                if problem is None:
                    atomic_write_text(job.done_file, json.dumps(
                        {"name": job.name, "seconds": secs, "tags": job.tags, "argv_sha": job.digest}))
                    echo(f"[reproduce] finished {job.name} in {secs:.0f} s")
                else:
                    echo(f"[reproduce] FAILED ({problem}) {job.name} after {secs:.0f} s: see {job.log_file}")
                results[job.name] = JobResult(job.name, problem is None, secs, log=str(job.log_file))
    finally:  # interrupted (Ctrl-C, an error here): no job is left running unattended in its folder
        for _, proc in running:
            proc.terminate()
        for _, proc in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return [results[j.name] for j in jobs]


def seconds_of(folder: Path) -> float | None:
    """Wall time a finished job recorded in its ``done.json``."""
    try:
        return float(json.loads((folder / "done.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError):
        return None


def init_stores(out: Path, experiment: str) -> None:
    """Create the MLflow store, its experiment and the Optuna storage once, before jobs start in parallel:
    two processes creating one SQLite schema at once fail (measured: MLflow's migration raised "No such
    index" in the second job)."""
    import optuna
    from mlflow.tracking import MlflowClient

    out.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{(out / 'mlflow.db').resolve()}")
    get_or_create_experiment(client, experiment)
    optuna.storages.RDBStorage(f"sqlite:///{(out / 'optuna.db').resolve()}")


def fit_job(
    name: str, configs: Sequence[str], seed: int, data_seed: int, threads: int, out: Path, experiment: str,
    tags: dict[str, str], extra: Sequence[str] = (),
) -> Job:
    """A ``fit`` job of a study: ``configs`` (the job's own overlay last, :func:`lit_rl.reproduce.plan_file.expand`),
    then its seeds, threads, run folder (the checkpoints go to ``<folder>/checkpoints``) and the study's MLflow
    store, then ``extra`` arguments.

    The DataModule's own seed draws the prompt order and the rollout noise, the module's seed the masks /
    continuations: ``seed_everything`` alone changes none of them (measured: two seeds gave identical
    runs), so a seed moves all three (seed 0 with ``data_seed`` = the config as shipped)."""
    folder = out / "runs" / name
    argv = ["fit"]
    for c in configs:
        argv += ["--config", str(c)]
    argv += [
        f"--seed_everything={seed}", f"--data.init_args.seed={data_seed}", f"--model.init_args.seed={seed}",
        f"--threads={threads}",
        f"--trainer.default_root_dir={folder}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{(out / 'mlflow.db').resolve()}",
        f"--trainer.logger.init_args.experiment_name={experiment}",
        f"--trainer.logger.init_args.run_name={name}",
        f"--trainer.logger.init_args.tags={json.dumps(tags)}",
        "--ckpt_path=last",  # an interrupted job goes on from its last checkpoint (a new one starts at step 0)
        *extra,
    ]
    return Job(name, argv, folder, tags)


def sweep_jobs(study: Any, entry: Any, base: Sequence[str], values: Sequence[Any], out: Path, workers: int,
               threads: int, inputs: dict[Path, str]) -> list[Job]:
    """An Optuna grid over ``entry.sweep.key`` (a plan's sweep job: :class:`lit_rl.reproduce.plan_file.Entry` of
    :class:`~lit_rl.reproduce.plan_file.StudyPlan` ``study``) on the config files ``base`` (its configs and
    overlays; ``inputs``: the overlays' texts) at seed 0, in the study's stores: one ``python -m lit_rl sweep``
    worker per core it may use, each a job whose check names failed trials. The sweep file is named by its text's
    hash, like the overlays."""
    folder = out / "sweeps" / entry.name
    cfg = {
        "study_name": f"reproduce-{entry.name}",
        "base": list(base),
        "overrides": {"seed_everything": 0, "threads": threads},
        "space": {entry.sweep.key: {"type": "categorical", "choices": list(values)}},
        "objective": {"metric": study.metric, "direction": "maximize", "reduce": "last"},
        "sampler": {"name": "grid"},
        "pruner": {"name": "none"},
        "storage": f"sqlite:///{(out / 'optuna.db').resolve()}",
        "tracking_uri": f"sqlite:///{(out / 'mlflow.db').resolve()}",
        "experiment_name": study.experiment,
        "output_dir": str(folder),
    }
    text = yaml.safe_dump(cfg, sort_keys=False)
    path = folder / f"sweep_{hashlib.sha256(text.encode()).hexdigest()[:10]}.yaml"
    n = len(values)

    def check() -> str | None:
        """A sweep worker exits 0 when only some of its trials fail (the study goes on), and 1 when all did: either
        way a failed or pruned trial is a failed job, named here."""
        import optuna

        trials = optuna.load_study(study_name=cfg["study_name"], storage=cfg["storage"]).get_trials(deepcopy=False)
        bad = [t.number for t in trials if t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)]
        return f"trials {bad} of {cfg['study_name']} failed (see {folder}/trial_*)" if bad else None

    return [
        Job(f"sweep-{entry.name}-w{w}", ["sweep", "--config", str(path), "--n-trials", str(n)], folder / f"worker{w}",
            {"lit_rl.reproduce": study.study, "sweep": entry.name, "group": entry.group}, check=check,
            inputs={**inputs, path: text}, where=f"{entry.where}: jobs.{entry.name}")
        for w in range(max(1, min(workers, n)))
    ]


def validate_job(name: str, run_folder: Path, callback_files: Sequence[str], tags: dict[str, str],
                 ckpt: str = "checkpoints/last.ckpt", after: Job | None = None) -> Job:
    """A ``validate`` job on a finished fit's checkpoint: the fit's saved ``config.yaml`` (its MLflow store, run
    folder and settings) plus ``callback_files``, overlays that append to its callbacks (``callbacks+``). Its log
    and ``done.json`` go to ``<run folder>/<name>``; the evaluation's files to the run's ``eval/`` folder. ``after``:
    the fit job (its command line enters this job's digest, so a changed fit makes its evaluation run again)."""
    argv = ["validate", "--config", str(run_folder / "config.yaml"),
            *(a for f in callback_files for a in ("--config", str(f))), f"--ckpt_path={run_folder / ckpt}"]
    return Job(name, argv, run_folder / name, tags, after=after)
