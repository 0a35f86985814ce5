"""Cost of the decoding noise per step: Gumbel-max vs inverse-CDF sampling, and where the noise is drawn.

    python benchmarks/sampler_noise.py                       # N 256 masked positions x V 126464 (LLaDA), CPU
    python benchmarks/sampler_noise.py --device cuda         # adds "CPU draw then .to(cuda)" for the Gumbel noise

The Gumbel-max sampler (the LLaDA reference) draws one float64 uniform per vocabulary entry per masked
position: ``N x V x 8`` bytes per step (~0.26 GB at N 256, V 126,464). ``lit_rl.rng``'s rule keeps such noise on
the device (a generator there, seeded from the run's seed) instead of drawing it on CPU and copying it; the
``inverse_cdf`` sampler draws one uniform per position (same distribution, another random stream). Each
variant runs ``_choose_tokens`` (the decoder's per-step sampling) on the same logits; best of ``--repeats``.
Prints a table, then one JSON line with the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _time(fn, device, repeats: int) -> float:
    import torch

    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=256, help="masked positions sampled per step (B x block)")
    ap.add_argument("--vocab", type=int, default=126464)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    import torch

    from lit_rl import rng
    from lit_rl.generation.diffusion import _choose_tokens

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("sampler_noise: no CUDA device")
        return 0
    logits = torch.randn(args.positions, args.vocab, generator=rng.cpu_generator(0)).to(device)  # (N, V)
    variants = {
        "gumbel, device generator": lambda: _choose_tokens(logits, 1.0, 0, "gumbel", rng.device_generator(1, device),
                                                           torch.float64),
        "inverse_cdf, device generator": lambda: _choose_tokens(logits, 1.0, 0, "inverse_cdf",
                                                                rng.device_generator(1, device), torch.float64),
    }
    if device.type != "cpu":
        variants["gumbel, CPU draw then .to(device)"] = lambda: _choose_tokens(logits, 1.0, 0, "gumbel",
                                                                               rng.cpu_generator(1), torch.float64)
    times = {name: _time(fn, device, args.repeats) for name, fn in variants.items()}
    noise_gb = args.positions * args.vocab * 8 / 1e9
    base = times["gumbel, device generator"]
    print(f"N {args.positions} positions x V {args.vocab} on {device}: Gumbel noise {noise_gb:.3f} GB per step")
    for name, t in times.items():
        print(f"  {name:36s} {1000 * t:9.1f} ms   x{t / base:.2f} of Gumbel on the device")
    out = {
        "device": str(device), "positions": args.positions, "vocab": args.vocab, "gumbel_noise_GB": round(noise_gb, 3),
        **{f"ms[{k}]": round(1000 * v, 2) for k, v in times.items()},
        "inverse_cdf_over_gumbel": round(times["inverse_cdf, device generator"] / base, 3),
    }
    if device.type != "cpu":
        out["cpu_draw_over_device_draw"] = round(times["gumbel, CPU draw then .to(device)"] / base, 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
