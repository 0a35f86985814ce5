"""GPU smoke check of the paper-scale path: a mid-size LLaDA-style dLLM, 4-bit NF4 + LoRA, ERILS steps, decoding.

    python benchmarks/gpu_smoke.py                       # ~0.9B params, 2 rollout batches x 2 updates, 1 GPU
    python benchmarks/gpu_smoke.py --layers 32 --d-model 4096 --mlp 12288 --vocab 126464   # LLaDA-8B shape
    python benchmarks/gpu_smoke.py --cpu-dry-run         # the same code path, tiny, on CPU (for development)

No download: the model is ``tests/fixtures/tiny_llada``'s tokenizer with a scaled LLaDA ``config.json`` and
random weights, written to a temporary folder and loaded as the paper configs load LLaDA-8B-Instruct: through
:class:`lit_rl.models.NativeLLaDA` (default, ``--policy native``) or through the fixture's remote code and
:class:`lit_rl.models.PretrainedDiffusionLM` (``--policy remote``); bitsandbytes NF4 with bf16 compute, LoRA r=128 α=64
on the attention + MLP projections, activation checkpointing). ERILS runs through Lightning (``bf16-mixed``) with the
Sudoku task and the scripted external pool (``data/pools/sudoku_scripted.jsonl.gz``), rollouts at L_gen 256 / 128
steps / block 32; then a resume from a checkpoint for one more rollout batch; then one greedy decoding batch per
decoding mode (exact, prefix and dual KV cache, dual cache + confidence threshold 0.9; :mod:`lit_rl.generation.cached`)
on the 4-bit policy and on the same weights in bf16 without quantisation. Printed figures:

* peak GPU memory (``torch.cuda.max_memory_allocated``) of training and of decoding;
* update time: the training step's wall time / updates per batch (rollout generation runs before it, in the
  DataModule's ``on_after_batch_transfer``, and is timed separately), and its tokens/s
  (the surrogate processes ``num_t x rows x (prompt + completion)`` tokens per update);
* decoding tokens/s (completion tokens of the batch / wall time), per-step latency and peak memory per
  mode and weight format, each mode's speed-up over exact and its token agreement with exact;
* achieved TFLOP/s, counted as 2·N·tokens per forward pass over the N base parameters (attention score
  FLOPs excluded): an update with a frozen base is 1 forward + 1 recomputed forward (checkpointing) + 1
  backward through activations (~2 forwards), i.e. 8·N per token; a decoding step is 2·N per token.

Exits with status 0 and a message when no CUDA GPU is present (never needed by CI).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/tiny_llada"
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"


def write_model_dir(out: Path, d_model: int, layers: int, heads: int, mlp: int, vocab: int, dtype: str,
                    native: bool = True) -> int:
    """A LLaDA-style model folder (fixture code + tokenizer, scaled config, random weights); returns #params.

    ``native``: weights written by lit_rl's native LLaDA (the paper configs' policy class); otherwise by the
    fixture's remote code."""
    import torch
    from transformers import AutoConfig, AutoModel

    for f in FIXTURE.iterdir():
        if f.suffix in (".py", ".json", ".jinja") and f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg.update(d_model=d_model, n_layers=layers, n_heads=heads, mlp_hidden_size=mlp, vocab_size=vocab,
               embedding_size=vocab, max_sequence_length=4096)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.manual_seed(0)
    if native:
        from lit_rl.models.llada import REQUIRED, NativeLLaDAConfig, NativeLLaDAModel

        cfg.update({k: v[0] for k, v in REQUIRED.items()})  # LLaDA-8B-Instruct's options (the fixture omits them)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        model = NativeLLaDAModel(NativeLLaDAConfig.from_llada_json(out)).to(getattr(torch, dtype))
    else:
        config = AutoConfig.from_pretrained(out, trust_remote_code=True)
        model = AutoModel.from_config(config, trust_remote_code=True, dtype=getattr(torch, dtype))
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    del model
    return n


class _Timer:
    """Lightning callback: wall time of each training step (the μ updates; generation ran just before)."""

    def __init__(self) -> None:
        import lightning as L

        class Cb(L.Callback):
            def __init__(cb) -> None:
                cb.batches: list[dict] = []

            def on_train_batch_start(cb, trainer, pl_module, batch, batch_idx) -> None:
                cb.t0 = time.perf_counter()

            def on_train_batch_end(cb, trainer, pl_module, outputs, batch, batch_idx) -> None:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                ro = batch.rollouts
                cb.batches.append({
                    "wall_s": time.perf_counter() - cb.t0,
                    "gen_s": float(trainer.datamodule.last_stats.get("time/generation_s", 0.0)),
                    "rows": int(ro.input_ids.shape[0]),
                    "seq_len": int(ro.input_ids.shape[1]),
                })

        self.cb = Cb()


