"""Run the embedded configs and compare their curves bitwise against another checkout's (refactor checks).

A refactor that must not change what a config means runs this twice on one machine, once per checkout:

    python scripts/bitwise_curves.py run --out /tmp/bw/base          # in the old checkout
    python scripts/bitwise_curves.py run --out /tmp/bw/new           # in the new one
    python scripts/bitwise_curves.py compare /tmp/bw/base /tmp/bw/new

``run`` fits each config into its own MLflow store under ``--out`` and writes ``<name>.json``: every logged
metric's history (wall-time keys left out: they measure the machine, not the math) and a SHA-256 of the last
checkpoint's weights. ``compare`` prints a Markdown table (metrics, points, first difference) and a JSON line
last; it exits 1 when anything differs (a metric only one checkout logs counts). Results repeat bitwise
only on one machine and thread count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (name, configs, extra arguments): every embedded recipe whose curve is committed, at its step count (the ERILS
# ones with the recipe the committed studies ran, conf/erils_study_recipe.yaml)
CURVES = [
    ("erils", ["conf/erils.yaml", "conf/erils_study_recipe.yaml"], []),
    ("double_rollout", ["conf/double_rollout.yaml"], []),
    ("grpo", ["conf/double_rollout.yaml", "conf/grpo.yaml"], []),
    ("double_rollout_chainsum", ["conf/double_rollout.yaml", "conf/double_rollout_chainsum.yaml"], []),
    ("grpo_chainsum", ["conf/double_rollout.yaml", "conf/double_rollout_chainsum.yaml", "conf/grpo_chainsum.yaml"], []),
    ("erils_double_rollout", ["conf/erils.yaml", "conf/erils_study_recipe.yaml", "conf/erils_double_rollout.yaml"],
     ["--trainer.max_steps", "60"]),
    ("erils_d1", ["conf/erils.yaml", "conf/erils_study_recipe.yaml", "conf/erils_d1.yaml"],
     ["--trainer.max_steps", "60"]),
]
# wall-clock and machine measurements: they differ between any two runs
SKIP = re.compile(r"(^|[/_])(time|times|wall|sec|secs|seconds|throughput|tokens_per_s|rss|memory|mem)([/_]|$)|_s$")


def _weights_sha(ckpt: Path) -> str:
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _metrics(db: Path) -> dict[str, list[list[float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    out: dict[str, list[list[float]]] = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            for key in sorted(run.data.metrics):
                if SKIP.search(key):
                    continue
                hist = client.get_metric_history(run.info.run_id, key)
                out[key] = [[m.step, m.value] for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
    return out


def run(out: Path, only: list[str], max_steps: int | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name, configs, extra in CURVES:
        if only and name not in only:
            continue
        d = out / name
        cmd = [sys.executable, "-m", "lit_rl", "fit"]
        for c in configs:
            cmd += ["--config", c]
        if max_steps is not None:  # a quick check: both checkouts must use the same value
            extra = [a for i, a in enumerate(extra) if a != "--trainer.max_steps" and
                     (i == 0 or extra[i - 1] != "--trainer.max_steps")] + ["--trainer.max_steps", str(max_steps)]
        cmd += extra + ["--trainer.default_root_dir", str(d),
                        "--trainer.logger.init_args.tracking_uri", f"sqlite:///{d}/mlflow.db"]
        t0 = time.time()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        ckpt = d / "checkpoints" / "last.ckpt"
        rec = {"name": name, "command": cmd[1:], "wall_s": round(time.time() - t0, 1),
               "weights_sha256": _weights_sha(ckpt), "metrics": _metrics(d / "mlflow.db")}
        (out / f"{name}.json").write_text(json.dumps(rec))
        print(f"{name}: {rec['wall_s']} s, {len(rec['metrics'])} metrics", flush=True)
    return 0


def compare(a: Path, b: Path) -> int:
    rows, same_all = [], True
    print("| config | steps | metrics | points | weights | first difference |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in CURVES:
        fa, fb = a / f"{name}.json", b / f"{name}.json"
        if not (fa.exists() and fb.exists()):
            continue
        ra, rb = json.loads(fa.read_text()), json.loads(fb.read_text())
        ma, mb = ra["metrics"], rb["metrics"]
        diff = ""
        missing, new = sorted(set(ma) - set(mb)), sorted(set(mb) - set(ma))
        if missing or new:
            diff = f"metrics only in the first: {missing[:4]}, only in the second: {new[:4]}"
        for k in sorted(set(ma) & set(mb)):
            if not diff and ma[k] != mb[k]:
                i = next((i for i, (x, y) in enumerate(zip(ma[k], mb[k])) if x != y), min(len(ma[k]), len(mb[k])))
                diff = f"{k} at point {i}"
        wsame = ra["weights_sha256"] == rb["weights_sha256"]
        same = not diff and wsame
        same_all &= same
        steps = max((p[0] for v in ma.values() for p in v), default=0)
        points = sum(len(v) for v in ma.values())
        weights = "same" if wsame else "DIFFER"
        print(f"| {name} | {steps} | {len(ma)} | {points} | {weights} | {diff or 'none'} |")
        rows.append({"name": name, "identical": same, "metrics": len(ma), "points": points, "only_in_second": new})
    print(json.dumps({"identical": same_all, "configs": rows}))
    return 0 if same_all and rows else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=[], help="config names (default: all)")
    r.add_argument("--max_steps", type=int, default=None, help="a shorter run (a quick check)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    return run(args.out, args.only, args.max_steps) if args.cmd == "run" else compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
