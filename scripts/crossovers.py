"""The cross-overs' embedded curves against their parents (README "Cross-overs", docs/crossovers.md).

Reads finished runs from MLflow stores (run names as the configs set them, ``-s<seed>`` for extra seeds),
prints one Markdown table per testbed, draws ``docs/img/crossovers.png`` and prints a JSON line last.

    python scripts/crossovers.py --tracking_uri sqlite:///runs/mlflow.db [--tracking_uri ...] [--out PNG]

dLLM testbed (conf/erils.yaml's budget): greedy cell accuracy on the 256 test puzzles at each evaluation.
AR testbed (conf/grpo.yaml's budget): the sampled reward per pass over the 16 training puzzles
(``rollouts/on_policy/reward_mean``, 4 batches a pass) and the final greedy accuracy on 128 held-out puzzles.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.atomic import atomic_savefig  # noqa: E402
from lit_rl.report import _plt, load_runs  # noqa: E402

DLLM = [  # (label, run name, parent label)
    ("ERILS (SPG loss)", "erils-sudoku-tiny", None),
    ("ERILS + d1 loss", "erils-d1-sudoku-tiny", "ERILS (SPG loss)"),
    ("ERILS + d1 loss, DiffuCoder's coupled masks", "erils-d1-coupled-sudoku-tiny", "ERILS + d1 loss"),
    ("SPG, on-policy only", "spg-sudoku-tiny", None),
    ("d1, on-policy only", "d1-sudoku-tiny", "SPG, on-policy only"),
    ("wd1, on-policy only", "wd1-sudoku-tiny", "SPG, on-policy only"),
    ("ERILS + dLLM double rollout (whole-row masks)", "erils-double-rollout-sudoku-tiny", "ERILS (SPG loss)"),
    ("ERILS + dLLM double rollout (tail masks)", "erils-double-rollout-tail-sudoku-tiny", "ERILS (SPG loss)"),
    ("SPG + dLLM double rollout (whole-row masks)", "spg-double-rollout-sudoku-tiny", "SPG, on-policy only"),
]
AR = [
    ("GRPO (G 16)", "grpo-sudoku-tiny", None),
    ("GRPO + external pool (12 + 4)", "grpo-external-sudoku-tiny", "GRPO (G 16)"),
]
GREEDY = "val/sudoku/greedy/accuracy"


def _group(runs, name: str):
    pat = re.compile(rf"^{re.escape(name)}(-s\d+)?$")
    by_seed = {}
    for r in runs:  # the newest finished run of each seed
        if r.status == "FINISHED" and pat.match(r.name):
            by_seed[r.name] = r
    return list(by_seed.values())


def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f} (1 seed)"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f} ({len(xs)} seeds, {min(xs):.3f}-{max(xs):.3f})"


def _passes(run, key="rollouts/on_policy/reward_mean", per=4) -> list[float]:
    v = [x for _, x in run.series(key)]
    return [statistics.mean(v[i:i + per]) for i in range(0, len(v) - per + 1, per)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tracking_uri", action="append", required=True)
    ap.add_argument("--out", default=str(ROOT / "docs/img/crossovers.png"))
    args = ap.parse_args(argv)
    runs = []
    for uri in args.tracking_uri:
        runs += load_runs(uri, history_keys=[GREEDY, "rollouts/on_policy/reward_mean"])
    summary: dict[str, dict] = {}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))

    print("| dLLM (Sudoku, ERILS budget) | start | final greedy | seeds |")
    print("|---|---|---|---|")
    for label, name, parent in DLLM:
        group = _group(runs, name)
        if not group:
            continue
        finals = [r.series(GREEDY)[-1][1] for r in group if r.series(GREEDY)]
        start = group[0].series(GREEDY)[0][1]
        summary[label] = {"final": finals, "parent": parent}
        print(f"| {label} | {start:.3f} | {_ms(finals)} | {', '.join(r.name for r in group)} |")
        curves = [r.series(GREEDY) for r in group]
        steps = [s for s, _ in curves[0]]
        mean = [statistics.mean(c[i][1] for c in curves if len(c) > i) for i in range(len(steps))]
        axes[0].plot(steps, mean, marker="o", label=f"{label} (n={len(group)})")
        if len(curves) > 1:
            lo = [min(c[i][1] for c in curves if len(c) > i) for i in range(len(steps))]
            hi = [max(c[i][1] for c in curves if len(c) > i) for i in range(len(steps))]
            axes[0].fill_between(steps, lo, hi, alpha=0.15)
    axes[0].set(xlabel="optimizer updates", ylabel="greedy cell accuracy (256 puzzles)", title="dLLM cross-overs",
                ylim=(-0.02, 1.0))
    axes[0].axhline(0.25, color="grey", lw=0.8, ls=":")
    axes[0].legend(fontsize=7)

    print()
    print("| AR (Sudoku, GRPO budget) | sampled reward, pass 1 | pass 10 | final greedy (128 held-out) |")
    print("|---|---|---|---|")
    for label, name, parent in AR:
        group = _group(runs, name)
        if not group:
            continue
        passes = [_passes(r) for r in group]
        finals = [r.series(GREEDY)[-1][1] for r in group if r.series(GREEDY)]
        summary[label] = {"pass1": [p[0] for p in passes], "pass10": [p[-1] for p in passes], "final": finals,
                          "parent": parent}
        print(f"| {label} | {_ms([p[0] for p in passes])} | {_ms([p[-1] for p in passes])} | {_ms(finals)} |")
        n = min(len(p) for p in passes)
        x = list(range(1, n + 1))
        mean = [statistics.mean(p[i] for p in passes) for i in range(n)]
        axes[1].plot(x, mean, marker="o", label=f"{label} (n={len(group)})")
        if len(passes) > 1:
            axes[1].fill_between(x, [min(p[i] for p in passes) for i in range(n)],
                                 [max(p[i] for p in passes) for i in range(n)], alpha=0.15)
    axes[1].set(xlabel="pass over the 16 training puzzles", ylabel="sampled reward (on-policy rows)",
                title="AR: GRPO with external pool rows")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, Path(args.out))
    print(json.dumps({"crossovers": summary, "figure": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