def masks_match_cpu(device: str) -> bool:
    """The random-draw rule on the real device: SPG masks built for rollouts on ``device`` from
    per-rollout CPU seeds equal the CPU ones (before the fix the first ERILS update on CUDA raised "Expected
    a 'cuda' device type for generator but found 'cpu'")."""
    import torch

    from lit_rl.algorithms.surrogates import SPGSurrogate

    lengths = torch.tensor([256, 100, 31, 300, 64, 1])
    cm = torch.arange(320)[None, :] < lengths[:, None]  # (6, 320)
    source = torch.tensor([0, 0, 0, 1, 1, 1])
    width = torch.tensor([256, 256, 256, 320, 320, 320])
    spg = SPGSurrogate(num_t=2, block_length=32)
    seeds = list(range(100, 106))
    cpu = spg.build_masks(cm, torch.ones(6, 40), source, seeds=seeds, gen_width=width)
    dev = spg.build_masks(cm.to(device), torch.ones(6, 40, device=device), source.to(device), seeds=seeds,
                          gen_width=width.to(device))
    return all(torch.equal(a, b.cpu()) for a, b in zip(cpu, dev))


DECODE_MODES = {
    "exact": {},
    "prefix": {"cache": "prefix"},
    "dual": {"cache": "dual"},
    "dual+thr0.9": {"cache": "dual", "threshold": 0.9},
}


