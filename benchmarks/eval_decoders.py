"""Greedy evaluation under each dLLM decoder, on trained checkpoints: accuracy and cost side by side.

The embedded ERILS run evaluates greedily on all 256 puzzles of SPG's Sudoku test split (L_gen 48, block 16,
24 steps). This script decodes the same puzzles from each given checkpoint with each decoder and reports the
accuracy (``task.evaluate``'s correct cells over all blank cells, pooled as the validation loop's
``val/sudoku/greedy/accuracy``), the model passes per row, the
positions run through the layers and the wall time:

* ``exact``: the reference loop (the fixed schedule, 2 tokens per step);
* ``threshold``: τ 0.9 with the schedule as the floor (``threshold_floor: schedule``): at least the schedule's 2
  tokens per step, more where the model is sure, so never more passes than ``exact``;
* ``threshold_one``: τ 0.9 with Fast-dLLM's floor of one token (can need more passes than the schedule);
* ``prefix`` / ``dual``: the block KV cache, refreshed once per block;
* ``dual_threshold``: both.

    python benchmarks/eval_decoders.py runs/erils/checkpoints/last.ckpt runs/cache/format_warmup_sudoku_*.pt
    python benchmarks/eval_decoders.py --quick          # seconds: random weights, 8 puzzles (the test's run)
    python benchmarks/eval_decoders.py --samples 4 runs/erils/checkpoints/last.ckpt    # the sampled Pass@k

``--samples N`` decodes instead as the embedded run's checkpoint Pass@k does (``conf/erils.yaml``'s
``PassAtKEvaluation`` config ``multi``): temperature 0.9, the first 64 puzzles, N samples with seeds
``--first-seed`` .. ``--first-seed + N - 1`` (1001..: the callback's), scored by the callback's own
:class:`~lit_rl.evaluation.ConfigScorer` (pass@1..N: best-of-k cell accuracy pooled over blank cells, and the
mean accuracy). Sampled scores move with the seeds: run ``exact`` again with another ``--first-seed`` for the
noise floor a decoder's change is read against.

A checkpoint is a Lightning ``.ckpt`` (the policy's ``policy.*`` weights are read) or a ``torch.save``'d policy
state dict (the format warm-up's cache). The model is the embedded ``TinyDiffusionLM`` (``conf/erils.yaml``).
The last line is one JSON object: per checkpoint and decoder the accuracy, its change against ``exact``, passes
per row, forward tokens and seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lit_rl.evaluation import FIRST_SEED, ConfigScorer, EvalConfig, run_config
from lit_rl.generation.diffusion import DecodeStats
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import SudokuTask

MAX_PROMPT_LEN = 64  # conf/erils.yaml's data.max_prompt_len
SAMPLE_TEMPERATURE = 0.9  # conf/erils.yaml's checkpoint Pass@k (PassAtKEvaluation config "multi")

DECODERS: dict[str, dict] = {
    "exact": {},
    "threshold": {"threshold": 0.9, "threshold_floor": "schedule"},
    "threshold_one": {"threshold": 0.9},
    "prefix": {"cache": "prefix"},
    "dual": {"cache": "dual"},
    "dual_threshold": {"cache": "dual", "threshold": 0.9, "threshold_floor": "schedule"},
}


def load_policy(path: str | None, quick: bool) -> TinyDiffusionLM:
    """The embedded model (``conf/erils.yaml``'s sizes) with the checkpoint's weights (``None``: its init)."""
    size = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64) if quick else {}
    policy = TinyDiffusionLM(max_positions=256, **size)
    if path is not None:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if "state_dict" in state:  # a Lightning checkpoint: the module's policy.* weights
            state = {k[len("policy."):]: v for k, v in state["state_dict"].items() if k.startswith("policy.")}
        policy.load_state_dict(state, strict=True)
    return policy.eval()


def evaluate(policy: TinyDiffusionLM, task: SudokuTask, settings: DecodeSettings, batch_size: int,
             limit: int | None) -> dict[str, float]:
    """Greedy accuracy and cost of one decoder on the test split (``limit``: the first puzzles only)."""
    examples = task.eval_examples()[:limit]
    stats, correct, total = DecodeStats(), 0.0, 0.0
    t0 = time.perf_counter()
    for i in range(0, len(examples), batch_size):
        batch = examples[i:i + batch_size]
        ids, mask = policy.encode_prompts([task.messages(e) for e in batch], MAX_PROMPT_LEN)  # (B, P)
        texts = policy.decode_completions(policy.generate(ids, mask, settings, 0, stats=stats))
        scores = [task.evaluate(t, e) for t, e in zip(texts, batch)]
        correct, total = correct + sum(s.correct for s in scores), total + sum(s.total for s in scores)
    seconds = time.perf_counter() - t0
    # accuracy pooled over blank cells, as the validation loop's
    return {"accuracy": correct / max(total, 1.0), "passes_per_row": round(stats.passes_per_row(), 3),
            "forward_tokens": stats.forward_tokens, "seconds": round(seconds, 3), "puzzles": len(examples)}


class _Counted:
    """The policy, with every ``generate`` call's passes counted into ``stats`` (for :func:`run_config`)."""

    def __init__(self, policy: TinyDiffusionLM, stats: DecodeStats) -> None:
        self.policy, self.stats = policy, stats

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, settings: DecodeSettings, seed: int) -> torch.Tensor:
        return self.policy.generate(ids, mask, settings, seed, stats=self.stats)


