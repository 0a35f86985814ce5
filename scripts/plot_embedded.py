"""Plot the embedded ERILS comparison (greedy cell accuracy on all 256 test puzzles, on-policy reward) from
one or more MLflow stores, one line per run, chance as a dashed line.

    python scripts/plot_embedded.py --out docs/img/erils_embedded.png sqlite:///runs/mlflow.db [more stores]

Each store's runs of the ``lit_rl-embedded`` experiment are drawn with their run name as the label (the
configs name them: erils-sudoku-tiny, spg-sudoku-tiny, ...). The greedy curve is over rollout batches (the
validation points); the on-policy reward is smoothed over 8 batches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _series(client, run_id: str, key: str) -> tuple[list[int], list[float]]:
    hist = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
    return [m.step for m in hist], [m.value for m in hist]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stores", nargs="+", help="MLflow tracking URIs")
    ap.add_argument("--experiment", default="lit_rl-embedded")
    ap.add_argument("--out", required=True)
    ap.add_argument("--chance", type=float, default=0.25)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow.tracking import MlflowClient

    from lit_rl.atomic import atomic_savefig

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for uri in args.stores:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(args.experiment)
        if exp is None:
            print(f"{uri}: no experiment {args.experiment!r}", file=sys.stderr)
            continue
        for run in client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]):
            name = run.data.tags.get("mlflow.runName", run.info.run_id[:8])
            x, y = _series(client, run.info.run_id, "val/sudoku/greedy/accuracy")
            if x:
                ax1.plot(x, y, marker="o", label=name)
            x, y = _series(client, run.info.run_id, "train/on_policy/reward_mean")
            if x:
                k = 8
                smooth = [sum(y[max(0, i - k + 1): i + 1]) / len(y[max(0, i - k + 1): i + 1]) for i in range(len(y))]
                ax2.plot(x, smooth, label=name)
    for ax, title in ((ax1, "greedy cell accuracy, 256 test puzzles"), (ax2, "on-policy reward (8-batch mean)")):
        ax.axhline(args.chance, color="grey", linestyle="--", linewidth=1, label="chance")
        ax.set_title(title)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    ax1.set_xlabel("rollout batch")
    ax2.set_xlabel("rollout batch")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
