"""HF vs vLLM for the AR rollouts of GRPO and the continuations of double rollout, side by side in one run.

Both backends get the same policy (the chain-sum shape by default: a 4-layer, 128-wide Llama with the char
tokenizer, fp32), the same prompts and sampling settings; per rollout batch this times

* **GRPO stage 1**: ``B`` prompts x ``G`` samples of up to ``T`` tokens (``generate``);
* **DR stage 2**: ``N`` continuations of each of the ``B*G`` rollouts cut at ``rho`` (``continue_from``: HF
  prefills each prefix once and shares its KV cache N ways; vLLM's prefix cache shares whole blocks);
* **weight push** (vLLM only; HF shares the policy's modules): ``push_weights`` after an update;
* **HF beside the engine**: the HF side again, in the same process after the engine started (in colocate mode the
  trainer's own forward and backward run there too, after vLLM has bound its CPU threads).

and prints wall time (best of ``--repeats``, after one warm-up batch), generated tokens and tokens/s, with the
vLLM/HF ratio, then one JSON line. The engine start-up is reported apart (once per fit). Samples differ between
the two samplers (different noise), so each side's own token count is used for its rate. Run in the vLLM
environment (scripts/setup.sh vllm):

    .venv-vllm/bin/python benchmarks/ar_backends.py            # defaults: B 4, G 16, T 48, N 4 (the testbed's)
    .venv-vllm/bin/python benchmarks/ar_backends.py --quick    # a few seconds per side (the test)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from lit_rl.core.double_rollout import continuation_budget, cut_index
from lit_rl.generation.ar import HFBackend, VLLMBackend
from lit_rl.models.ar import TinyCausalLM


def _best(fn, repeats: int):
    fn()  # warm-up (allocators, vLLM's first scheduling)
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    policy = TinyCausalLM(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                          intermediate_size=4 * args.hidden, max_positions=256, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, len(policy.tokenizer), (args.prompts, args.prompt_len), generator=g)  # (B, P)
    prompt_mask = torch.ones_like(prompt_ids)
    hf = HFBackend(policy)
    cut = cut_index(args.T, args.rho)
    budget = continuation_budget(args.T, args.rho, args.buffer)
    rows: dict[str, dict] = {}

    def measure(name: str, backend) -> None:
        t1, comp = _best(lambda: backend.generate(prompt_ids, prompt_mask, max_new_tokens=args.T, temperature=1.0,
                                                  n=args.G, seed=1), args.repeats)
        prompts = prompt_ids.repeat_interleave(args.G, 0)  # (B*G, P)
        prefixes = [p + r[:cut] for p, r in zip(prompts.tolist(), comp.tolist())]
        t2, cont = _best(lambda: backend.continue_from(prefixes, n=args.N, max_new_tokens=budget, temperature=1.0,
                                                       seed=2), args.repeats)
        n1, n2 = int(policy.completion_lengths(comp).sum()), int(policy.completion_lengths(cont).sum())  # EOS included
        rows[name] = {"stage1_s": t1, "stage1_tokens": n1, "stage1_tok_s": n1 / t1,
                      "stage2_s": t2, "stage2_tokens": n2, "stage2_tok_s": n2 / t2}

    measure("hf", hf)  # before any engine exists in this process
    t0 = time.perf_counter()
    vllm = VLLMBackend(policy, dtype="float32", kv_cache_memory_bytes=256 << 20, enforce_eager=not args.compile,
                       block_size=32, llm_kwargs={"disable_log_stats": False})
    start_s = time.perf_counter() - t0
    measure("vllm", vllm)
    # colocated: the trainer's HF compute runs in the engine's process, after vLLM has bound its CPU threads
    measure("hf_beside_engine", hf)
    push_s, _ = _best(lambda: vllm.push_weights(policy), args.repeats)
    rows["vllm"]["push_s"] = push_s
    queried, hit = vllm.prefix_cache_counts() or (0, 0)
    vllm.close()
    summary = {
        "model": f"TinyCausalLM h{args.hidden} L{args.layers} heads{args.heads} fp32", "machine": platform.machine(),
        "cpus": os.cpu_count(), "hf_threads": args.threads, "prompts": args.prompts, "G": args.G, "T": args.T,
        "N": args.N, "rho": args.rho, "continuation_budget": budget, "vllm_compiled": bool(args.compile),
        "vllm_start_s": start_s, "vllm_prefix_cache_hit_frac": hit / queried if queried else None, **{
            f"{side}_{k}": v for side, r in rows.items() for k, v in r.items()},
        "stage1_speedup_vllm_over_hf": rows["hf"]["stage1_s"] / rows["vllm"]["stage1_s"],
        "stage2_speedup_vllm_over_hf": rows["hf"]["stage2_s"] / rows["vllm"]["stage2_s"],
        "stage1_tok_s_ratio_vllm_over_hf": rows["vllm"]["stage1_tok_s"] / rows["hf"]["stage1_tok_s"],
        "stage2_tok_s_ratio_vllm_over_hf": rows["vllm"]["stage2_tok_s"] / rows["hf"]["stage2_tok_s"],
        "hf_slowdown_beside_engine": rows["hf_beside_engine"]["stage1_s"] / rows["hf"]["stage1_s"],
    }
    print(f"{summary['model']}; B {args.prompts} x G {args.G}, T {args.T}; DR: cut {cut}, N {args.N}, budget {budget}; "
          f"HF {args.threads} torch threads, vLLM CPU ({'compiled' if args.compile else 'eager'}), "
          f"engine start {start_s:.1f} s")
    print(f"{'stage':<26} {'HF s':>8} {'vLLM s':>8} {'HF tok/s':>10} {'vLLM tok/s':>11} {'vLLM/HF tok/s':>14}")
    for stage, label in (("stage1", f"GRPO rollouts (G {args.G})"), ("stage2", f"DR continuations (N {args.N})")):
        h, v = rows["hf"], rows["vllm"]
        print(f"{label:<26} {h[stage + '_s']:>8.2f} {v[stage + '_s']:>8.2f} {h[stage + '_tok_s']:>10.0f} "
              f"{v[stage + '_tok_s']:>11.0f} {v[stage + '_tok_s'] / h[stage + '_tok_s']:>13.2f}x")
    print(f"vLLM weight push {push_s * 1000:.0f} ms; prefix-cache hits {hit}/{queried} prompt tokens; HF stage 1 "
          f"in the same process after the engine started: {summary['hf_slowdown_beside_engine']:.2f}x its time before")
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per rollout batch (B)")
    ap.add_argument("--G", type=int, default=16, help="rollouts per prompt")
    ap.add_argument("--T", type=int, default=48, help="max new tokens per rollout")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--rho", type=float, default=0.9)
    ap.add_argument("--N", type=int, default=4, help="continuations per rollout")
    ap.add_argument("--buffer", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4, help="heads (vLLM's CPU attention needs head_dim >= 32)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the HF side")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="let vLLM compile (start ~60 s instead of ~5 s)")
    ap.add_argument("--quick", action="store_true", help="B 2, G 4, T 16, N 2, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.G, args.T, args.N, args.repeats = 2, 4, 16, 2, 1
    return run(args)


if __name__ == "__main__":
    main()