def evaluate_sampled(policy: TinyDiffusionLM, task: SudokuTask, settings: DecodeSettings, batch_size: int,
                     limit: int, samples: int, first_seed: int) -> dict[str, float]:
    """The checkpoint Pass@k of one decoder: ``samples`` sampled completions of each of the first ``limit``
    puzzles, scored as ``callbacks.PassAtKEvaluation`` scores them (pass@1..n, accuracy)."""
    examples = task.eval_examples()[:limit]
    config = EvalConfig(name="multi", generation=settings, num_samples=samples,
                        seeds=[first_seed + i for i in range(samples)])
    stats, scorer = DecodeStats(), ConfigScorer(config)
    batches = [examples[i:i + batch_size] for i in range(0, len(examples), batch_size)]
    t0 = time.perf_counter()
    scorer.update(run_config(_Counted(policy, stats), task, batches, config, MAX_PROMPT_LEN))
    seconds = time.perf_counter() - t0
    out = {k: round(v, 4) for k, v in scorer.compute().items() if k.startswith("pass@") or k == "accuracy"}
    return {**out, "passes_per_row": round(stats.passes_per_row(), 3), "forward_tokens": stats.forward_tokens,
            "seconds": round(seconds, 3), "puzzles": len(examples)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="Lightning .ckpt files or policy state dicts")
    ap.add_argument("--decoders", default=",".join(DECODERS), help=f"comma-separated, of {', '.join(DECODERS)}")
    ap.add_argument("--batch-size", type=int, default=128, help="the config's eval_batch_size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="random weights, a tiny model, 8 puzzles")
    ap.add_argument("--samples", type=int, default=0,
                    help=f"sampled Pass@k instead of greedy: samples per puzzle at temperature {SAMPLE_TEMPERATURE} "
                         "(the config's 4)")
    ap.add_argument("--subset", type=int, default=64, help="puzzles of the sampled Pass@k (the config's 64)")
    ap.add_argument("--first-seed", type=int, default=FIRST_SEED, help="the sampled Pass@k's first seed")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.decoders.split(",")
    unknown = [n for n in names if n not in DECODERS]
    if unknown:
        ap.error(f"unknown decoder {unknown[0]!r}; known: {', '.join(DECODERS)}")
    if not args.checkpoints and not args.quick:
        ap.error("give checkpoints, or --quick")
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)
    if args.samples < 0 or args.subset < 1:
        ap.error("--samples must be >= 0 and --subset >= 1")
    sampled = args.samples > 0
    limit = 8 if args.quick else (args.subset if sampled else None)
    # the score each row compares: greedy accuracy, or the sampled Pass@k's best-of-n
    key = f"pass@{args.samples}" if sampled else "accuracy"
    results: dict[str, dict[str, dict[str, float]]] = {}
    print(f"| checkpoint | decoder | {key} | vs exact | passes/row | forward tokens | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in args.checkpoints or [None]:
        policy, label = load_policy(path, args.quick), path or "random init"
        rows = results[label] = {}
        for name in names:
            settings = DecodeSettings(gen_length=48, block_length=16, steps=24,
                                      temperature=SAMPLE_TEMPERATURE if sampled else 0.0, **DECODERS[name])
            rows[name] = (evaluate_sampled(policy, task, settings, args.batch_size, limit, args.samples,
                                           args.first_seed) if sampled
                          else evaluate(policy, task, settings, args.batch_size, limit))
            if "exact" in rows:
                rows[name]["delta"] = round(rows[name][key] - rows["exact"][key], 4)
            r = rows[name]
            print(f"| {label} | {name} | {r[key]:.3f} | {r.get('delta', float('nan')):+.3f} | "
                  f"{r['passes_per_row']:.2f} | {r['forward_tokens']} | {r['seconds']:.1f} |", flush=True)
    summary = {"benchmark": "eval_decoders", "threads": args.threads, "decoders": {n: DECODERS[n] for n in names},
               "mode": {"samples": args.samples, "subset": limit, "first_seed": args.first_seed,
                        "temperature": SAMPLE_TEMPERATURE}
               if sampled else {"greedy": True}, "results": results}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
