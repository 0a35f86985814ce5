"""Cost of the double-rollout second stage vs the first stage, with and without prefix-KV reuse.

Double-rollout GRPO (docs/double_rollout.md) samples, per prompt, G rollouts of T tokens (stage 1), cuts each
rollout's thinking trace at ρ·T and samples N continuations of each cut prefix with
``max_new_tokens = ceil((1-ρ)·T) + buffer`` (stage 2). Stage 2 has G·N rows per prompt but short
generations on a long shared prefix, so its cost depends on whether the prefix is prefilled once and its
KV cache shared by the N continuations (:class:`~lit_rl.generation.ar.HFBackend` default) or re-encoded
N times (``share_prefix=False``).

One run times, on a tiny random causal LM (CPU by default):

* stage 1: G rollouts per prompt (the prompt's prefill shared G ways);
* stage 2 with prefix-KV reuse, and stage 2 re-encoding every prefix N times;
* the prefill alone of both stage-2 variants (one new token), to show where the difference comes from;

and prints a table: time, ratio to stage 1, and the speed-up of reuse, then one JSON line. EOS is suppressed so
every row generates its full budget (the worst case for both stages, and the same token counts on every machine).
The whole rollout plays the thinking trace (T_i = T).

``--backend vllm`` (in the vLLM environment, scripts/setup.sh vllm) measures the same on vLLM's engine: reuse is
its prefix cache (whole KV blocks of ``--block-size`` tokens shared by requests with the same prefix), against a
second engine with ``enable_prefix_caching=False``; the JSON adds the share of prompt tokens the cache served.

    python benchmarks/double_rollout_cost.py                      # defaults, < 2 min on 2 CPU cores
    python benchmarks/double_rollout_cost.py --T 512 --buffer 64 --device cuda --hidden 512
    .venv-vllm/bin/python benchmarks/double_rollout_cost.py --backend vllm
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from lit_rl.core.double_rollout import continuation_budget, cut_index
from lit_rl.generation.ar import ARBackend, HFBackend
from lit_rl.models.ar import TinyCausalLM


class _NoEOS(nn.Module):
    """lm_head with the EOS logit set to -inf: every row runs to its budget."""

    def __init__(self, head: nn.Module, eos_id: int) -> None:
        super().__init__()
        self.head, self.eos_id = head, eos_id

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.head(h)
        out[..., self.eos_id] = float("-inf")
        return out


def _vllm_pair(policy: nn.Module, block_size: int, dtype: str) -> tuple[ARBackend, ARBackend]:
    """Two engines started from ``policy``: prefix caching on and off; rows run to their budget (``ignore_eos``).
    Only the first keeps stats: vLLM's metrics registry is per process, and the second engine's counters would
    replace the first's (measured: 0/0 prefix-cache queries read back)."""
    from lit_rl.generation.ar import VLLMBackend

    kw = dict(dtype=dtype, kv_cache_memory_bytes=256 << 20, enforce_eager=True, block_size=block_size, ignore_eos=True)
    return (VLLMBackend(policy, enable_prefix_caching=True, llm_kwargs={"disable_log_stats": False}, **kw),
            VLLMBackend(policy, enable_prefix_caching=False, **kw))


