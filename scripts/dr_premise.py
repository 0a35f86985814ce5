"""Double rollout's premise on a chain-sum policy, measured before any RL (and on checkpoints after it).

Two measurements of one policy (a warm-start state dict from ``runs/cache/`` or a Lightning checkpoint):

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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_rl.algorithms.dr_reliability import crossed_markdown, crossed_table  # noqa: E402
from lit_rl.core.double_rollout import continuation_budget, cut_index, split_thinking  # noqa: E402
from lit_rl.generation.ar import HFBackend  # noqa: E402
from lit_rl.models.ar import TinyCausalLM  # noqa: E402
from lit_rl.tasks import ChainSumTask  # noqa: E402
from lit_rl.tasks.chainsum import parse_int_answer, trace_correct  # noqa: E402

MAX_NEW_TOKENS = 48  # the testbed's generation limit (conf/double_rollout_chainsum.yaml)
MAX_PROMPT_LEN = 32


def _sample(policy, task: ChainSumTask, examples, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], MAX_PROMPT_LEN)
    comp = HFBackend(policy).generate(ids, mask, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, n=n, seed=seed)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), policy.decode_completions(comp)


def premise(policy, task: ChainSumTask, examples, samples: int, seed: int) -> dict[str, Any]:
    """The four cases' counts and the lucky-guess and slip shares with their denominators."""
    _, _, texts = _sample(policy, task, examples, samples, seed)
    counts = {"trace_ok_answer_ok": 0, "trace_ok_answer_wrong": 0, "trace_wrong_answer_ok": 0,
              "trace_wrong_answer_wrong": 0}
    for k, text in enumerate(texts):
        ex = examples[k // samples]
        t_ok = trace_correct(text, ex.meta["numbers"])
        a_ok = parse_int_answer(text) == int(ex.answer)
        counts[f"trace_{'ok' if t_ok else 'wrong'}_answer_{'ok' if a_ok else 'wrong'}"] += 1
    n = len(texts)
    rewarded = counts["trace_ok_answer_ok"] + counts["trace_wrong_answer_ok"]
    return {
        "samples": n, "counts": counts, "accuracy": rewarded / n,
        "trace_accuracy": (counts["trace_ok_answer_ok"] + counts["trace_ok_answer_wrong"]) / n,
        "supported_accuracy": counts["trace_ok_answer_ok"] / n,
        "rewarded": rewarded,
        "lucky_share_of_rewarded": counts["trace_wrong_answer_ok"] / rewarded if rewarded else 0.0,
        "slip_share_of_all": counts["trace_ok_answer_wrong"] / n,
        "slip_share_of_unrewarded": counts["trace_ok_answer_wrong"] / (n - rewarded) if n > rewarded else 0.0,
    }


def reliability(policy, task: ChainSumTask, examples, K: int, G: int, N: int, rho: float, buffer: int,
                seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """Per studied rollout: correctness, continuation accuracy (without and with the budget), length, and the
    prompt's K-sample pass rate. Returns ``{"no_budget": rows, "budget": rows}`` for :func:`crossed_table`."""
    _, _, diff_texts = _sample(policy, task, examples, K, seed + 1)
    pass_rate = torch.tensor([sum(task.reward(diff_texts[p * K + j], ex) for j in range(K)) / K
                              for p, ex in enumerate(examples)])  # (P,)
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], MAX_PROMPT_LEN)  # (P, S)
    comp = HFBackend(policy).generate(ids, mask, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, n=G, seed=seed + 2)
    texts = policy.decode_completions(comp)
    lengths = policy.completion_lengths(comp)  # (P*G,) with the EOS
    delim, eos = policy.think_end_ids(), policy.eos_id
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    kept, prefixes, budgets = [], [], {"no_budget": [], "budget": []}
    for r in range(len(texts)):
        body = comp[r, : int(lengths[r])].tolist()
        body = body[:-1] if body and body[-1] == eos else body
        T = split_thinking(body, delim, "whole")
        cut = cut_index(T, rho)
        kept.append(body[:cut])
        prefixes.append(prompts[r // G] + body[:cut])
        budgets["no_budget"].append(max(1, MAX_NEW_TOKENS - cut))
        budgets["budget"].append(max(1, min(continuation_budget(T, rho, buffer), MAX_NEW_TOKENS - cut)))
    correct = torch.tensor([task.reward(t, examples[r // G]) > 0 for r, t in enumerate(texts)])
    out = {}
    for mode, b in budgets.items():
        cont = HFBackend(policy).continue_from(prefixes, N, b, temperature=1.0, seed=seed + 3)  # (R*N, W)
        rewards = []
        for j in range(cont.shape[0]):
            r = j // N
            toks = cont[j, : b[r]].tolist()
            if eos in toks:
                toks = toks[: toks.index(eos)]
            text = policy.tokenizer.decode(kept[r] + toks, skip_special_tokens=True)
            rewards.append(task.reward(text, examples[r // G]))
        acc = torch.tensor(rewards).view(-1, N).mean(1)  # (R,)
        out[mode] = {"correct": correct, "cont_acc": acc, "length": lengths.long(),
                     "pass_rate": pass_rate.repeat_interleave(G)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("policies", nargs="+", help="state dicts (warm start cache) or Lightning checkpoints")
    p.add_argument("--task", default="{}", help="ChainSumTask arguments as JSON (num_train/num_eval fixed)")
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
    task = ChainSumTask(num_train=2000, num_eval=256, **json.loads(args.task))
    examples = task.eval_examples()[: args.problems]
    results: dict[str, Any] = {}
    for path in args.policies:
        policy = TinyCausalLM(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_positions=256)
        policy.load_init_checkpoint(path)
        policy.eval()
        r = premise(policy, task, examples, args.samples, args.seed)
        c = r["counts"]
        print(f"{path}\n  {r['samples']} samples ({len(examples)} problems x {args.samples}, T 1): accuracy "
              f"{r['accuracy']:.3f}, trace accuracy {r['trace_accuracy']:.3f}\n"
              f"  lucky guesses (wrong trace, rewarded): {c['trace_wrong_answer_ok']} of {r['rewarded']} rewarded = "
              f"{r['lucky_share_of_rewarded']:.1%}\n"
              f"  slips (right trace, wrong answer): {c['trace_ok_answer_wrong']} of {r['samples']} = "
              f"{r['slip_share_of_all']:.1%} ({r['slip_share_of_unrewarded']:.1%} of the unrewarded)")
        if args.reliability:
            study = reliability(policy, task, examples, args.difficulty_samples, args.rollouts, args.continuations,
                                args.rho, args.buffer, args.seed)
            r["reliability"] = {}
            for mode, rows in study.items():
                table = crossed_table(rows, 3, args.min_count)
                r["reliability"][mode] = table
                print(f"\n  reliability, rho {args.rho}, {args.continuations} continuations, "
                      f"{'no continuation budget' if mode == 'no_budget' else f'budget ceil((1-rho)T) + {args.buffer}'}"
                      f" ({len(rows['correct'])} rollouts):\n")
                print(crossed_markdown(table, args.min_count))
        results[path] = r
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
