"""How a chain-sum policy's sampled answers relate to their traces (the double-rollout premise).

For each policy (a warm-start state dict from ``runs/cache/`` or a Lightning checkpoint of a run), sample
completions at T 1 on held-out problems and count the four cases: trace right / wrong x answer right / wrong.
"Correct but unsupported" (wrong trace, right answer) is what the outcome reward credits and double
rollout's continuations should not.

    .venv/bin/python scripts/chainsum_premise.py runs/cache/ar_sft_chainsum_<key>.pt \\
        runs/reproduce/double_rollout/runs/dr_s0/checkpoints/last.ckpt --samples 4

The last line printed is a JSON object with the counts per policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_rl.generation.ar import HFBackend  # noqa: E402
from lit_rl.models.ar import TinyCausalLM  # noqa: E402
from lit_rl.tasks import ChainSumTask  # noqa: E402
from lit_rl.tasks.chainsum import parse_int_answer, trace_correct  # noqa: E402


def classify(policy, task: ChainSumTask, examples, samples: int, seed: int) -> dict[str, float]:
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], 32)
    comp = HFBackend(policy).generate(ids, mask, max_new_tokens=48, temperature=1.0, n=samples, seed=seed)
    counts = {"trace_ok_answer_ok": 0, "trace_ok_answer_wrong": 0, "trace_wrong_answer_ok": 0,
              "trace_wrong_answer_wrong": 0}
    for k, text in enumerate(policy.decode_completions(comp)):
        ex = examples[k // samples]
        t_ok = trace_correct(text, ex.meta["numbers"])
        a_ok = parse_int_answer(text) == int(ex.answer)
        counts[f"trace_{'ok' if t_ok else 'wrong'}_answer_{'ok' if a_ok else 'wrong'}"] += 1
    n = sum(counts.values())
    out = {k: v / n for k, v in counts.items()}
    correct = out["trace_ok_answer_ok"] + out["trace_wrong_answer_ok"]
    out["accuracy"] = correct
    out["unsupported_share_of_correct"] = out["trace_wrong_answer_ok"] / correct if correct else 0.0
    out["n"] = n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("policies", nargs="+", help="state dicts (warm start cache) or Lightning checkpoints")
    p.add_argument("--samples", type=int, default=4, help="samples per problem (T 1)")
    p.add_argument("--problems", type=int, default=256, help="held-out problems (the task's eval set)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    task = ChainSumTask(num_train=2000, num_eval=256, min_terms=3, max_terms=5, max_digit=5)
    examples = task.eval_examples()[: args.problems]
    results = {}
    for path in args.policies:
        policy = TinyCausalLM(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_positions=256)
        policy.load_init_checkpoint(path)
        r = classify(policy, task, examples, args.samples, args.seed)
        results[path] = r
        print(f"{path}: accuracy {r['accuracy']:.3f}; trace right/answer right {r['trace_ok_answer_ok']:.3f}, "
              f"trace wrong/answer right {r['trace_wrong_answer_ok']:.3f} ({r['unsupported_share_of_correct']:.1%} "
              f"of correct), trace right/answer wrong {r['trace_ok_answer_wrong']:.3f}, both wrong "
              f"{r['trace_wrong_answer_wrong']:.3f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
