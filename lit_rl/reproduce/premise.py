"""Double rollout's premise on a chain-sum policy, measured before any RL (and on checkpoints after it).

Two measurements of one policy:

1. **Lucky guesses and slips** (:func:`premise`): T-1 samples on held-out problems, counted in the four cases
   trace right / wrong x answer right / wrong (:func:`lit_rl.tasks.chainsum.trace_correct`). A *lucky guess* is
   a rewarded sample whose trace is wrong; its share is given of the rewarded samples, with the counts. A
   *slip* is a right trace with a wrong answer, given as a share of all samples and of the unrewarded ones.
2. **The reliability study in DR Fig. 1-2's protocol** (:func:`reliability`), on the same policy:
   - difficulty = the policy's pass rate over K samples per prompt, drawn apart from the studied rollouts
     (another seed);
   - G rollouts per prompt; each is cut at ρ of its thinking trace and N continuations are sampled from the
     cut; a rollout's continuation accuracy is their mean reward;
   - length (tertiles of the rollouts' completion lengths) crossed with difficulty (hard < 1/3 <= medium < 2/3
     <= easy), correct and incorrect rollouts apart
     (:func:`lit_rl.algorithms.dr_reliability.crossed_table`);
   - both ways: **without** the continuation budget (each continuation may use the rest of the generation
     limit; the paper's study applies no budget) and **with** the training budget ceil((1-ρ)·T) + buffer.

``scripts/dr_premise.py`` is the command line; ``reproduce double-rollout --testbed guess`` runs it on the warm start.
"""

from __future__ import annotations


from pathlib import Path
from typing import Any, Sequence

import torch

from lit_rl.algorithms.dr_reliability import crossed_markdown, crossed_table
from lit_rl.core.double_rollout import continuation_budget, cut_index, split_thinking
from lit_rl.generation.ar import HFBackend
from lit_rl.models.ar import TinyCausalLM
from lit_rl.tasks import ChainSumTask
from lit_rl.tasks.base import Example
from lit_rl.tasks.chainsum import parse_int_answer, trace_correct, trace_steps

MAX_NEW_TOKENS = 48  # the testbed's generation limit (conf/double_rollout_chainsum.yaml)
MAX_PROMPT_LEN = 32
#: the chain-sum testbed's task (conf/double_rollout_chainsum.yaml; the guess testbed adds ``answer_mod: 2``)
TESTBED_TASK = {"min_terms": 3, "max_terms": 5, "max_digit": 5}
#: the testbed's policy (conf/double_rollout_chainsum.yaml)
TESTBED_POLICY = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512, "max_positions": 256}


def _sample(policy, backend, task: ChainSumTask, examples, n: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    """``n`` T-1 completions per example: ids ``(P*n, W)`` (EOS-filled) and their texts."""
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], MAX_PROMPT_LEN)
    comp = backend.generate(ids, mask, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, n=n, seed=seed)
    return comp, policy.decode_completions(comp)


def inconclusive(text: str, example: Example) -> bool:
    """Whether the ``<reasoning>`` trace has fewer steps than the problem needs (it stopped early, or is missing)."""
    return len(trace_steps(text)) < len(example.meta["numbers"]) - 1


