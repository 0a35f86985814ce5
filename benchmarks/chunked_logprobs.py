"""Memory and time of scoring long completions whole vs in chunks (``logprob_chunk``).

A policy-gradient update scores every completion token: log softmax of the LM head's float32 logits, gathered at
the sampled token. Whole, the logits ``(B, L, V)`` and what the backward keeps of them scale with ``L x V``: one
34,816-token row over Qwen3's 151,936-token vocabulary is ~21 GiB of logits and as much again for their gradient.
``CausalPolicy.completion_scores`` with ``logprob_chunk = c`` runs the head ``c`` positions at a time under
activation checkpointing (docs/gpus8.md).

Each mode runs in its own process (a fresh peak), on a random Llama with SmolLM2-135M's 49,152-token vocabulary
and a thin body (the logits dominate, as they do at paper scale): one forward + backward of
``sum(logp * w)`` over ``--rows`` rows of ``--length`` completion tokens. It reports the process's peak resident
memory above what it held before scoring (``ru_maxrss``; the CPU stands in for a GPU's allocator) and the wall
time, then one JSON line with the ratios to the whole pass.

    python benchmarks/chunked_logprobs.py                       # ~1 min on 2 CPU cores
    python benchmarks/chunked_logprobs.py --length 8192 --chunks 0 512 2048
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(length: int, rows: int, vocab: int, chunk: int, hidden: int) -> dict:
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_rl.models.ar import CausalPolicy

    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=length + 16)
    policy = CausalPolicy.__new__(CausalPolicy)
    nn.Module.__init__(policy)
    policy.model = LlamaForCausalLM(cfg)
    policy.logprob_chunk = chunk
    prompt = 8
    ids = torch.randint(0, vocab, (rows, prompt + length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    w = torch.randn(rows, length, generator=torch.Generator().manual_seed(2))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    t0 = time.perf_counter()
    logp, ent = policy.completion_scores(ids, mask, prompt)
    (logp * w).sum().backward()
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grad = sum(float(p.grad.double().abs().sum()) for p in policy.model.parameters() if p.grad is not None)
    return {"chunk": chunk, "peak_mib": (peak - before) / 1024, "seconds": wall, "logp_sum": float(logp.sum()),
            "grad_abs_sum": grad}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=4096, help="completion tokens per row")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 256, 1024], help="0 = whole")
    ap.add_argument("--_one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._one is not None:
        print(json.dumps(one(args.length, args.rows, args.vocab, args._one, args.hidden)))
        return {}
    results = []
    for c in args.chunks:
        cmd = [sys.executable, __file__, "--length", str(args.length), "--rows", str(args.rows), "--vocab",
               str(args.vocab), "--hidden", str(args.hidden), "--_one", str(c)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next(r for r in results if r["chunk"] == 0) if 0 in args.chunks else results[0]
    print(f"{args.rows} row(s) x {args.length} completion tokens, vocabulary {args.vocab}, float32 logits "
          f"{args.rows * args.length * args.vocab * 4 / 2**20:.0f} MiB whole")
    def ratio(a: float, b: float) -> float | None:  # a pass too small to raise the process's peak measures 0
        return round(a / b, 3) if b > 0 else None

    print(f"{'chunk':>8} {'peak MiB':>10} {'x whole':>8} {'seconds':>8} {'x whole':>8} {'|logp sum - whole|':>19}")
    for r in results:
        peak = ratio(r["peak_mib"], base["peak_mib"])
        print(f"{r['chunk'] or 'whole':>8} {r['peak_mib']:>10.0f} {'n/a' if peak is None else f'{peak:.2f}':>8} "
              f"{r['seconds']:>8.2f} {r['seconds'] / base['seconds']:>8.2f} "
              f"{abs(r['logp_sum'] - base['logp_sum']):>19.2e}")
    summary = {"benchmark": "chunked_logprobs", "length": args.length, "rows": args.rows, "vocab": args.vocab,
               "results": results,
               "peak_ratio": {str(r["chunk"]): ratio(r["peak_mib"], base["peak_mib"]) for r in results},
               "time_ratio": {str(r["chunk"]): ratio(r["seconds"], base["seconds"]) for r in results}}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
