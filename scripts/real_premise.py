"""Double rollout's premise on a real model's own traces (docs/real_model.md), measured before any RL.

SmolLM2-135M-Instruct (or a checkpoint of it) samples ``--samples`` completions per held-out word problem at the
training temperature and length; each is judged twice (:mod:`lit_rl.tasks.word_problems`): the reward (the final
number) and the stated steps (``supported`` / ``wrong`` / ``none``). Counted:

* **lucky guesses**: rewarded samples whose steps are wrong or absent (the outcome noise double rollout removes), as a
  share of the rewarded samples;
* **slips**: unrewarded samples whose every step is right and reaches the answer (the final number read is another);
* **where the first wrong step falls** relative to the cut at ``--rho`` of the completion (the whole completion is the
  trace: this model writes no thinking tags), in tokens: before the cut, the continuations start from a prefix that
  already holds the error and can judge it; after it, they re-sample the error instead.

    .venv/bin/python scripts/real_premise.py --problems 128 --samples 4

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a prepared model's name or a folder")
    p.add_argument("--checkpoint", default=None, help="a Lightning checkpoint of a LoRA run to load first")
    p.add_argument("--problems", type=int, default=128, help="held-out problems")
    p.add_argument("--samples", type=int, default=4, help="samples per problem")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max_new_tokens", type=int, default=96)
    p.add_argument("--rho", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write every sample with its verdict here (JSONL)")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from lit_rl.core.double_rollout import cut_index
    from lit_rl.models import LoraSettings
    from lit_rl.models.ar import PretrainedCausalLM
    from lit_rl.tasks import WordProblemTask
    from lit_rl.tasks.word_problems import first_error_at, steps_verdict

    lora = None
    if args.checkpoint:
        lora = LoraSettings(r=16, alpha=32, dropout=0.0,  # conf/real/grpo_smollm2.yaml's adapters
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"])
    policy = PretrainedCausalLM(args.model, dtype="float32", lora=lora).eval()
    if args.checkpoint:
        policy.load_init_checkpoint(args.checkpoint)
    task = WordProblemTask(num_train=0, num_eval=args.problems)
    examples = [e for e in task.eval_examples() for _ in range(args.samples)]
    t0, rows = time.perf_counter(), []
    for start in range(0, len(examples), args.batch):
        chunk = examples[start:start + args.batch]
        ids, mask = policy.encode_prompts([task.messages(e) for e in chunk])
        out = policy.generate(ids, mask, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature},
                              seed=args.seed * 100_003 + start)
        lengths = policy.completion_lengths(out).tolist()
        for e, text, n, row in zip(chunk, policy.decode_completions(out), lengths, out.tolist()):
            trace_len = n - 1 if row[n - 1] == policy.eos_id else n  # the EOS is not part of the trace
            err = first_error_at(text, e)
            err_tok = None if err is None else policy.count_tokens(text[:err])
            rows.append({"id": e.id, "kind": e.meta["kind"], "reward": task.reward(text, e),
                         "verdict": steps_verdict(text, e), "tokens": trace_len, "cut": cut_index(trace_len, args.rho),
                         "error_token": err_tok, "text": text})
    seconds = time.perf_counter() - t0
    rewarded = [r for r in rows if r["reward"] == 1.0]
    lucky = [r for r in rewarded if r["verdict"] != "supported"]
    slips = [r for r in rows if r["reward"] == 0.0 and r["verdict"] == "supported"]
    wrong = [r for r in rows if r["error_token"] is not None]
    before = [r for r in wrong if r["error_token"] < r["cut"]]
    lucky_before = [r for r in lucky if r["error_token"] is not None and r["error_token"] < r["cut"]]
    cells = Counter(f"{'right' if r['reward'] else 'wrong'} answer / {r['verdict']} steps" for r in rows)
    summary = {
        "model": args.model, "checkpoint": args.checkpoint, "problems": args.problems, "samples": len(rows),
        "temperature": args.temperature, "rho": args.rho, "accuracy": round(len(rewarded) / len(rows), 4),
        "lucky": len(lucky), "lucky_share_of_rewarded": round(len(lucky) / max(1, len(rewarded)), 4),
        "lucky_error_before_cut": len(lucky_before),
        "lucky_error_before_cut_share_of_rewarded": round(len(lucky_before) / max(1, len(rewarded)), 4),
        "slips": len(slips), "slip_share": round(len(slips) / len(rows), 4),
        "samples_with_a_wrong_step": len(wrong), "first_error_before_cut": len(before),
        "first_error_after_cut_share": round(1 - len(before) / max(1, len(wrong)), 4),
        "hit_limit_share": round(sum(r["tokens"] >= args.max_new_tokens for r in rows) / len(rows), 4),
        "cells": dict(sorted(cells.items())), "seconds": round(seconds, 1),
    }
    if args.out:
        from lit_rl.atomic import atomic_write_text

        atomic_write_text(args.out, "".join(json.dumps(r) + "\n" for r in rows))
    for k, v in summary.items():
        if k != "cells":
            print(f"{k:>42}: {v}")
    for k, v in summary["cells"].items():
        print(f"{k:>42}: {v}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