def count_cases(texts: Sequence[str], examples: Sequence[Example], samples: int) -> dict[str, Any]:
    """The four cases' counts of ``texts`` (``samples`` consecutive completions per example) and the lucky-guess
    and slip shares with their denominators; lucky guesses split into inconclusive traces (fewer steps than
    the problem needs) and complete traces with a wrong step. Pure: no model."""
    counts = {"trace_ok_answer_ok": 0, "trace_ok_answer_wrong": 0, "trace_wrong_answer_ok": 0,
              "trace_wrong_answer_wrong": 0}
    lucky_inconclusive = 0
    for k, text in enumerate(texts):
        ex = examples[k // samples]
        t_ok = trace_correct(text, ex.meta["numbers"])
        a_ok = parse_int_answer(text) == int(ex.answer)
        counts[f"trace_{'ok' if t_ok else 'wrong'}_answer_{'ok' if a_ok else 'wrong'}"] += 1
        lucky_inconclusive += int(a_ok and not t_ok and inconclusive(text, ex))
    n = len(texts)
    rewarded = counts["trace_ok_answer_ok"] + counts["trace_wrong_answer_ok"]
    return {
        "samples": n, "counts": counts, "accuracy": rewarded / n,
        "trace_accuracy": (counts["trace_ok_answer_ok"] + counts["trace_ok_answer_wrong"]) / n,
        "supported_accuracy": counts["trace_ok_answer_ok"] / n,
        "rewarded": rewarded,
        "lucky_share_of_rewarded": counts["trace_wrong_answer_ok"] / rewarded if rewarded else 0.0,
        "lucky_inconclusive": lucky_inconclusive,
        "lucky_complete_wrong": counts["trace_wrong_answer_ok"] - lucky_inconclusive,
        "slip_share_of_all": counts["trace_ok_answer_wrong"] / n,
        "slip_share_of_unrewarded": counts["trace_ok_answer_wrong"] / (n - rewarded) if n > rewarded else 0.0,
    }


def premise(policy, task: ChainSumTask, examples: Sequence[Example], samples: int, seed: int,
            backend: Any = None) -> dict[str, Any]:
    """:func:`count_cases` of ``samples`` T-1 completions per example (``backend``: an
    :class:`~lit_rl.generation.ar.ARBackend`, default the policy's :class:`HFBackend`)."""
    _, texts = _sample(policy, backend or HFBackend(policy), task, examples, samples, seed)
    return count_cases(texts, examples, samples)


def reliability(policy, task: ChainSumTask, examples, K: int, G: int, N: int, rho: float, buffer: int,
                seed: int, backend: Any = None) -> dict[str, dict[str, torch.Tensor]]:
    """Per studied rollout: answer and trace correctness, continuation accuracy and whether each continuation
    hit its length limit (without and with the budget), length, and the prompt's K-sample pass rate. Returns
    ``{"no_budget": rows, "budget": rows}`` for :func:`crossed_table` (extra keys ``trace_ok (R,)`` bool and
    ``hit_limit (R,)``: the share of the row's continuations that ended without EOS at their limit)."""
    backend = backend or HFBackend(policy)
    _, diff_texts = _sample(policy, backend, task, examples, K, seed + 1)
    pass_rate = torch.tensor([sum(task.reward(diff_texts[p * K + j], ex) for j in range(K)) / K
                              for p, ex in enumerate(examples)])  # (P,)
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples], MAX_PROMPT_LEN)  # (P, S)
    comp = backend.generate(ids, mask, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, n=G, seed=seed + 2)
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
        budgets["no_budget"].append(max(1, MAX_NEW_TOKENS - cut))  # prefix + continuation fill the 48 tokens
        budgets["budget"].append(max(1, min(continuation_budget(T, rho, buffer), MAX_NEW_TOKENS - cut)))
    correct = torch.tensor([task.reward(t, examples[r // G]) > 0 for r, t in enumerate(texts)])
    trace_ok = torch.tensor([trace_correct(t, examples[r // G].meta["numbers"]) for r, t in enumerate(texts)])
    out = {}
    for mode, b in budgets.items():
        cont = backend.continue_from(prefixes, N, b, temperature=1.0, seed=seed + 3)  # (R*N, W)
        rewards, hit = [], []
        for j in range(cont.shape[0]):
            r = j // N
            toks = cont[j, : b[r]].tolist()
            hit.append(eos not in toks)
            if eos in toks:
                toks = toks[: toks.index(eos)]
            text = policy.tokenizer.decode(kept[r] + toks, skip_special_tokens=True)
            rewards.append(task.reward(text, examples[r // G]))
        out[mode] = {"correct": correct, "trace_ok": trace_ok,
                     "cont_acc": torch.tensor(rewards).view(-1, N).mean(1),  # (R,)
                     "hit_limit": torch.tensor(hit, dtype=torch.float32).view(-1, N).mean(1),  # (R,)
                     "length": lengths.long(), "pass_rate": pass_rate.repeat_interleave(G)}
    return out


def by_answer_and_trace(rows: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Mean continuation accuracy of the rollouts in each (answer right/wrong) x (trace right/wrong) cell: the
    direct test of the premise (lucky guesses = right answer, wrong trace; slips = wrong answer, right trace)."""
    out = []
    for answer in (True, False):
        for trace in (True, False):
            m = (rows["correct"] == answer) & (rows["trace_ok"] == trace)
            n = int(m.sum())
            out.append({"answer_ok": answer, "trace_ok": trace, "n": n,
                        "cont_acc": float(rows["cont_acc"][m].mean()) if n else None})
    return out


def measure(path: str | Path, task_args: dict[str, Any], problems: int = 256, samples: int = 4, seed: int = 1234,
            study: bool = True, K: int = 16, G: int = 8, N: int = 8, rho: float = 0.9, buffer: int = 16,
            min_count: int = 20, policy_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both measurements of the testbed's policy (``TinyCausalLM``, at the testbed's sizes unless ``policy_args``
    says otherwise) loaded from ``path``:
    ``premise`` (:func:`premise`) and, with ``study``, ``reliability``: ``{"no_budget" | "budget": table}``
    (:func:`~lit_rl.algorithms.dr_reliability.crossed_table` rows) and ``rollouts`` (how many were studied)."""
    task = ChainSumTask(num_train=2000, num_eval=256, **task_args)
    examples = task.eval_examples()[:problems]
    policy = TinyCausalLM(**(policy_args or TESTBED_POLICY))
    policy.load_init_checkpoint(str(path))
    policy.eval()
    out: dict[str, Any] = {"policy": str(path), "problems": len(examples), "samples_per_problem": samples,
                           "premise": premise(policy, task, examples, samples, seed)}
    if study:
        rows = reliability(policy, task, examples, K, G, N, rho, buffer, seed)
        out["reliability"] = {mode: crossed_table(r, 3, min_count) for mode, r in rows.items()}
        out["answer_x_trace"] = {mode: by_answer_and_trace(r) for mode, r in rows.items()}
        out["hit_limit"] = {mode: float(r["hit_limit"].mean()) for mode, r in rows.items()}
        out["study"] = {"K": K, "G": G, "N": N, "rho": rho, "buffer": buffer, "min_count": min_count,
                        "rollouts": len(rows["budget"]["correct"])}
    return out


def describe(result: dict[str, Any]) -> str:
    """:func:`measure`'s result as Markdown: the premise table with its denominators, then the reliability tables."""
    r, c = result["premise"], result["premise"]["counts"]
    n, rewarded = r["samples"], r["rewarded"]
    md = [f"{n:,} samples at T 1 ({result['problems']} held-out problems x {result['samples_per_problem']}):", "",
          "| measure | count | share |", "|---|---|---|",
          f"| rewarded samples | {rewarded:,} of {n:,} | accuracy {r['accuracy']:.3f} |",
          f"| lucky guesses: rewarded with a wrong trace | {c['trace_wrong_answer_ok']:,} of {rewarded:,} rewarded | "
          f"{r['lucky_share_of_rewarded']:.1%} |",
          f"| of which the trace stopped early (inconclusive) / is complete with a wrong step | "
          f"{r.get('lucky_inconclusive', '-')} / {r.get('lucky_complete_wrong', '-')} | |",
          f"| slips: right trace, wrong answer | {c['trace_ok_answer_wrong']:,} of {n:,} | "
          f"{r['slip_share_of_all']:.1%} of all, {r['slip_share_of_unrewarded']:.1%} of the {n - rewarded:,} "
          "unrewarded |",
          f"| right traces | {c['trace_ok_answer_ok'] + c['trace_ok_answer_wrong']:,} of {n:,} | "
          f"{r['trace_accuracy']:.3f} |", ""]
    study = result.get("study")
    for mode, table in (result.get("reliability") or {}).items():
        how = ("no continuation budget (the rest of the 48-token limit)" if mode == "no_budget"
               else f"the training budget ceil((1-ρ)·T) + {study['buffer']}")
        split = result.get("answer_x_trace", {}).get(mode, [])
        cells = {(c["answer_ok"], c["trace_ok"]): c for c in split}

        def fmt(c: dict[str, Any] | None) -> str:
            return "-" if not c or c["cont_acc"] is None else f"{c['cont_acc']:.3f} ({c['n']:,})"

        md += [f"Continuation accuracy from ρ {study['rho']:g} of the trace, {study['N']} continuations, {how}; "
               f"{study['rollouts']:,} rollouts ({study['G']} per problem); difficulty from {study['K']} separate "
               f"samples per problem; a cell needs {study['min_count']} rollouts; "
               f"{result.get('hit_limit', {}).get(mode, float('nan')):.1%} of the continuations hit their length "
               "limit without ending:", "",
               crossed_markdown(table, study["min_count"]).rstrip(), ""]
        if split:
            md += ["By answer and trace (the premise itself: lucky guesses are right answers after a wrong trace; "
                   "with a parity answer a guess is right half the time, so about 0.5 is the floor of a cell whose "
                   "continuations guess):", "",
                   "| rollout | trace right | trace wrong |", "|---|---|---|",
                   f"| answer right | {fmt(cells.get((True, True)))} | {fmt(cells.get((True, False)))} |",
                   f"| answer wrong | {fmt(cells.get((False, True)))} | {fmt(cells.get((False, False)))} |", ""]
    return "\n".join(md) + "\n"
