"""ERILS + d1's loss with d1's one-step estimator against DiffuCoder's coupled masks (docs/crossovers.md §4).

Reads finished runs of ``conf/erils_d1.yaml`` (run name ``erils-d1-sudoku-tiny``) and
``conf/erils_d1_coupled.yaml`` (``erils-d1-coupled-sudoku-tiny``) from one or more MLflow stores (one run per
seed), prints the greedy-accuracy table (mean ± sample std over seeds at each evaluation, wall time), draws the
curves with their seed range and prints a JSON line last.

    python scripts/estimator_curves.py --tracking_uri sqlite:///runs/s0.db --tracking_uri ... [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.atomic import atomic_savefig  # noqa: E402
from lit_rl.report import _plt, runs_with_wall  # noqa: E402
from lit_rl.report import mean_std as _ms  # noqa: E402

GREEDY = "val/sudoku/greedy/accuracy"
METHODS = [("d1 one-step estimator (conf/erils_d1.yaml)", "erils-d1-sudoku-tiny"),
           ("coupled masks (conf/erils_d1_coupled.yaml)", "erils-d1-coupled-sudoku-tiny")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tracking_uri", action="append", required=True)
    ap.add_argument("--out", default=str(ROOT / "docs/img/erils_d1_coupled.png"))
    args = ap.parse_args(argv)
    runs, wall_s = [], {}
    for uri in args.tracking_uri:
        for r, wall in runs_with_wall(uri, [GREEDY], finished_only=False):
            wall_s[r.run_id] = wall
            runs.append(r)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    summary = {}
    print("| estimator | seeds | " + " | ".join(f"update {s}" for s in (0, 60, 120, 180, 240, 300)) + " | run time |")
    print("|---|---|" + "---|" * 7)
    for i, (label, name) in enumerate(METHODS):
        mine = [r for r in runs if r.name == name and r.status == "FINISHED"]
        if not mine:
            continue
        curves = [dict(r.series(GREEDY)) for r in mine]
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        mean = [statistics.mean(c[s] for c in curves) for s in steps]
        lo = [min(c[s] for c in curves) for s in steps]
        hi = [max(c[s] for c in curves) for s in steps]
        ax.plot(steps, mean, marker="o", color=f"C{i}", label=f"{label}, {len(mine)} seeds")
        ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2)
        wall = [wall_s[r.run_id] for r in mine if wall_s.get(r.run_id)]
        cells = [_ms([c[s] for c in curves]) for s in steps]
        print(f"| {label} | {len(mine)} | " + " | ".join(cells) + f" | {_ms(wall, 0) + ' s' if wall else '-'} |")
        summary[name] = {"seeds": len(mine), "final": [c[steps[-1]] for c in curves], "steps": steps,
                         "mean": mean, "wall_s": wall}
    ax.axhline(0.25, color="grey", ls=":", lw=1, label="chance (0.25)")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("greedy cell accuracy, 256 puzzles")
    ax.set_title("ERILS + d1 loss: one-step vs coupled estimator (band: seed range)")
    ax.legend(fontsize=8)
    atomic_savefig(fig, Path(args.out))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
