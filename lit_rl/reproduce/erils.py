"""``python -m lit_rl reproduce erils``: ERILS Fig. 1 in miniature on the embedded Sudoku default.

The plan is ``conf/reproduce/erils.yaml`` (:mod:`lit_rl.reproduce.plan_file`: each job is fit configs plus an
overlay; ``--quick`` shrinks every run to a few steps so that a test runs it end to end):

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
5. **SPG's failure mode across learning rates**: SPG and ERILS, first seed, at 3e-4 and 1e-4, 3x and 10x below
   the main runs' 1e-3 (the paper's 3e-6 is for LoRA r 128 on LLaDA-8B and does not carry over to full
   fine-tuning of a 0.9M model), so that the report can say which settings make SPG
   collapse, which make it stay low, and whether ERILS keeps learning at each.
6. **Table XI's protocol** (after the fits): every final checkpoint of steps 1 and 5 decoded deterministically
   at three generation lengths (``conf/eval/erils_lengths.yaml``: 48 / 96 / 192 tokens, L/2 steps, all 256 puzzles), one
   ``python -m lit_rl validate`` job per checkpoint.
7. **Report** (``<out>/report.md``, :mod:`lit_rl.reproduce.erils_report`): greedy accuracy on all 256 test
   puzzles with seed bands and chance, Pass@k, per-source reward / advantage, on-policy completion length
   and format rate, the external rows' ELBO, the learning-rate and three-length tables, wall times.

``--task countdown`` runs the plan ``conf/reproduce/erils_countdown.yaml``: the same methods on miniature Countdown
(``conf/erils_countdown.yaml`` under each method's overlay, with the pool a real external model wrote;
docs/erils_countdown.md), the groups ``main``, ``threads`` and ``capacity``, and a report whose chance line is a
random expression of the right numbers.

``--only GROUP ...`` runs a part of the plan (groups ``main``, ``threads``, ``length``, ``capacity``,
``spg_lr``, ``lengths``); the report covers what has finished.

Seeds move the prompt order and rollout noise (``data.seed``), the SPG mask draws (``model.seed``) and
``seed_everything``; the initial weights and the format warm-up stay those of the config (one cached warm
start for every run). Every job is the documented ``python -m lit_rl fit`` command; finished jobs are
skipped on a re-run (:mod:`lit_rl.reproduce.runner`). ``--plan FILE`` runs another plan of this study.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lit_rl.reproduce.plan_file import StudyPlan, load_plan
from lit_rl.reproduce.plan_jobs import Plan, expand

__all__ = ["LENGTHS_EVAL", "METRIC", "PLANS", "plan", "study_plan"]

METRIC = "val/sudoku/greedy/accuracy"  # greedy cell accuracy on all 256 puzzles of SPG's test split
#: Table XI's protocol: deterministic decoding at three generation lengths (a PassAtKEvaluation overlay)
LENGTHS_EVAL = "conf/eval/erils_lengths.yaml"
#: ``--task`` -> its plan file
PLANS = {"sudoku": "conf/reproduce/erils.yaml", "countdown": "conf/reproduce/erils_countdown.yaml"}


def study_plan(task: str = "sudoku") -> StudyPlan:
    """The plan of ``task`` (:data:`PLANS`)."""
    if task not in PLANS:
        raise ValueError(f"unknown ERILS task {task!r} (known: {', '.join(PLANS)})")
    return load_plan(PLANS[task])


def plan(out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
         cache_dir: str | None = None, task: str = "sudoku") -> Plan:
    """Every job of the study on ``task``, in the order they should start (the first one builds the warm-start
    cache)."""
    return expand(study_plan(task), out, seeds, quick, workers, threads, cache_dir)
