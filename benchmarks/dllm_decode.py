"""dLLM decoding speed and accuracy: exact vs prefix cache vs dual cache vs dual cache + threshold.

One run, side by side (:mod:`lit_rl.generation.cached`):

* **speed**: tokens/s of each mode on real Sudoku prompts, for the embedded tiny model (BERT 4 x 128, trained
  by this script) and a larger one (BERT 6 x 256, random weights), batch 1 and 8, L_gen 64 and 256, block 32,
  steps L_gen / 2, greedy; with the positions run through the layers per call (``forward tokens``: what a GPU's
  compute scales with) and the share of completion tokens equal to the exact decode's. Threshold decoding
  (τ 0.9) runs on the trained model only: on random weights no position is ever confident, so it reveals one
  token per step (twice the schedule's forwards) and measures nothing about the method.
* **accuracy**: greedy cell accuracy on all 256 puzzles of SPG's Sudoku test split (L_gen 64, block 32, 32
  steps) of the trained tiny model under each mode, and the change against exact.

The trained model: answer-only masked-denoising SFT (``<answer>solution</answer>``, EOS to the end of the
width, LLaDA's SFT loss) of the embedded 0.9M-parameter ``TinyDiffusionLM``; cached in ``--cache-dir``
keyed by its settings. Timings are the best of ``--repeats`` calls (one for the slowest cells), on
``--threads`` threads; they are this machine's, and the ratios are what carries over.

    python benchmarks/dllm_decode.py            # ~8 min on 2 CPU cores (+4 min SFT the first time)
    python benchmarks/dllm_decode.py --quick    # seconds: tiny sizes, what tests/benchmarks runs
    python benchmarks/dllm_decode.py --device cuda

The last line is one JSON object: per model / batch / L_gen, each mode's speed-up over exact, its
forward-token ratio and token agreement; per mode the accuracy and its change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import torch

from lit_rl.core.denoising import denoising_masks, masked_denoising_loss
from lit_rl.generation.cached import DecodeStats, cached_diffusion_generate
from lit_rl.generation.diffusion import diffusion_generate
from lit_rl.models import TinyDiffusionLM
from lit_rl.checkpoint_io import atomic_torch_save
from lit_rl.rng import cpu_generator
from lit_rl.tasks import SudokuTask

MODES = {
    "exact": {},
    "prefix": {"cache": "prefix"},
    "dual": {"cache": "dual"},
    "dual+thr0.9": {"cache": "dual", "threshold": 0.9},
}


def _task() -> SudokuTask:
    return SudokuTask(system_prompt="", question_template="{puzzle}", num_train=4000)  # the embedded prompt


def _policy(hidden: int, layers: int, heads: int, mlp: int) -> TinyDiffusionLM:
    return TinyDiffusionLM(hidden_size=hidden, num_layers=layers, num_heads=heads, intermediate_size=mlp,
                           max_positions=512, seed=0)


def answer_sft(policy: TinyDiffusionLM, task: SudokuTask, steps: int, batch: int, lr: float, width: int,
               seed: int = 0) -> float:
    """Masked-denoising SFT on ``<answer>solution</answer>`` completions (EOS to ``width``); returns the loss."""
    rng, gen = random.Random(seed), cpu_generator(seed)
    examples = task.train_examples()
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - s / max(steps, 1)))
    policy.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        rows = [examples[rng.randrange(len(examples))] for _ in range(batch)]
        prompt_ids, prompt_mask = policy.encode_prompts([task.messages(e) for e in rows], 64)
        comp, _ = policy.encode_completions([f"<answer>{e.answer}</answer>" for e in rows], width)  # (B, L)
        t, masked = denoising_masks(torch.ones_like(comp, dtype=torch.bool), gen)
        noisy = torch.where(masked, torch.full_like(comp, policy.mask_id), comp)
        P = prompt_ids.shape[1]
        logits = policy(torch.cat([prompt_ids, noisy], 1), torch.cat([prompt_mask, torch.ones_like(comp)], 1))[:, P:]
        loss = masked_denoising_loss(logits, comp, masked, t, torch.full((batch,), width))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
    policy.eval()
    return float(loss.detach())


def trained_tiny(cache_dir: str | None, steps: int, batch: int, lr: float, width: int) -> tuple[TinyDiffusionLM, str]:
    policy = _policy(128, 4, 4, 512)
    key = hashlib.sha256(f"answer-sft|{steps}|{batch}|{lr}|{width}|v1".encode()).hexdigest()[:12]
    path = Path(cache_dir) / f"dllm_decode_sft_{key}.pt" if cache_dir else None
    if path is not None and path.exists():
        policy.load_state_dict(torch.load(path, weights_only=True))
        return policy.eval(), f"loaded {path}"
    start = time.perf_counter()
    loss = answer_sft(policy, _task(), steps, batch, lr, width)
    note = f"answer-only SFT {steps} steps x {batch} in {time.perf_counter() - start:.0f} s, final loss {loss:.3f}"
    if path is not None:
        atomic_torch_save(policy.state_dict(), path)
    return policy.eval(), note


def decode(policy, ids, mask, mode: str, L: int, block: int, stats: DecodeStats | None = None) -> torch.Tensor:
    """Greedy completions ``(B, L)`` under ``mode``; exact is the reference decoder itself."""
    kw = dict(gen_length=L, block_length=block, steps=L // 2, temperature=0.0, mask_id=policy.mask_id)
    fn = lambda i, m: policy(i, m)  # noqa: E731
    if mode == "exact":
        out = diffusion_generate(fn, ids, mask, **kw)
        if stats is not None:
            stats.forward_tokens += ids.shape[0] * (ids.shape[1] + L) * (L // 2)
    else:
        out = cached_diffusion_generate(ids, mask, model_fn=fn, stack=policy.kv_stack(), stats=stats, **MODES[mode],
                                        **kw)
    return out[:, ids.shape[1]:]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def speed_cell(policy, ids, mask, modes, L, block, repeats, device) -> dict[str, dict]:
    """Each mode's best time, tokens/s, forward tokens and agreement with exact, on one batch."""
    res: dict[str, dict] = {}
    ref = None
    for mode in modes:
        best, out, stats = float("inf"), None, DecodeStats()
        for r in range(repeats):
            s = DecodeStats()
            _sync(device)
            start = time.perf_counter()
            out = decode(policy, ids, mask, mode, L, block, s)
            _sync(device)
            best = min(best, time.perf_counter() - start)
            stats = s
        ref = out if mode == "exact" else ref
        res[mode] = {
            "seconds": best, "tokens_per_s": ids.shape[0] * L / best, "forward_tokens": stats.forward_tokens,
            "agreement": float((out == ref).float().mean()),
        }
    for mode, r in res.items():
        r["speedup"] = res["exact"]["seconds"] / r["seconds"]
        r["forward_ratio"] = res["exact"]["forward_tokens"] / r["forward_tokens"]
    return res


