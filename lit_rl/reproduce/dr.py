"""``python -m lit_rl reproduce double-rollout``: the double-rollout study on the chain-sum testbed.

The plan (``--quick`` shrinks every run to a few steps so that a test runs it end to end):

1. **Main comparison**: double rollout (ρ 0.9, N 4), vanilla GRPO (G 16) and GRPO with a large rollout
   (G·N = 64) from the same warm start, at equal RL steps, one run per seed
   (``conf/double_rollout_chainsum.yaml`` and its two overlays).
2. **ρ and N trends** (DR Tables 2-3 in miniature) through Optuna grid sweeps on the same base: ρ in
   {0.5, 0.75, 0.99} and N in {2, 8}; ρ 0.9 / N 4 is the main run of the first seed, N 1 is vanilla GRPO.
3. **Length terms** on a verbose teacher whose correct solutions differ in length: GRPO, GRPO with Arora &
   Zanette's penalty, DR, DR with the upward length bonus (DR Fig. 3).
4. **Report** (``<out>/report.md``): held-out sampled accuracy curves with seed bands against RL steps and
   against generated rollout tokens (equal compute), the reliability table of the DR runs (DR Fig. 1-2),
   the ρ / N trends, and accuracy vs tokens (Pareto), from the run's own MLflow store.

``--testbed guess`` runs the study on the testbed where DR's premise holds (``conf/double_rollout_guess.yaml``: the
answer is the total's parity, and the warm start guesses after an inconclusive trace): the main comparison, then
ρ in {0.25, 0.5, 0.75, 0.99} and N in {2, 8} as fit jobs with every seed (the trends with their spread), then DR and
GRPO with NeMo-RL's advantages (std-normalised, leave-one-out: the paper's baseline), no length study. Its report
adds the premise statistics and the reliability study in the paper's protocol on the warm start
(:mod:`lit_rl.reproduce.premise`) and the steps to reach GRPO's best accuracy.

Every job is the documented ``python -m lit_rl fit`` / ``sweep`` command; finished jobs are skipped on a
re-run (see :mod:`lit_rl.reproduce.runner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.reproduce.runner import Job, callbacks_of, fit_job, init_stores as _init_stores

__all__ = ["EXPERIMENT", "METRIC", "Plan", "TESTBEDS", "init_stores", "method_configs", "plan"]

EXPERIMENT = "lit_rl-reproduce-double-rollout"
# held-out accuracy of T-1 samples, mean over all 4 per problem (pass@1 scores only the first)
METRIC = "val/chainsum/sampled/accuracy"
GREEDY = "val/chainsum/greedy/accuracy"
BASE = "conf/double_rollout_chainsum.yaml"
DATA_SEED = 42  # data.init_args.seed of BASE
METHODS = {
    "dr": [BASE],
    "grpo": [BASE, "conf/grpo_chainsum.yaml"],
    "grpo_large": [BASE, "conf/grpo_large_chainsum.yaml"],
}
#: testbed name -> overlays applied after BASE and before the method's own overlay
TESTBEDS = {"chainsum": [], "guess": ["conf/double_rollout_guess.yaml"]}
RHO_GRID = (0.5, 0.75, 0.99)  # plus the main run's 0.9
N_GRID = (2, 8)  # plus GRPO (N 1) and the main run's 4
GUESS_RHO = (0.25, 0.5, 0.75, 0.99)  # the guess testbed's ρ trend (values below 0.5 too), every seed
GUESS_N = (2, 8)
#: NeMo-RL's GRPO advantages (the paper's baseline implementation: std-normalised, leave-one-out; docs/double_rollout.md
#: "The GRPO baseline"), as CLI overrides; the testbed's default is Dr. GRPO (mean-centred, no std division)
NEMO_RL = ["--model.init_args.loss.scale_std=true", "--model.init_args.loss.leave_one_out=true",
           "--model.init_args.loss.std_of=baseline", "--model.init_args.loss.std_eps=1e-6"]
#: the guess testbed's extra methods: name -> (method, CLI overrides), every seed
GUESS_EXTRA = {"dr_nemo": ("dr", NEMO_RL), "grpo_nemo": ("grpo", NEMO_RL)}
#: the length study runs on the VERBOSE teacher (restatements after half of the steps, so correct solutions
#: differ in length; with the plain teacher a correct trace is one fixed string and length terms see z = 0)
LENGTH_CLI = ["--data.init_args.generation.max_new_tokens=64", "--data.init_args.eval_generation.max_new_tokens=64"]
LENGTH_RUNS = {  # name: (method, CLI overrides); quick mode runs the last two
    "grpo_verbose": ("grpo", []),
    "dr_verbose": ("dr", []),
    "grpo_az_verbose": ("grpo", ["--model.init_args.double_rollout.length_penalty=0.2"]),
    "dr_bonus_verbose": ("dr", ["--model.init_args.double_rollout.length_bonus=1.0"]),
}


@dataclass
class Plan:
    jobs: list[Job]
    out: Path
    quick: bool
    seeds: list[int]
    testbed: str = "chainsum"
    #: no warm start is cached yet: run the first job alone, so that the others load its cache instead of
    #: each repeating the SFT (a guess from the cache folder: a stale entry only costs parallelism)
    first_alone: bool = True
    #: the first job, alone, may use every thread the workers would share
    boost_first: bool = True


def _quick_cli(method: str) -> list[str]:
    """A few steps of everything, sized for a test (about 20 s per fit on 2 cores)."""
    G = 8 if method == "grpo_large" else 4
    return [
        "--trainer.max_steps=4", "--trainer.val_check_interval=1",
        "--data.init_args.task.init_args.num_train=64", "--data.init_args.task.init_args.num_eval=16",
        "--data.init_args.eval_size=16", "--data.init_args.prompts_per_batch=2",
        f"--data.init_args.num_generations={G}", "--model.init_args.double_rollout.num_continuations=2",
    ]


def _quick_overrides() -> dict[str, Any]:
    """The same, as a sweep overlay (nested keys)."""
    return {
        "trainer": {"max_steps": 4, "val_check_interval": 1},
        "data": {"init_args": {
            "task": {"init_args": {"num_train": 64, "num_eval": 16}}, "eval_size": 16, "prompts_per_batch": 2,
            "num_generations": 4,
        }},
        "model": {"init_args": {"double_rollout": {"num_continuations": 2}}},
    }


def _callback_edits(configs: Sequence[str], cache_dir: str, quick: bool, verbose: bool = False) -> list[dict[str, Any]]:
    """The ``callbacks~`` edits of a job (:func:`~lit_rl.reproduce.runner.fit_job`): the study's warm-start cache,
    fewer warm-up steps and a smaller Pass@k in quick mode; ``verbose``: the warm start on the verbose teacher and
    64-token completions. Every other callback stays the configs' own."""
    edits: list[dict[str, Any]] = []
    for cb in callbacks_of(configs):
        path, args = cb.get("class_path", ""), cb.get("init_args") or {}
        if path.endswith("ScriptedSFTWarmup"):
            warm: dict[str, Any] = {"cache_dir": cache_dir}
            if quick:
                warm["steps"] = 20
            if verbose:
                warm.update(trace="verbose", max_completion_len=64)
            edits.append({"class_path": path, "init_args": warm})
        elif path.endswith("PassAtKEvaluation") and (quick or verbose):
            passk: dict[str, Any] = {"name": args["name"]} if "name" in args else {}
            if quick:
                passk.update(subset_size=8, batch_size=8, every_n_steps=1000, start_step=1000)
            configs_ = args.get("configs", [])  # callbacks_of gave a copy; the edit writes the list whole
            for c in configs_:
                if quick:
                    c["num_samples"] = 2
                if verbose:
                    c["generation"]["init_args"]["max_new_tokens"] = 64
            edits.append({"class_path": path, "init_args": {**passk, "configs": configs_}})
    return edits