def _timed(fn, device: str, repeats: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per batch (B)")
    ap.add_argument("--G", type=int, default=8, help="first-stage rollouts per prompt")
    ap.add_argument("--T", type=int, default=128, help="first-stage rollout length in tokens")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens")
    ap.add_argument("--rho", type=float, default=0.9, help="fraction of the trace kept in the prefix")
    ap.add_argument("--N", type=int, default=8, help="continuations per rollout")
    ap.add_argument("--buffer", type=int, default=16, help="extra continuation budget (paper: math 1024)")
    ap.add_argument("--hidden", type=int, default=128, help="model width")
    ap.add_argument("--layers", type=int, default=4, help="model layers")
    ap.add_argument("--heads", type=int, default=4, help="attention heads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--repeats", type=int, default=3,
                    help="time each stage this many times, keep the best (1 is noisy: allocator warm-up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--block-size", type=int, default=32, help="vLLM KV block (tokens; CPU: a multiple of 32)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    total = args.prompt_len + args.T + continuation_budget(args.T, args.rho, args.buffer) + 8
    policy = TinyCausalLM(
        hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
        intermediate_size=4 * args.hidden, max_positions=total, seed=args.seed,
    ).eval()
    if args.backend == "vllm":
        shared, reencode = _vllm_pair(policy, args.block_size, args.dtype)
    else:
        policy.model.lm_head = _NoEOS(policy.model.lm_head, policy.eos_id)
        policy.to(device=args.device, dtype=getattr(torch, args.dtype))
        shared, reencode = HFBackend(policy, share_prefix=True), HFBackend(policy, share_prefix=False)

    g = torch.Generator().manual_seed(args.seed)
    prompt_ids = torch.randint(10, len(policy.tokenizer), (args.prompts, args.prompt_len), generator=g)  # (B, P)
    prompt_mask = torch.ones_like(prompt_ids)
    warm = shared.generate(prompt_ids[:1], prompt_mask[:1], max_new_tokens=2, n=2)  # noqa: F841 (warm-up)

    t1, rollouts = _timed(
        lambda: shared.generate(prompt_ids, prompt_mask, max_new_tokens=args.T, n=args.G, seed=args.seed),
        args.device, args.repeats,
    )  # rollouts: (B*G, T)
    cut = cut_index(args.T, args.rho)
    budget = continuation_budget(args.T, args.rho, args.buffer)
    prompts = prompt_ids.repeat_interleave(args.G, 0)  # (B*G, P), rollout-major like `rollouts`
    prefixes = [p + r[:cut] for p, r in zip(prompts.tolist(), rollouts.tolist())]

    def stage2(backend: ARBackend, new: int):
        return lambda: backend.continue_from(prefixes, n=args.N, max_new_tokens=new, seed=args.seed + 1)

    t2_shared, a = _timed(stage2(shared, budget), args.device, args.repeats)
    t2_reenc, b = _timed(stage2(reencode, budget), args.device, args.repeats)
    p_shared, _ = _timed(stage2(shared, 1), args.device, args.repeats)
    p_reenc, _ = _timed(stage2(reencode, 1), args.device, args.repeats)
    same = torch.equal(a, b) if args.dtype == "float32" else None
    cache = shared.prefix_cache_counts() if args.backend == "vllm" else None

    rows1, rows2 = args.prompts * args.G, args.prompts * args.G * args.N
    table = [
        dict(stage=f"stage 1: G={args.G} rollouts", rows=rows1, new=args.T, time=t1, reuse=None),
        dict(stage="stage 2: prefix-KV reuse", rows=rows2, new=budget, time=t2_shared, reuse=t2_reenc / t2_shared),
        dict(stage=f"stage 2: re-encode x{args.N}", rows=rows2, new=budget, time=t2_reenc, reuse=None),
        dict(stage="  prefill only: reuse", rows=rows2, new=1, time=p_shared, reuse=p_reenc / p_shared),
        dict(stage="  prefill only: re-encode", rows=rows2, new=1, time=p_reenc, reuse=None),
    ]
    print(
        f"{args.backend}: tiny Llama h={args.hidden} L={args.layers} on {args.device} ({args.dtype}, "
        f"{args.threads} threads); "
        f"{args.prompts} prompts x G={args.G}, prompt {args.prompt_len} + T={args.T} tokens; "
        f"rho={args.rho} -> prefix {args.prompt_len}+{cut} tokens, N={args.N}, "
        f"max new = ceil((1-rho)T)+{args.buffer} = {budget}"
    )
    print(f"{'stage':<30} {'rows':>6} {'new tok':>8} {'time s':>8} {'/ stage 1':>10} {'reuse speed-up':>15}")
    for r in table:
        reuse = f"{r['reuse']:.2f}x" if r["reuse"] is not None else ""
        print(f"{r['stage']:<30} {r['rows']:>6} {r['new']:>8} {r['time']:>8.2f} {r['time'] / t1:>9.2f}x {reuse:>15}")
    print(
        f"stage 2 / stage 1 time: {t2_shared / t1:.2f} with prefix-KV reuse, {t2_reenc / t1:.2f} re-encoding; "
        f"reuse and re-encoding give the same samples: {same}"
        + (f"; prefix cache served {cache[1]}/{cache[0]} prompt tokens" if cache else "")
    )
    if args.backend == "vllm":
        for backend in (shared, reencode):
            backend.close()
    print(json.dumps({
        "backend": args.backend, "G": args.G, "T": args.T, "N": args.N, "rho": args.rho, "budget": budget,
        "stage1_s": t1, "stage2_reuse_s": t2_shared, "stage2_reencode_s": t2_reenc,
        "prefill_reuse_s": p_shared, "prefill_reencode_s": p_reenc, "reuse_speedup": t2_reenc / t2_shared,
        "stage2_over_stage1_reuse": t2_shared / t1, "same_samples": same,
        "prefix_cache_hit_frac": cache[1] / cache[0] if cache and cache[0] else None,
    }))
    return table


if __name__ == "__main__":
    main()
