"""Inpainting (IGPO) against its baselines on the embedded Sudoku testbed, over seeds.

Reads finished runs (one MLflow store per run, or several runs per store), grouped by the method named on the
command line, and prints:

* the table: final greedy accuracy (all 256 puzzles) at equal updates; for a method paired with a baseline
  (``--pair VARIANT=BASE``), its accuracy at the baseline's rollout-token budget (interpolated on its curve of
  accuracy against cumulative rollout tokens); the rollout tokens decoded (on-policy rows x ``L_gen``, plus the
  inpainting stage's masked positions, ``train/cost/tokens_inpaint``); the share of on-policy groups whose rewards
  are all equal (zero advantages, ``train/on_policy/frac_reward_zero_std``), the trigger rate first → last
  (``train/inpaint/trigger_rate``), rows replaced per batch and the hinted rows' correct share; the run time;
  each as mean ± sample std over the seeds;
* the figure (``--out``): greedy accuracy against updates and against rollout tokens (seed mean, the seeds'
  range shaded), the zero-advantage share and the rows replaced per batch over training (seed means);
* a JSON line last.

    python scripts/inpainting_study.py --method d1 sqlite:///d1-s0.db ... --method igpo ... --pair igpo=d1 \\
        [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.atomic import atomic_savefig  # noqa: E402
from lit_rl.report import _plt, runs_with_wall  # noqa: E402
from lit_rl.report import mean_std as _ms  # noqa: E402

GREEDY = "val/sudoku/greedy/accuracy"
ZERO, TRIGGER = "train/on_policy/frac_reward_zero_std", "train/inpaint/trigger_rate"
REPLACED, CORRECT, TOKENS = "train/inpaint/rows_replaced", "train/inpaint/correct_frac", "train/cost/tokens_inpaint"
KEYS = [GREEDY, ZERO, TRIGGER, REPLACED, CORRECT, TOKENS]



def _mean(run, key: str) -> float | None:
    s = run.series(key)
    return statistics.mean(v for _, v in s) if s else None


def token_curve(run) -> list[tuple[int, float]]:
    """``[(update, cumulative rollout tokens), ...]`` at each logged rollout batch: every batch decodes
    ``prompts_per_batch · g_on · L_gen`` on-policy positions, plus the inpainting stage's per-prompt positions
    times ``prompts_per_batch``. A batch's metrics are logged at the update that ends it; zero-advantage logging marks
    every batch (``train/on_policy/frac_reward_zero_std``)."""
    p = run.params
    prompts = int(p.get("data.init_args.prompts_per_batch", 1))
    per_batch = prompts * int(p.get("data.init_args.g_on", 1)) * int(p.get("data.init_args.generation.gen_length", 1))
    inpaint = dict(run.series(TOKENS))
    out, total = [], 0.0
    for step, _ in run.series(ZERO):
        total += per_batch + prompts * inpaint.get(step, 0.0)
        out.append((step, total))
    return out


def accuracy_vs_tokens(run) -> list[tuple[float, float]]:
    """``[(rollout tokens, greedy accuracy), ...]``: each evaluation at the tokens decoded before it (the
    starting policy's at 0)."""
    curve = token_curve(run)
    out = []
    for step, acc in run.series(GREEDY):
        done = [t for s, t in curve if s <= step]
        out.append((done[-1] if done else 0.0, acc))
    return out


def at_tokens(run, budget: float) -> float | None:
    """Greedy accuracy at ``budget`` rollout tokens, linear between the evaluations around it (``None`` past the
    run's last evaluation)."""
    pts = accuracy_vs_tokens(run)
    if not pts or budget > pts[-1][0] + 1e-6:
        return None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    return float(np.interp(budget, xs, ys))


def run_figures(run, wall_s: float | None) -> dict[str, float | None]:
    """One run's figures (``None`` where the run did not log the metric)."""
    greedy = run.series(GREEDY)
    trig = run.series(TRIGGER)
    curve = token_curve(run)
    return {"final": greedy[-1][1] if greedy else None, "tokens": curve[-1][1] if curve else None,
            "zero_adv_share": _mean(run, ZERO), "trigger_first": trig[0][1] if trig else None,
            "trigger_last": trig[-1][1] if trig else None, "trigger_mean": _mean(run, TRIGGER),
            "rows_replaced": _mean(run, REPLACED), "inpaint_correct": _mean(run, CORRECT), "run_s": wall_s}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", nargs="+", action="append", required=True, metavar=("NAME", "URI"),
                    help="a method's name and the MLflow stores of its runs (one run per seed)")
    ap.add_argument("--pair", action="append", default=[], metavar="VARIANT=BASE",
                    help="compare VARIANT at BASE's rollout-token budget (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "docs/img/inpainting_study.png"))
    args = ap.parse_args(argv)
    methods: dict[str, list] = {}
    for name, *uris in args.method:
        if not uris:
            ap.error(f"--method {name}: give at least one MLflow store")
        for uri in uris:
            for r, wall in runs_with_wall(uri, KEYS):
                methods.setdefault(name, []).append((r, run_figures(r, wall)))
    pairs = dict(p.split("=", 1) for p in args.pair)
    for variant, base in pairs.items():
        if variant not in methods or base not in methods:
            ap.error(f"--pair {variant}={base}: both need runs (--method)")
        budget = statistics.mean(f["tokens"] for _, f in methods[base])
        for r, f in methods[variant]:
            f["at_base_tokens"], f["base_tokens"] = at_tokens(r, budget), budget
    cols = [("final greedy (equal updates)", "final", 3), ("greedy at the baseline's tokens", "at_base_tokens", 3),
            ("rollout tokens (M)", "tokens_m", 3), ("zero-advantage share", "zero_adv_share", 3),
            ("trigger rate first → last", ("trigger_first", "trigger_last"), 2),
            ("rows replaced / batch", "rows_replaced", 1), ("hinted rows correct", "inpaint_correct", 3),
            ("run s", "run_s", 0)]
    print("| method | seeds | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    summary: dict = {"script": "inpainting_study", "methods": {}, "pairs": pairs}
    for name, rows in methods.items():
        figs = [f for _, f in rows]
        for f in figs:
            f["tokens_m"] = f["tokens"] / 1e6 if f["tokens"] is not None else None
        cells = []
        for _, key, digits in cols:
            if isinstance(key, tuple):
                a = [f[key[0]] for f in figs if f.get(key[0]) is not None]
                b = [f[key[1]] for f in figs if f.get(key[1]) is not None]
                cells.append(f"{_ms(a, digits)} → {_ms(b, digits)}" if a else "–")
            else:
                cells.append(_ms([f[key] for f in figs if f.get(key) is not None], digits))
        print(f"| {name} | {len(figs)} | " + " | ".join(cells) + " |")
        summary["methods"][name] = figs
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    axes = axes.flatten()
    color = {n: f"C{k}" for k, n in enumerate(n for n in methods if n not in pairs)}  # a variant: its base's colour
    color |= {v: color[b] for v, b in pairs.items()}
    for name, rows in methods.items():
        style = dict(color=color[name], ls="--" if name in pairs else "-")
        for ax, curve in ((axes[0], lambda r: r.series(GREEDY)), (axes[1], accuracy_vs_tokens)):
            cs = [curve(r) for r, _ in rows]
            n = min(len(c) for c in cs)
            xs = np.mean([[x for x, _ in c[:n]] for c in cs], 0)
            ys = np.array([[y for _, y in c[:n]] for c in cs])
            ax.plot(xs / (1e6 if ax is axes[1] else 1), ys.mean(0), label=f"{name} ({len(cs)} seeds)", **style)
            ax.fill_between(xs / (1e6 if ax is axes[1] else 1), ys.min(0), ys.max(0), color=style["color"], alpha=0.12)
        for ax, key in ((axes[2], ZERO), (axes[3], REPLACED)):
            series = [r.series(key) for r, _ in rows]
            if not all(series):
                continue
            n = min(len(t) for t in series)
            ys = np.mean([[y for _, y in t[:n]] for t in series], 0)
            k = min(5, n)  # a 5-batch running mean: one batch's value is noisy
            steps = [x for x, _ in series[0][:n]][k - 1:]
            ax.plot(steps, np.convolve(ys, np.ones(k) / k, "valid"), label=name, **style)
    axes[0].set(title="greedy accuracy (256 puzzles)", xlabel="optimizer update", ylabel="accuracy")
    axes[1].set(title="greedy accuracy vs rollout tokens", xlabel="rollout tokens decoded (millions)",
                ylabel="accuracy")
    axes[2].set(title="on-policy groups with zero advantages (5-batch mean)", xlabel="optimizer update",
                ylabel="share of groups")
    axes[3].set(title="rows replaced by inpainted rows (5-batch mean)", xlabel="optimizer update",
                ylabel="rows per batch")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, args.out)
    print(f"figure: {args.out}")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