def accuracy(policy, task, examples, mode, L, block, batch_size, device) -> tuple[float, float, torch.Tensor]:
    """Pooled greedy cell accuracy over ``examples`` (correct blank cells / blank cells), seconds, tokens."""
    correct = total = 0.0
    outs = []
    start = time.perf_counter()
    for i in range(0, len(examples), batch_size):
        rows = examples[i : i + batch_size]
        ids, mask = policy.encode_prompts([task.messages(e) for e in rows], 64)
        comp = decode(policy, ids.to(device), mask.to(device), mode, L, block)
        outs.append(comp.cpu())
        for text, e in zip(policy.decode_completions(comp), rows):
            score = task.evaluate(text, e)
            correct, total = correct + score.correct, total + score.total
    return correct / max(total, 1), time.perf_counter() - start, torch.cat(outs)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few puzzles (seconds): the test's mode")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timing repeats (best of); 1 for cells over 5 s")
    ap.add_argument("--cache-dir", default="runs/cache", help="where the SFT model is cached ('' disables)")
    ap.add_argument("--sft-steps", type=int, default=900)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task = _task()
    quick = args.quick
    sft_steps = 3 if quick else args.sft_steps
    tiny, note = trained_tiny(None if quick else (args.cache_dir or None), sft_steps, 64, 1e-3, 32 if quick else 64)
    print(f"trained tiny model: {note}", flush=True)
    models = {"tiny 4x128 (trained)": tiny}
    models["larger 6x256 (random)"] = _policy(32, 2, 2, 64) if quick else _policy(256, 6, 4, 1024)
    lengths, batches, block = ((32,), (1, 4), 16) if quick else ((64, 256), (1, 8), 32)
    examples = task.eval_examples()
    summary: dict = {"speed": {}, "accuracy": {}}

    print("\n| model | batch | L_gen | mode | time (s) | tokens/s | speed-up | forward tokens | fwd ratio "
          "| agreement |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, policy in models.items():
        policy.to(device).eval()
        modes = list(MODES) if "trained" in name else [m for m in MODES if "thr" not in m]
        for B in batches:
            ids, mask = policy.encode_prompts([task.messages(e) for e in examples[:B]], 64)
            for L in lengths:
                heavy = B * L * policy.model.config.hidden_size >= 8 * 256 * 128 and not quick
                cell = speed_cell(policy, ids.to(device), mask.to(device), modes, L, block,
                                  1 if heavy else args.repeats, device)
                summary["speed"][f"{name.split()[0]}/B{B}/L{L}"] = {
                    m: {k: round(r[k], 4) for k in ("speedup", "forward_ratio", "agreement", "tokens_per_s")}
                    for m, r in cell.items()
                }
                for m, r in cell.items():
                    print(f"| {name} | {B} | {L} | {m} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} | "
                          f"{r['speedup']:.2f}x | {r['forward_tokens']:,} | {r['forward_ratio']:.2f}x | "
                          f"{r['agreement']:.4f} |", flush=True)

    acc_examples = examples[:16] if quick else examples
    L_acc, block_acc = (32, 16) if quick else (64, 32)
    print(f"\nGreedy cell accuracy of the trained tiny model, {len(acc_examples)} puzzles, L_gen {L_acc}, "
          f"block {block_acc}, {L_acc // 2} steps")
    print("| mode | accuracy | change | time (s) | tokens equal to exact |")
    print("|---|---|---|---|---|")
    base = ref = None
    for mode in MODES:
        acc, secs, toks = accuracy(tiny, task, acc_examples, mode, L_acc, block_acc, 128, device)
        base = acc if base is None else base
        ref = toks if ref is None else ref
        agree = float((toks == ref).float().mean())
        summary["accuracy"][mode] = {"accuracy": round(acc, 4), "change": round(acc - base, 4),
                                     "seconds": round(secs, 2), "agreement": round(agree, 4)}
        print(f"| {mode} | {acc:.4f} | {acc - base:+.4f} | {secs:.1f} | {agree:.4f} |", flush=True)
    summary["setup"] = {"device": str(device), "threads": args.threads, "quick": quick, "sft": note, "block": block,
                        "threshold": 0.9}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