def method_configs(method: str, testbed: str = "chainsum") -> list[str]:
    """The config files of ``method`` on ``testbed``: BASE, the testbed's overlays, the method's overlay."""
    if testbed not in TESTBEDS:
        raise ValueError(f"unknown double-rollout testbed {testbed!r} (known: {', '.join(TESTBEDS)})")
    base, *rest = METHODS[method]
    return [base, *TESTBEDS[testbed], *rest]


def _fit_job(
    name: str, method: str, seed: int, out: Path, threads: int, quick: bool, cache_dir: str,
    extra: Sequence[str] = (), tags: dict[str, str] | None = None, verbose: bool = False, testbed: str = "chainsum",
) -> Job:
    configs = method_configs(method, testbed)
    edits = _callback_edits(configs, cache_dir, quick, verbose)
    tags = {"lit_rl.reproduce": "double-rollout", "lit_rl.job": name, "method": method, "seed": str(seed),
            **(tags or {})}
    # the warm start stays the same across seeds
    cli = [*(_quick_cli(method) if quick else []), *(LENGTH_CLI if verbose else []), *extra]
    return fit_job(name, configs, edits, seed, DATA_SEED + seed, threads, out, EXPERIMENT, tags, cli)


def _sweep_jobs(
    study: str, key: str, values: Sequence[Any], out: Path, workers: int, threads: int, quick: bool, cache_dir: str,
) -> list[Job]:
    folder = out / "sweeps" / study
    folder.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, Any] = _quick_overrides() if quick else {}
    overrides.setdefault("trainer", {})["callbacks~"] = _callback_edits([BASE], cache_dir, quick)
    overrides.update(seed_everything=0, threads=threads)
    cfg = {
        "study_name": f"reproduce-{study}",
        "base": [BASE],
        "overrides": overrides,
        "space": {key: {"type": "categorical", "choices": list(values)}},
        "objective": {"metric": METRIC, "direction": "maximize", "reduce": "last"},
        "sampler": {"name": "grid"},
        "pruner": {"name": "none"},
        "storage": f"sqlite:///{(out / 'optuna.db').resolve()}",
        "tracking_uri": f"sqlite:///{(out / 'mlflow.db').resolve()}",
        "experiment_name": EXPERIMENT,
        "output_dir": str(folder),
    }
    path = folder / "sweep.yaml"
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    n = len(values)

    def check() -> str | None:
        """A sweep worker exits 0 when only some of its trials fail (the study goes on), and 1 when all did: either
        way a failed or pruned trial is a failed job, named here."""
        import optuna

        trials = optuna.load_study(study_name=cfg["study_name"], storage=cfg["storage"]).get_trials(deepcopy=False)
        bad = [t.number for t in trials if t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)]
        return f"trials {bad} of {cfg['study_name']} failed (see {folder}/trial_*)" if bad else None

    return [
        # "--n-trials" (accepted alias of --n_trials) kept: it is part of finished jobs' command-line digest
        Job(f"sweep-{study}-w{w}", ["sweep", "--config", str(path), "--n-trials", str(n)], folder / f"worker{w}",
            {"lit_rl.reproduce": "double-rollout", "sweep": study}, check=check)
        for w in range(max(1, min(workers, n)))
    ]


