"""``python -m lit_rl reproduce double-rollout``: the double-rollout study on the chain-sum testbed.

The plan is ``conf/reproduce/double_rollout.yaml`` (:mod:`lit_rl.reproduce.plan_file`: each job is fit configs
plus an overlay; ``--quick`` shrinks every run to a few steps so that a test runs it end to end):

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

``--testbed guess`` runs the plan ``conf/reproduce/double_rollout_guess.yaml``, the study on the testbed where DR's
premise holds (``conf/double_rollout_guess.yaml``: the
answer is the total's parity, and the warm start guesses after an inconclusive trace): the main comparison, then
ρ in {0.25, 0.5, 0.75, 0.99} and N in {2, 8} as fit jobs with every seed (the trends with their spread), then DR and
GRPO with NeMo-RL's advantages (std-normalised, leave-one-out: the paper's baseline), no length study. Its report
adds the premise statistics and the reliability study in the paper's protocol on the warm start
(:mod:`lit_rl.reproduce.premise`) and the steps to reach GRPO's best accuracy.

Every job is the documented ``python -m lit_rl fit`` / ``sweep`` command; finished jobs are skipped on a
re-run (see :mod:`lit_rl.reproduce.runner`). ``--plan FILE`` runs another plan of this study.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from lit_rl.reproduce.plan_file import StudyPlan, load_plan
from lit_rl.reproduce.plan_jobs import Plan, expand

__all__ = ["GREEDY", "METRIC", "PLANS", "plan", "study_plan"]

# held-out accuracy of T-1 samples, mean over all 4 per problem (pass@1 scores only the first)
METRIC = "val/chainsum/sampled/accuracy"
GREEDY = "val/chainsum/greedy/accuracy"
#: ``--testbed`` -> its plan file
PLANS = {"chainsum": "conf/reproduce/double_rollout.yaml", "guess": "conf/reproduce/double_rollout_guess.yaml"}


def study_plan(testbed: str = "chainsum") -> StudyPlan:
    """The plan of ``testbed`` (:data:`PLANS`)."""
    if testbed not in PLANS:
        raise ValueError(f"unknown double-rollout testbed {testbed!r} (known: {', '.join(PLANS)})")
    return load_plan(PLANS[testbed])


def plan(out: Path, seeds: Sequence[int], quick: bool, workers: int, threads: int,
         cache_dir: str | None = None, testbed: str = "chainsum") -> Plan:
    """Every job of the study on ``testbed``, in the order they should start (the first one builds the warm-start
    cache)."""
    return expand(study_plan(testbed), out, seeds, quick, workers, threads, cache_dir)
