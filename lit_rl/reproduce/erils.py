"""``python -m lit_rl reproduce erils``: ERILS Fig. 1 in miniature on the embedded Sudoku default.

The plan (``--quick`` shrinks every run to a few steps so that a test runs it end to end):

1. **Main comparison at equal budget** (``conf/erils.yaml`` and its overlays, the same optimizer updates,
   rollout batches and warm start; on Sudoku with ``conf/erils_study_recipe.yaml``, the recipe the committed
   study ran: constant lr 1e-3, exact rollouts), one run per seed: ERILS (source-specific processing, Eq. 9), on-policy
   only SPG, joint processing (Eq. 11), external rollouts only, masked-denoising SFT on the same external
   rollouts (App. C-H).
2. **Capacity check** (not a comparison): masked-denoising SFT on the pool (each prompt's first usable row, one
   update per rollout batch, 900 updates): how far the tiny model gets from the pool at all.
3. **Thread spread**: ERILS with the first seed again at the other ``--threads`` (1 vs 2): floating-point
   reduction order changes with the thread count, so this is the spread a second machine would show.
4. **Length control** (ERILS Fig. 1(b) / Fig. 4): external-only training (as Fig. 4) and ERILS on the
   uncontrolled-length pool (``data/pools/sudoku_grid_verbose.jsonl.gz``: restated puzzle, grid, column
   check, 69 tokens, longer than the policy's L_gen of 48) against the length-controlled pool of the main
   runs, from the same warm start (the grid format), so that only the pool differs.
5. **SPG's failure mode across learning rates**: SPG and ERILS, first seed, at the lower learning rates of
   :data:`LR_STUDY` (the main runs are the 1e-3 point), so that the report can say which settings make SPG
   collapse, which make it stay low, and whether ERILS keeps learning at each.
6. **Table XI's protocol** (after the fits): every final checkpoint of steps 1 and 5 decoded deterministically
   at three generation lengths (:data:`LENGTHS_EVAL`: 48 / 96 / 192 tokens, L/2 steps, all 256 puzzles), one
   ``python -m lit_rl validate`` job per checkpoint.
7. **Report** (``<out>/report.md``, :mod:`lit_rl.reproduce.erils_report`): greedy accuracy on all 256 test
   puzzles with seed bands and chance, Pass@k, per-source reward / advantage, on-policy completion length
   and format rate, the external rows' ELBO, the learning-rate and three-length tables, wall times.

``--task countdown`` runs the same methods on miniature Countdown (``conf/erils_countdown.yaml`` under each
method's overlay, with the pool a real external model wrote; docs/erils_countdown.md): the groups ``main``,
``threads`` and ``capacity``, and a report whose chance line is a random expression of the right numbers.

``--only GROUP ...`` runs a part of the plan (groups ``main``, ``threads``, ``length``, ``capacity``,
``spg_lr``, ``lengths``); the report covers what has finished.

Seeds move the prompt order and rollout noise (``data.seed``), the SPG mask draws (``model.seed``) and
``seed_everything``; the initial weights and the format warm-up stay those of the config (one cached warm
start for every run). Every job is the documented ``python -m lit_rl fit`` command; finished jobs are
skipped on a re-run (:mod:`lit_rl.reproduce.runner`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.reproduce.runner import Job, callbacks_of, fit_job, init_stores as _init_stores, validate_job

__all__ = ["EXPERIMENT", "LENGTHS_EVAL", "LR_STUDY", "METHODS", "METRIC", "TASKS", "Plan", "TaskSetup", "init_stores",
           "lengths_job", "plan"]

EXPERIMENT = "lit_rl-reproduce-erils"
METRIC = "val/sudoku/greedy/accuracy"  # greedy cell accuracy on all 256 puzzles of SPG's test split
BASE = "conf/erils.yaml"
#: the recipe the committed Sudoku study ran (constant lr 1e-3, exact rollouts): the Sudoku runs add it on BASE
STUDY_RECIPE = "conf/erils_study_recipe.yaml"
DATA_SEED = 42  # data.init_args.seed of BASE
UNCONTROLLED_POOL = "data/pools/sudoku_grid_verbose.jsonl.gz"
METHODS = {  # name: config files (overlays on BASE)
    "erils": [BASE],
    "spg": [BASE, "conf/spg.yaml"],
    "joint": [BASE, "conf/erils_joint.yaml"],
    "external_only": [BASE, "conf/erils_external_only.yaml"],
    "sft": [BASE, "conf/erils_sft.yaml"],
}
#: the capacity check (not a comparison): can the tiny model learn the task from the pool at all?
CAPACITY_CLI = ["--data.init_args.g_ext=1", "--model.init_args.updates_per_batch=1", "--trainer.max_steps=900",
                "--trainer.val_check_interval=150"]
QUICK_METHODS = ("erils", "sft")  # one run of each LightningModule, for the smoke test
#: learning rates of the SPG failure-mode runs (SPG and ERILS, first seed); the main runs are conf/erils.yaml's
#: 1e-3. The paper's 3e-6 is for LoRA r 128 on LLaDA-8B and does not carry over to full fine-tuning of a 0.9M
#: model; 3e-4 and 1e-4 are 3x and 10x below the embedded rate (1e-4: ERILS still learns within the budget)
LR_STUDY = (3e-4, 1e-4)
BASE_LR = 1e-3  # STUDY_RECIPE's (a test checks the two agree)
#: Table XI's protocol: deterministic decoding at three generation lengths (a PassAtKEvaluation entry)
LENGTHS_EVAL = "conf/eval/erils_lengths.yaml"


@dataclass(frozen=True)
class TaskSetup:
    """What the study changes with ``--task``: the overlays after :data:`BASE` (before each method's own), the
    pool SPG takes its prompt order from, the job groups, and the report's wording."""

    name: str
    overlays: tuple[str, ...]
    pool: str
    groups: tuple[str, ...]
    title: str
    measure: str  # what the metric counts, for the report
    eval_set: str

    @property
    def metric(self) -> str:
        return f"val/{self.name}/greedy/accuracy"

    def pass_at(self, k: int) -> str:
        return f"val/{self.name}/multi/pass_at_{k}"


TASKS = {
    "sudoku": TaskSetup("sudoku", (STUDY_RECIPE,), "data/pools/sudoku_grid.jsonl.gz",
                        ("main", "threads", "length", "capacity", "spg_lr", "lengths"),
                        "ERILS on the embedded Sudoku default (ERILS Fig. 1 in miniature)", "greedy cell accuracy",
                        "all 256 puzzles of SPG's test split"),
    # Table I's second task: miniature Countdown with the pool a real external model wrote (docs/erils_countdown.md)
    "countdown": TaskSetup("countdown", ("conf/erils_countdown.yaml",), "data/pools/countdown_ordered.jsonl.gz",
                           ("main", "threads", "capacity"),
                           "ERILS on miniature Countdown (a second task of ERILS Table I)", "greedy accuracy",
                           "256 generated test problems"),
}


@dataclass
class Plan:
    jobs: list[Job]
    out: Path
    quick: bool
    seeds: list[int]
    threads: int
    #: no warm start is cached yet: run the first job alone, so that the others load its cache
    first_alone: bool = True
    #: never give the first job more threads when it runs alone: the thread count is part of the result
    #: here (the thread-spread run), and a tag names it
    boost_first: bool = False
    #: jobs that read the fits' checkpoints (the three-length evaluation): they run after every fit
    eval_jobs: list[Job] = field(default_factory=list)


def _quick_cli() -> list[str]:
    """A few steps of everything, sized for a test (about 20 s per fit on 2 cores)."""
    return [
        "--trainer.max_steps=8", "--trainer.val_check_interval=1",  # two rollout batches of 4 updates
        "--data.init_args.eval_size=16",
        "--data.init_args.prompts_per_batch=2",
    ]


def _callback_edits(configs: Sequence[str], cache_dir: str, quick: bool) -> list[dict[str, Any]]:
    """The ``callbacks~`` edits of a job (:func:`~lit_rl.reproduce.runner.fit_job`): the study's warm-up cache and,
    in quick mode, fewer warm-up steps and a smaller Pass@k; every other callback stays the configs' own."""
    edits: list[dict[str, Any]] = []
    for cb in callbacks_of(configs):
        path, args = cb.get("class_path", ""), cb.get("init_args") or {}
        if path.endswith("FormatWarmup"):
            edits.append({"class_path": path, "init_args": {"cache_dir": cache_dir, **({"steps": 5} if quick else {})}})
        elif path.endswith("PassAtKEvaluation") and quick:
            named = {"name": args["name"]} if "name" in args else {}
            edits.append({"class_path": path, "init_args": {
                **named, "subset_size": 8, "batch_size": 8, "every_n_steps": 8, "start_step": 8,
                "configs": [{**c, "num_samples": 2} for c in args.get("configs", [])]}})
    return edits


def method_configs(method: str, task: str = "sudoku") -> tuple[list[str], list[str]]:
    """The config files of ``method`` on ``task`` (BASE, the task's overlays, the method's overlay) and the
    command-line keys the task adds (SPG takes its prompt order from the task's pool)."""
    setup = TASKS[task]
    configs = [METHODS[method][0], *setup.overlays, *METHODS[method][1:]]
    # conf/spg.yaml takes its prompt order from the Sudoku pool; another task's SPG takes it from that task's pool
    keys = [f"--data.init_args.prompt_order_pool={setup.pool}"] if method == "spg" and task != "sudoku" else []
    return configs, keys


def _fit_job(
    name: str, method: str, seed: int, out: Path, threads: int, quick: bool, cache_dir: str,
    extra: Sequence[str] = (), tags: dict[str, str] | None = None, task: str = "sudoku",
) -> Job:
    configs, keys = method_configs(method, task)
    edits = _callback_edits(configs, cache_dir, quick)
    tags = {"lit_rl.reproduce": "erils", "lit_rl.job": name, "method": method, "seed": str(seed),
            "threads": str(threads), "task": task, **(tags or {})}
    return fit_job(name, configs, edits, seed, DATA_SEED + seed, threads, out, EXPERIMENT, tags,
                   [*(_quick_cli() if quick else []), *keys, *extra])


def init_stores(out: Path) -> None:
    """Create the MLflow store and its experiment before jobs start in parallel."""
    _init_stores(out, EXPERIMENT)


def plan(out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
         cache_dir: str | None = None, task: str = "sudoku") -> Plan:
    """Every job of the study on ``task`` (:data:`TASKS`), in the order they should start (the first one builds
    the warm-start cache). Countdown runs the groups ``main``, ``threads`` and ``capacity``."""
    out = Path(out)
    cache = cache_dir or (str(out / "cache") if quick else "runs/cache")
    groups = TASKS[task].groups
    jobs: list[Job] = []
    methods = QUICK_METHODS if quick else tuple(METHODS)

    def add(name: str, method: str, seed: int, extra: Sequence[str] = (), tags: dict[str, str] | None = None,
            n_threads: int = threads) -> None:
        if (tags or {}).get("group") in groups:
            jobs.append(_fit_job(name, method, seed, out, n_threads, quick, cache, extra, tags, task))

    for seed in seeds:
        for method in methods:
            add(f"{method}_s{seed}", method, seed, tags={"group": "main"})
    s0 = seeds[0]
    if not quick:  # the same run at the other thread count: the spread a second machine would show
        other = 2 if threads == 1 else 1
        add(f"erils_s{s0}_t{other}", "erils", s0, tags={"group": "threads"}, n_threads=other)
    # Fig. 4 trains external-only on each pool (on-policy only as the reference); ERILS on each pool too
    for method in ("external_only", "erils") if not quick else ("erils",):
        add(f"{method}_uncontrolled_s{s0}", method, s0, [f"--data.init_args.pool_path={UNCONTROLLED_POOL}"],
            {"group": "length"})
    if not quick:  # the capacity check: SFT, one pool row per prompt, one update per batch, longer
        add(f"sft_capacity_s{s0}", "sft", s0, CAPACITY_CLI, {"group": "capacity"})
    for lr in () if quick else LR_STUDY:  # SPG's failure mode: SPG and ERILS at lower learning rates
        for method in ("spg", "erils"):
            add(f"{method}_lr{lr:g}_s{s0}", method, s0, [f"--model.init_args.optimizer.init_args.lr={lr}"],
                {"group": "spg_lr", "lr": f"{lr:g}"})
    evals = [lengths_job(j, out, quick) for j in jobs if j.tags.get("group") in ("main", "spg_lr")] \
        if "lengths" in groups else []
    first_alone = not any(Path(cache).glob(f"format_warmup_{task}_*.pt"))
    return Plan(jobs, out, quick, list(seeds), threads, first_alone, eval_jobs=evals)


def lengths_job(fit: Job, out: Path, quick: bool = False) -> Job:
    """Table XI's protocol on ``fit``'s final checkpoint: ``python -m lit_rl validate`` with the fit's saved config
    plus :data:`LENGTHS_EVAL` (quick: and an overlay that edits it to the first 8 puzzles); the numbers land in
    ``<run>/eval/passk_lengths_validate_report.json``."""
    entries = [LENGTHS_EVAL]
    if quick:  # an edit of the appended evaluation: 8 puzzles
        (cb,) = yaml.safe_load(Path(LENGTHS_EVAL).read_text())["trainer"]["callbacks+"]
        edit = {"class_path": cb["class_path"], "init_args": {"name": cb["init_args"]["name"], "subset_size": 8,
                                                              "batch_size": 8}}
        Path(out).mkdir(parents=True, exist_ok=True)
        quick_file = Path(out) / "erils_lengths_quick.yaml"
        atomic_write_text(quick_file, yaml.safe_dump({"trainer": {"callbacks~": [edit]}}, sort_keys=False))
        entries.append(str(quick_file))
    return validate_job(f"{fit.name}_lengths", fit.folder, entries,
                        {**fit.tags, "group": "lengths", "lit_rl.job": f"{fit.name}_lengths", "evaluates": fit.name},
                        after=fit)