def init_stores(out: Path) -> None:
    """Create the MLflow store, its experiment and the Optuna storage before jobs start in parallel."""
    _init_stores(out, EXPERIMENT)


def _guess_plan(out: Path, seeds: Sequence[int], quick: bool, threads: int, cache: str) -> list[Job]:
    """The guess testbed: the main comparison, then the ρ and N trends as fit jobs with every seed."""
    tb = {"testbed": "guess"}
    jobs = [_fit_job(f"{m}_s{s}", m, s, out, threads, quick, cache, tags={"group": "main", **tb}, testbed="guess")
            for s in seeds for m in METHODS]
    for key, values in (("rho", GUESS_RHO[:1] if quick else GUESS_RHO), ("n", GUESS_N[:1] if quick else GUESS_N)):
        field = "rho" if key == "rho" else "num_continuations"
        for v in values:
            for s in seeds:
                jobs.append(_fit_job(f"dr_{key}{v:g}_s{s}", "dr", s, out, threads, quick, cache,
                                     [f"--model.init_args.double_rollout.{field}={v}"],
                                     {"group": key, key: f"{v:g}", **tb}, testbed="guess"))
    for name, (method, extra) in GUESS_EXTRA.items():  # after the others: the study's first 27 jobs keep their order
        for s in seeds:
            jobs.append(_fit_job(f"{name}_s{s}", method, s, out, threads, quick, cache, extra,
                                 {"group": "nemo", **tb}, testbed="guess"))
    return jobs


def plan(out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
         cache_dir: str | None = None, testbed: str = "chainsum") -> Plan:
    """Every job of the study, in the order they should start (the first one builds the warm-start cache)."""
    out = Path(out)
    cache = cache_dir or (str(out / "cache") if quick else "runs/cache")
    if testbed != "chainsum":
        method_configs("dr", testbed)  # a clear error for an unknown testbed
        jobs = _guess_plan(out, seeds, quick, threads, cache)
        return Plan(jobs, out, quick, list(seeds), testbed)  # the first job alone: its own warm start
    jobs: list[Job] = []
    for seed in seeds:
        for method in METHODS:
            jobs.append(_fit_job(f"{method}_s{seed}", method, seed, out, threads, quick, cache, tags={"group": "main"}))
    rho = RHO_GRID[:1] if quick else RHO_GRID
    n = N_GRID[:1] if quick else N_GRID
    jobs += _sweep_jobs("rho", "model.init_args.double_rollout.rho", rho, out, workers, threads, quick, cache)
    jobs += _sweep_jobs("n", "model.init_args.double_rollout.num_continuations", n, out, workers, threads, quick, cache)
    length_runs = list(LENGTH_RUNS.items())[2:] if quick else list(LENGTH_RUNS.items())
    for name, (method, extra) in length_runs:
        jobs.append(_fit_job(f"{name}_s{seeds[0]}", method, seeds[0], out, threads, quick, cache, extra,
                             {"group": "length"}, verbose=True))
    first_alone = not any(Path(cache).glob("ar_sft_chainsum_*.pt"))
    return Plan(jobs, out, quick, list(seeds), testbed, first_alone)