def decode_modes(policy, ids, mask, gen_length: int, steps: int, gpu: bool, modes: list[str]) -> dict[str, dict]:
    """One greedy ``policy.generate`` per mode of :data:`DECODE_MODES` (block 32, bf16 autocast on the GPU):
    wall time, completion tokens/s, speed-up over exact, peak memory and token agreement with exact."""
    import torch

    from lit_rl.generation.settings import DecodeSettings

    out: dict[str, dict] = {}
    ref = None
    for mode in modes:
        settings = DecodeSettings(gen_length=gen_length, block_length=32, steps=steps, temperature=0.0,
                                  **DECODE_MODES[mode])
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=gpu):
            t0 = time.perf_counter()
            comp = policy.generate(ids, mask, settings, seed=0)
            if gpu:
                torch.cuda.synchronize()
            secs = time.perf_counter() - t0
        ref = comp if ref is None else ref
        out[mode] = {
            "time_s": round(secs, 3), "tokens_per_s": round(comp.numel() / secs),
            "speedup": round(out["exact"]["time_s"] / secs, 2) if out else 1.0,
            "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2) if gpu else float("nan"),
            "agreement": round(float((comp == ref).float().mean()), 4),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--mlp", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--lora-r", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=2, help="prompt groups per rollout batch")
    ap.add_argument("--g-on", type=int, default=4)
    ap.add_argument("--g-ext", type=int, default=2)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=128, help="diffusion steps of rollout/decoding generation")
    ap.add_argument("--updates", type=int, default=2, help="optimizer updates per rollout batch (paper 12)")
    ap.add_argument("--batches", type=int, default=2, help="rollout batches (the first one includes warm-up)")
    ap.add_argument("--micro-batch", type=int, default=6, help="rollouts per forward/backward")
    ap.add_argument("--decode-batch", type=int, default=16)
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny model on CPU, float32 compute (development)")
    ap.add_argument("--policy", choices=["native", "remote"], default="native",
                    help="NativeLLaDA (the paper configs' class) or PretrainedDiffusionLM on the fixture's remote code")
    args = ap.parse_args(argv)

    import torch

    if args.cpu_dry_run:
        args.d_model, args.layers, args.heads, args.mlp, args.vocab, args.lora_r = 64, 2, 4, 128, 128, 8
        args.gen_length, args.steps, args.decode_batch = 64, 8, 4
    elif not torch.cuda.is_available():
        print("gpu_smoke: no CUDA GPU available; nothing to measure (run on a GPU machine, or --cpu-dry-run).")
        return 0
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        print("gpu_smoke: bitsandbytes is not installed (pip install bitsandbytes); 4-bit loading needs it.")
        return 0

    import lightning as L

    from datamodules import RolloutDataModule
    from lit_rl.algorithms.erils import ERILSModule
    from lit_rl.algorithms.surrogates import SPGSurrogate
    from lit_rl.generation.settings import DecodeSettings
    from lit_rl.models import LoraSettings, NativeLLaDA, PretrainedDiffusionLM, QuantizationSettings
    from lit_rl.tasks import SudokuTask

    gpu = not args.cpu_dry_run
    compute = "bfloat16" if gpu else "float32"
    tmp = Path(tempfile.mkdtemp(prefix="lit_rl_gpu_smoke_"))
    try:
        t0 = time.perf_counter()
        native = args.policy == "native"
        n_params = write_model_dir(tmp, args.d_model, args.layers, args.heads, args.mlp, args.vocab,
                                   "bfloat16" if gpu else "float32", native)
        print(f"model: {n_params / 1e9:.3f}B params (d_model {args.d_model}, {args.layers} layers, mlp {args.mlp}, "
              f"vocab {args.vocab}); written in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        policy_cls = NativeLLaDA if native else PretrainedDiffusionLM
        policy = policy_cls(
            str(tmp), mask_id=None, eos_id=None, dtype="bfloat16" if gpu else "float32",
            quantization=QuantizationSettings(compute_dtype=compute),
            lora=LoraSettings(r=args.lora_r, alpha=args.lora_r // 2, dropout=0.05),
            gradient_checkpointing=True, device="cuda" if gpu else None,
        )
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
        print(f"loaded 4-bit NF4 + LoRA r={args.lora_r} in {time.perf_counter() - t0:.1f}s; "
              f"trainable {trainable / 1e6:.1f}M")
        if gpu:
            torch.cuda.reset_peak_memory_stats()
            print(f"GPU memory after load: {torch.cuda.memory_allocated() / 2**30:.2f} GiB")

        masks_ok = masks_match_cpu("cuda" if gpu else "cpu")
        print(f"SPG masks on the device equal the CPU ones: {masks_ok}")
        gen = DecodeSettings(gen_length=args.gen_length, block_length=32, steps=args.steps, temperature=1.0)
        dm = RolloutDataModule(
            task=SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000),
            pool_path=str(POOL) if args.g_ext else None, prompts_per_batch=args.prompts, g_on=args.g_on,
            g_ext=args.g_ext,
            generation=gen, max_prompt_len=200, eval_size=4, eval_batch_size=4, output_dir=str(tmp / "run"),
        )
        module = ERILSModule(
            policy, surrogate=SPGSurrogate(beta=1.0, num_t=2, mode="mix", block_length=32),
            optimizer=lambda p: torch.optim.AdamW(p, lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1),
            updates_per_batch=args.updates, micro_batch_size=args.micro_batch, grad_clip=0.2,
        )
        timer = _Timer().cb
        trainer = L.Trainer(
            accelerator="gpu" if gpu else "cpu", devices=1, precision="bf16-mixed" if gpu else "32-true",
            max_steps=args.updates * args.batches, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
            default_root_dir=str(tmp / "run"),
        )
        trainer.fit(module, datamodule=dm)
        train_peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")

        n_base = n_params  # FLOPs count all base parameters (4-bit weights are dequantised to bf16 for the matmul)
        print("\nERILS rollout batches (generation + updates):")
        for i, b in enumerate(timer.batches):
            upd = b["wall_s"] / args.updates
            toks = 2 * b["rows"] * b["seq_len"]  # num_t = 2 draws per rollout
            tflops = 8 * n_base * toks / upd / 1e12
            gen_toks = args.prompts * args.g_on * args.gen_length
            print(f"  batch {i}: {b['rows']} rollouts x {b['seq_len']} tokens; generation {b['gen_s']:.2f}s "
                  f"({gen_toks / max(b['gen_s'], 1e-9):.0f} completion tok/s); update {upd:.2f}s "
                  f"({toks / upd:.0f} tok/s, {tflops:.1f} TFLOP/s)")
        last = timer.batches[-1]

        # a resume: the checkpoint of the run above, then one more rollout batch in a new Trainer
        ckpt = tmp / "run" / "smoke.ckpt"
        trainer.save_checkpoint(ckpt)
        resumed = L.Trainer(
            accelerator="gpu" if gpu else "cpu", devices=1, precision="bf16-mixed" if gpu else "32-true",
            max_steps=args.updates * (args.batches + 1), limit_val_batches=0, num_sanity_val_steps=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=str(tmp / "run"),
        )
        t0 = time.perf_counter()
        resumed.fit(module, datamodule=dm, ckpt_path=str(ckpt))
        resume_s = time.perf_counter() - t0
        print(f"resumed from {ckpt.name} at step {trainer.global_step} -> {resumed.global_step} in {resume_s:.1f}s")

        # decoding: one greedy batch per mode (exact, KV caches, threshold), 4-bit and bf16, with bf16 autocast
        examples = dm.task.eval_examples()[: args.decode_batch]
        ids, mask = policy.encode_prompts([dm.task.messages(e) for e in examples], 200)
        # Lightning's teardown moves the module back to the CPU after each fit: on the H200 (2026-12-04) the
        # decoding then ran bitsandbytes' CPU kernels for minutes; decode on the device the fits trained on
        dev = torch.device("cuda" if gpu else "cpu")
        policy.to(dev)
        ids, mask = ids.to(dev), mask.to(dev)
        modes = list(DECODE_MODES) if native else ["exact"]  # the remote code has no KV-cached forward
        decode = {"4bit": decode_modes(policy, ids, mask, args.gen_length, args.steps, gpu, modes)}
        del module, policy
        if gpu:
            torch.cuda.empty_cache()
        if native:
            bf16 = NativeLLaDA(str(tmp), mask_id=None, eos_id=None, dtype="bfloat16" if gpu else "float32",
                               device="cuda" if gpu else None)
            decode["bf16"] = decode_modes(bf16, ids, mask, args.gen_length, args.steps, gpu, modes)
        print("\ndecoding (greedy, batch %d, L_gen %d, %d steps, block 32):"
              % (ids.shape[0], args.gen_length, args.steps))
        for weights, modes in decode.items():
            for mode, r in modes.items():
                print(f"  {weights:5s} {mode:12s} {r['time_s']:7.2f}s {r['tokens_per_s']:8.0f} tok/s  "
                      f"x{r['speedup']:.2f}  peak {r['peak_mem_GiB']:.2f} GiB  agreement {r['agreement']:.4f}")
        exact = decode["4bit"]["exact"]
        dec_s, dec_tokens = exact["time_s"], ids.shape[0] * args.gen_length
        dec_tflops = 2 * n_base * args.steps * ids.shape[0] * (ids.shape[1] + args.gen_length) / dec_s / 1e12
        dec_peak = exact["peak_mem_GiB"]

        upd = last["wall_s"] / args.updates
        toks = 2 * last["rows"] * last["seq_len"]
        summary = {
            "device": torch.cuda.get_device_name(0) if gpu else "cpu (dry run)",
            "params_B": round(n_params / 1e9, 3),
            "trainable_M": round(trainable / 1e6, 1),
            "train_peak_mem_GiB": round(train_peak, 2),
            "update_time_s": round(upd, 3),
            "update_tokens_per_s": round(toks / upd),
            "update_TFLOPs": round(8 * n_base * toks / upd / 1e12, 2),
            "rollout_generation_s": round(last["gen_s"], 2),
            "decode_batch": int(ids.shape[0]),
            "decode_time_s": round(dec_s, 2),
            "decode_tokens_per_s": round(dec_tokens / dec_s),
            "decode_step_ms": round(1000 * dec_s / args.steps, 1),
            "decode_TFLOPs": round(dec_tflops, 2),
            "decode_peak_mem_GiB": round(dec_peak, 2),
            "global_step": trainer.global_step,
            "resumed_global_step": resumed.global_step,
            "resume_s": round(resume_s, 2),
            "decode_modes": decode,
            "masks_match_cpu": masks_ok,
        }
        print("\nsummary: " + json.dumps(summary))
        if not masks_ok:
            print("gpu_smoke: masks drawn for device rollouts differ from the CPU ones", file=sys.stderr)
            return 1
        if trainer.global_step != args.updates * args.batches:
            print(f"gpu_smoke: expected {args.updates * args.batches} optimizer steps, got {trainer.global_step}",
                  file=sys.stderr)
            return 1
        if resumed.global_step != args.updates * (args.batches + 1):
            print(f"gpu_smoke: the resumed run ended at step {resumed.global_step}", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
