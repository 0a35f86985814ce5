"""Curves of the real-model runs (docs/real_model.md) from an MLflow store: held-out greedy accuracy against updates
and against generated tokens (first-stage rollouts plus double rollout's continuations), and completion lengths.

    .venv/bin/python scripts/real_curves.py --run GRPO=grpo-smollm2-word-problems \\
        --run "double rollout=double-rollout-smollm2-word-problems" --out docs/results/real_model/curves.png

A run is ``LABEL=MLflow run name`` (the latest run of that name); a ``validate`` run of it (``<name> [validate @ step
N]``) adds its point at step N. The last line printed is a JSON object with every point.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ACC = "val/word_problems/greedy/accuracy"
TOKENS = ("train/cost/tokens_stage1", "train/cost/tokens_stage2")


def series(db: sqlite3.Connection, run_id: str, key: str) -> list[tuple[int, float]]:
    rows = db.execute("select step, value from metrics where run_uuid=? and key=? order by step, timestamp",
                      (run_id, key)).fetchall()
    return sorted({int(s): float(v) for s, v in rows}.items())


def run_points(db: sqlite3.Connection, name: str, prompts_per_batch: int) -> dict:
    row = db.execute("select run_uuid from runs where name=? order by start_time desc limit 1", (name,)).fetchone()
    if row is None:
        raise SystemExit(f"error: no MLflow run named {name!r}")
    rid = row[0]
    acc = dict(series(db, rid, ACC))
    for (vid,) in db.execute("select run_uuid from runs where name like ?", (f"{name} [validate @ step %",)):
        acc.update(series(db, vid, ACC))
    per_step: dict[int, float] = {}
    for key in TOKENS:  # tokens per prompt, per rollout batch (one update per batch here)
        for step, v in series(db, rid, key):
            per_step[step] = per_step.get(step, 0.0) + v * prompts_per_batch
    cum, total = {0: 0.0}, 0.0
    for step in sorted(per_step):
        total += per_step[step]
        cum[step] = total
    length = series(db, rid, "rollouts/on_policy/length_mean")
    for step in acc:  # a point past the last logged batch (a run killed after its checkpoint): tokens so far
        if step not in cum:
            cum[step] = cum[max(s for s in cum if s <= step)]
    return {"accuracy": sorted(acc.items()), "tokens": cum, "length": length}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="runs/mlflow.db", help="the MLflow SQLite file")
    p.add_argument("--run", action="append", required=True, help="LABEL=run name (repeatable)")
    p.add_argument("--prompts_per_batch", type=int, default=4)
    p.add_argument("--out", default="runs/real_curves.png")
    args = p.parse_args(argv)
    if not Path(args.store).is_file():
        print(f"error: {args.store}: no MLflow store there (--store)", file=sys.stderr)
        return 2
    db = sqlite3.connect(args.store)
    data = {}
    for spec in args.run:
        label, _, name = spec.partition("=")
        data[label] = run_points(db, name or label, args.prompts_per_batch)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_rl.atomic import atomic_savefig

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, d in data.items():
        steps = [s for s, _ in d["accuracy"]]
        accs = [a for _, a in d["accuracy"]]
        axes[0].plot(steps, accs, marker="o", label=label)
        known = [s for s in steps if s in d["tokens"]]
        axes[1].plot([d["tokens"][s] / 1e3 for s in known], [a for s, a in d["accuracy"] if s in d["tokens"]],
                     marker="o", label=label)
        axes[2].plot([s for s, _ in d["length"]], [v for _, v in d["length"]], label=label)
    axes[0].set(xlabel="updates", ylabel="held-out greedy accuracy (128 problems)", title="accuracy at equal updates")
    axes[1].set(xlabel="generated tokens (thousands)", ylabel="held-out greedy accuracy",
                title="accuracy at equal generated tokens")
    axes[2].set(xlabel="updates", ylabel="tokens", title="sampled completion length (mean)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct + LoRA on arithmetic word problems (2-core CPU)")
    fig.tight_layout()
    atomic_savefig(fig, args.out, dpi=110)
    out = {label: {"accuracy": d["accuracy"], "tokens_at": {s: d["tokens"].get(s) for s, _ in d["accuracy"]}}
           for label, d in data.items()}
    for label, d in out.items():
        print(label, " ".join(f"{s}:{a:.3f}" for s, a in d["accuracy"]))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
