"""Double rollout's premise on a chain-sum policy, measured before any RL (and on checkpoints after it).

Two measurements of one policy (a warm-start state dict from ``runs/cache/`` or a Lightning checkpoint), made by
:mod:`lit_rl.reproduce.premise`:

1. **Lucky guesses and slips** (``premise``): T-1 samples on held-out problems, counted in the four cases trace
   right / wrong x answer right / wrong (:func:`lit_rl.tasks.chainsum.trace_correct`). A *lucky guess* is a
   rewarded sample whose trace is wrong; its share is given of the rewarded samples, with the counts. A *slip*
   is a right trace with a wrong answer, given as a share of all samples and of the unrewarded ones.
2. **The reliability study in DR Fig. 1-2's protocol** (``--reliability``), on the same policy:
   - difficulty = the policy's pass rate over ``--difficulty-samples`` K samples per prompt, drawn apart from
     the rollouts that are studied (another seed);
   - ``--rollouts`` G rollouts per prompt; each is cut at ρ of its thinking trace and ``--continuations`` N
     continuations are sampled from the cut; a rollout's continuation accuracy is their mean reward;
   - length (tertiles of the rollouts' completion lengths) crossed with difficulty (hard < 1/3 <= medium < 2/3
     <= easy), correct and incorrect rollouts apart; a cell with fewer than ``--min-count`` rollouts is not read;
   - both ways: **without** the continuation budget (each continuation may use the rest of the generation
     limit, as the paper's study applies no budget) and **with** the training budget ceil((1-ρ)·T) + buffer.

    .venv/bin/python scripts/dr_premise.py runs/cache/ar_sft_chainsum_<key>.pt \\
        --task '{"min_terms": 3, "max_terms": 5, "max_digit": 5, "answer_mod": 2}' --reliability

The last line printed is a JSON object with every figure per policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_rl.reproduce.premise import TESTBED_TASK, describe, measure  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("policies", nargs="+", help="state dicts (warm start cache) or Lightning checkpoints")
    p.add_argument("--task", default=json.dumps(TESTBED_TASK),
                   help="ChainSumTask arguments as JSON (default: the chain-sum testbed's; num_train/num_eval fixed)")
    p.add_argument("--policy", default=None, help="TinyCausalLM arguments as JSON (default: the testbed's sizes)")
    p.add_argument("--samples", type=int, default=4, help="samples per problem for the premise counts (T 1)")
    p.add_argument("--problems", type=int, default=256, help="held-out problems (the task's eval set)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reliability", action="store_true", help="also run the Fig. 1-2 study")
    p.add_argument("--difficulty-samples", type=int, default=16, help="K samples per prompt for its difficulty")
    p.add_argument("--rollouts", type=int, default=8, help="G studied rollouts per prompt")
    p.add_argument("--continuations", type=int, default=8, help="N continuations per cut")
    p.add_argument("--rho", type=float, default=0.9)
    p.add_argument("--buffer", type=int, default=16, help="the training budget's buffer (the testbed's)")
    p.add_argument("--min-count", type=int, default=20, help="fewest rollouts a table cell needs to be read")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for path in args.policies:
        r = measure(path, json.loads(args.task), args.problems, args.samples, args.seed, args.reliability,
                    args.difficulty_samples, args.rollouts, args.continuations, args.rho, args.buffer, args.min_count,
                    json.loads(args.policy) if args.policy else None)
        print(f"{path}\n\n{describe(r)}")
        results[path] = r
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
