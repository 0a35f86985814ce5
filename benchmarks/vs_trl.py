"""lit_rl's GRPO against TRL's ``GRPOTrainer``, side by side, on the chain-sum testbed.

Both sides train the same tiny causal LM (``TinyCausalLM``: a transformers ``LlamaForCausalLM``, h128, 4 layers,
char tokenizer, the same token ids) from the same warm-started weights (the config's ``ScriptedSFTWarmup``,
run once and cached) on the same chain-sum training problems, with G 16, 4 prompts per update,
max_new_tokens 48, T 1, lr 1e-4, AdamW (0.9, 0.99), clip (0.2, 0.28), mean-centred advantages, truncated
completions masked, and one optimizer update per rollout batch (lit_rl ``updates_per_batch`` 1, TRL
``num_iterations`` 1), all on the CPU in float32:

* **lit_rl**: a Lightning fit of ``conf/double_rollout.yaml`` + ``conf/double_rollout_chainsum.yaml`` +
  ``conf/grpo_chainsum.yaml`` (GRPO on
  the HF backend) through lit_rl's LightningCLI, with μ 1, ``max_steps``, the warm start as
  ``init_checkpoint``, and no logger, checkpoint or evaluation callback during the timed steps;
* **TRL**: ``GRPOTrainer`` on its defaults except the settings listed in the JSON (``trl_changed_settings``),
  where the two must match; the reward function is the task's verifier;
* **lit_rl double rollout** (``conf/double_rollout_chainsum.yaml``, μ 1): the same number of updates; a row
  TRL cannot run (its second stage samples N continuations of each cut rollout).

Each side and seed runs in a fresh process (peak RSS is that process's own). Per step: wall time split into
generation, scoring and update, rollout tokens/s (how each is measured: ``benchmarks/vs_trl_sides.py``);
the first step (lazy set-up on both sides) is reported apart and left out of the means. Then held-out
accuracy of each final model, by one evaluator for both (T 1 samples on held-out problems, the run's seed).
The table is printed, then one JSON line with every figure.

    python benchmarks/vs_trl.py                       # 3 seeds x 60 updates per side (~10 min on 2 CPU cores)
    python benchmarks/vs_trl.py --quick               # 1 seed, 2 updates, a 10-step warm start (the test)
    python benchmarks/vs_trl.py --sides lit --lit-override model.init_args.loss.old_logprobs=separate_pass

The ``lit_full`` side is lit_rl's GRPO with ``loss.trim_padding: false`` (the loss passes over the whole
generation budget, as before that option): the before / after of the fix, from one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# before torch is imported: with 2 cores, busy-waiting OpenMP threads next to another busy process ran ~40x
# slower (lit_rl.cli._set_threads)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):  # lit_rl from this checkout; the sides module next to this file
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

#: "Equal accuracy", fixed before any comparison run: the seed means of held-out sampled accuracy differ by at
#: most this much (absolute). Full mode scores 128 problems x 4 samples = 512 completions per seed; at p ~ 0.8 a
#: seed's sampling SE is sqrt(0.8 * 0.2 / 512) = 0.018, so the difference of two 3-seed means has SE
#: ~0.014 from evaluation noise alone (training noise adds to it): 0.04 is about 2.5 such SEs.
ACCURACY_TOLERANCE = 0.04
SPEED_GOAL = 1.5  # lit_rl's per-step wall time at least 1.5x faster than TRL's
SIDES = {"trl": "TRL GRPOTrainer", "lit": "lit_rl GRPO (HF)", "lit_full": "lit_rl GRPO, full width",
         "lit_dr": "lit_rl double rollout"}
PHASES = ("wall_s", "gen_s", "score_s", "update_s")


def _child(args: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("SIDE_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{args[:2]} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(line[len("SIDE_RESULT "):])


def _mean_sd(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "per_seed": xs}


def summarize(run: dict) -> dict:
    """One run's figures: means over the steps after the first, the first step apart."""
    steady = run["steps"][1:] or run["steps"]
    out = {k: statistics.fmean(s[k] for s in steady) for k in PHASES}
    gen = sum(s["gen_s"] for s in steady)
    out["tokens_per_step"] = statistics.fmean(s["tokens"] for s in steady)
    out["rollout_tokens_per_s"] = sum(s["tokens"] for s in steady) / gen if gen > 0 else 0.0
    out["first_step_s"] = run["steps"][0]["wall_s"]
    for kind in steady[0]["profile_s"]:
        out[f"profile_{kind}_s"] = statistics.fmean(s["profile_s"][kind] for s in steady)
    out |= {"peak_rss_mb": run["peak_rss_mb"], "heldout_accuracy": run["heldout_accuracy"], "train_s": run["train_s"]}
    return out


def aggregate(runs: list[dict]) -> dict:
    per = [summarize(r) for r in runs]
    return {k: _mean_sd([p[k] for p in per]) for k in per[0]}


def print_table(result: dict) -> None:
    sides = result["sides"]
    base = sides.get("trl")
    print(f"chain-sum GRPO, {result['steps']} updates x seeds {result['seeds']}, G {result['G']}, "
          f"{result['prompts_per_batch']} prompts/update, max_new_tokens {result['max_new_tokens']}; "
          f"{result['machine']['cpu_count']} CPUs, {result['machine']['threads']} torch threads; "
          f"means over steps 2..{result['steps']} and seeds (± sd over seeds)")
    head = (f"{'side':<24}{'step s':>14}{'gen s':>8}{'score s':>9}{'update s':>10}{'tok/s':>8}{'1st s':>7}"
            f"{'RSS MB':>8}{'held-out acc':>15}{'TRL/this':>10}")
    print(head)
    for name, agg in sides.items():
        ratio = f"{base['wall_s']['mean'] / agg['wall_s']['mean']:.2f}x" if base else "-"
        acc = agg["heldout_accuracy"]
        print(f"{SIDES[name]:<24}{agg['wall_s']['mean']:>8.2f}±{agg['wall_s']['sd']:<5.2f}{agg['gen_s']['mean']:>8.2f}"
              f"{agg['score_s']['mean']:>9.3f}{agg['update_s']['mean']:>10.2f}"
              f"{agg['rollout_tokens_per_s']['mean']:>8.0f}{agg['first_step_s']['mean']:>7.1f}"
              f"{agg['peak_rss_mb']['mean']:>8.0f}{acc['mean']:>9.3f}±{acc['sd']:<5.3f}{ratio:>10}")
    for name, agg in sides.items():
        prof = ", ".join(f"{k[8:-2]} {v['mean']:.3f}" for k, v in agg.items() if k.startswith("profile_"))
        print(f"  {SIDES[name]} profile, s per step (nested, see vs_trl_sides.py): {prof}")
    v = result["verdict"]
    if v:
        equal = "equal" if v["equal_accuracy"] else "NOT equal"
        print(f"lit_rl GRPO per step: {v['speedup']:.2f}x TRL (goal {SPEED_GOAL}x: "
              f"{'met' if v['meets_speed_goal'] else 'not met'}); held-out accuracy lit_rl - TRL = "
              f"{v['accuracy_diff']:+.3f} (tolerance {ACCURACY_TOLERANCE}: {equal})")
        if "trim_speedup" in v:
            print(f"the fix (loss.trim_padding): full width {v['full_width_speedup_vs_trl']:.2f}x TRL -> trimmed "
                  f"{v['speedup']:.2f}x TRL ({v['trim_speedup']:.2f}x faster per step)")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 2 updates, 10-step warm start, 8x2 eval samples")
    ap.add_argument("--steps", type=int, default=60, help="optimizer updates per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    ap.add_argument("--eval-problems", type=int, default=128, help="held-out problems scored per model")
    ap.add_argument("--eval-samples", type=int, default=4, help="T-1 samples per held-out problem")
    ap.add_argument("--warmup-steps", type=int, default=None, help="SFT warm-start steps (default: the config's)")
    ap.add_argument("--lit-override", action="append", default=[], metavar="KEY=VALUE",
                    help="a dotted lit_rl config key for the lit_rl sides, e.g. model.init_args.loss.old_logprobs="
                         "separate_pass (repeatable)")
    ap.add_argument("--cache-dir", default=str(ROOT / "runs/cache"), help="where the warm start is cached")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per side process")
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "WARM"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.eval_problems, args.eval_samples = 2, args.seeds[:1], 8, 2
        args.warmup_steps = args.warmup_steps or 10
    if args.child:
        import vs_trl_sides as sides

        side, warm = args.child
        if side == "warm":
            print("SIDE_RESULT " + json.dumps({"path": str(sides.warm_start(Path(args.cache_dir), args.warmup_steps))}))
        else:
            sides.child_main(side, args.steps, args.seeds[0], warm, args.out_dir, args.eval_problems,
                             args.eval_samples, args.lit_override)
        return {}
    if any("=" not in kv for kv in args.lit_override):
        ap.error("--lit-override takes KEY=VALUE")

    import vs_trl_sides as sides

    bed = sides.testbed()
    load_start = os.getloadavg()
    base = [f"--steps={args.steps}", f"--eval-problems={args.eval_problems}", f"--eval-samples={args.eval_samples}"]
    base += [f"--lit-override={kv}" for kv in args.lit_override]
    warm_args = ["--child", "warm", "-", f"--cache-dir={args.cache_dir}"]
    warm_args += [f"--warmup-steps={args.warmup_steps}"] if args.warmup_steps else []
    warm = _child(warm_args, args.timeout)["path"]
    runs: dict[str, list[dict]] = {s: [] for s in args.sides}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        for seed in args.seeds:
            for side in args.sides:
                out = Path(tmp) / f"{side}_{seed}"
                runs[side].append(_child(["--child", side, warm, f"--seeds={seed}", f"--out-dir={out}", *base],
                                         args.timeout))
    agg = {s: aggregate(r) for s, r in runs.items()}
    verdict = None
    if "trl" in agg and "lit" in agg:
        diff = agg["lit"]["heldout_accuracy"]["mean"] - agg["trl"]["heldout_accuracy"]["mean"]
        speed = agg["trl"]["wall_s"]["mean"] / agg["lit"]["wall_s"]["mean"]
        verdict = {"speedup": speed, "meets_speed_goal": speed >= SPEED_GOAL, "accuracy_diff": diff,
                   "equal_accuracy": abs(diff) <= ACCURACY_TOLERANCE}
        verdict["goal_met"] = verdict["meets_speed_goal"] and verdict["equal_accuracy"]
        if "lit_full" in agg:  # the fix's before / after, from this one run
            verdict["trim_speedup"] = agg["lit_full"]["wall_s"]["mean"] / agg["lit"]["wall_s"]["mean"]
            verdict["full_width_speedup_vs_trl"] = agg["trl"]["wall_s"]["mean"] / agg["lit_full"]["wall_s"]["mean"]
    import torch
    import transformers
    import trl

    result = {
        "benchmark": "vs_trl", "mode": "quick" if args.quick else "full", "steps": args.steps, "seeds": args.seeds,
        "G": bed["G"], "prompts_per_batch": bed["prompts_per_batch"], "max_new_tokens": bed["max_new_tokens"],
        "lr": bed["lr"], "updates_per_batch": 1, "warm_start": warm, "warmup_steps": args.warmup_steps,
        "lit_overrides": args.lit_override,
        "eval": {"problems": args.eval_problems, "samples": args.eval_samples, "temperature": 1.0,
                 "split": "ChainSumTask.eval_examples (held out)", "seed": "the run's seed"},
        "accuracy_tolerance": {"abs_diff_of_seed_means": ACCURACY_TOLERANCE,
                               "rule": "equal when |mean acc lit_rl - mean acc TRL| <= tolerance (fixed before the "
                                       "runs: ~2.5 evaluation SEs of the difference of two 3-seed means)"},
        "speed_goal": SPEED_GOAL, "verdict": verdict,
        "trl_changed_settings": sides.trl_changed_settings(args.steps, args.seeds, "<tmp>/trl_run"),
        "sides": agg, "runs": runs,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": {"cpu_count": os.cpu_count(), "threads": bed["threads"], "platform": platform.platform(),
                    "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
                    "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
    }
    print_table(result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
