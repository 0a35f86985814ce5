"""Where a training run's time goes: ``python -m lit_rl fit`` under cProfile, bucketed (issue #35).

    python benchmarks/step_profile.py --config conf/erils.yaml --max-steps 8
    python benchmarks/step_profile.py --config conf/double_rollout_chainsum.yaml --max-steps 8 \\
        --compare model.init_args.loss.old_logprobs=separate_pass      # before (the override) / after (default)
    python benchmarks/step_profile.py --config conf/erils.yaml -- --trainer.val_check_interval=2   # passthrough

Each profile is one ``python -m cProfile -o <tmp> -m lit_rl fit --config ...`` subprocess with a fresh
``trainer.default_root_dir`` and MLflow store (a temporary folder; the warm-start cache ``runs/cache`` is the
config's, so a second run loads it). The config's callbacks (evaluation, checkpointing, logging) stay on.
Prints the bucket table, the top functions by cumulative and by own time, and a JSON line last.

Bucketing (:func:`bucket_times`, a pure function of the ``pstats`` table). ``ENTRIES`` names entry
functions, each with a bucket. Every function's *own* time (``tottime``) goes to exactly one context, so
the buckets sum to the profiled total by construction, with ``other`` the remainder:

* an entry function's own time goes to its bucket;
* any other function's own time is split over its callers by cProfile's per-caller record of that own time
  (exact for the direct caller), each part going to that caller's *context*;
* a function's context is its bucket if it is an entry (the innermost entry on the stack wins), else the mix
  of its callers' contexts weighted by each caller edge's cumulative time; a function without callers (the
  profile's root) is ``other``.

So time inside an entry nested in another (the loss's ``backward`` inside ``optimizer_update``) is counted
once, in the inner entry's bucket, and the outer keeps only the rest. The one approximation is gprof's: a
non-entry function called from several contexts passes the mix on to its callees (cProfile keeps one level
of callers). The entries are chosen below Lightning's shared hook dispatchers so that mixes stay small.
``outside profile`` is the subprocess's wall time that cProfile did not see (interpreter start and exit).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = ("start-up", "generation", "scoring", "loss fwd/bwd", "optimizer", "evaluation", "logging",
           "checkpointing", "other")
TRAIN = ("generation", "scoring", "loss fwd/bwd", "optimizer")  # the per-step figure (--compare's ratio)

# (bucket, file suffix, function name or "*" for every function of the file); first match wins
ENTRIES: tuple[tuple[str, str, str], ...] = (
    # start-up: imports, config parsing and checks, building the classes, data setup, warm start
    ("other", "lit_rl/__main__.py", "<module>"),  # the root: what runs below it without an entry is "other"
    ("other", "<string>", "<module>"),
    ("start-up", "<frozen importlib._bootstrap>", "*"),  # imports (a module's own code: its "<module>")
    ("start-up", "<frozen importlib._bootstrap_external>", "*"),
    ("start-up", "", "<module>"),
    ("start-up", "transformers/utils/import_utils.py", "*"),  # transformers' lazy imports
    ("start-up", "lit_rl/config/preflight.py", "preflight"),
    ("start-up", "lightning/pytorch/cli.py", "parse_arguments"),
    ("start-up", "lit_rl/lightning_cli.py", "instantiate_classes"),
    ("start-up", "lit_rl/lightning_cli.py", "before_instantiate_classes"),
    ("start-up", "lightning/pytorch/trainer/trainer.py", "_run"),  # strategy / model / data setup
    ("start-up", "datamodules/stream.py", "setup"),
    ("start-up", "datamodules/ar_rollouts.py", "setup"),
    ("start-up", "datamodules/sources.py", "setup"),
    ("start-up", "callbacks/warmup.py", "on_fit_start"),
    ("start-up", "callbacks/ar_warmup.py", "on_fit_start"),
    # generation: the rollout batch (sources' rows, stacking) and double-rollout continuations
    ("generation", "datamodules/stream.py", "produce_rollouts"),
    ("generation", "datamodules/sources.py", "rows"),
    ("generation", "lit_rl/generation/ar.py", "continue_from"),
    ("generation", "lit_rl/generation/continuations.py", "continue_from"),
    # scoring: rewards, processors (advantages, double-rollout estimate without its continuations)
    ("scoring", "lit_rl/tasks/base.py", "total_rewards"),
    ("scoring", "lit_rl/algorithms/processors.py", "run_processors"),
    # loss: prepare (pi_old / pi_ref passes, masks) and backward (forwards + autograd backward)
    ("loss fwd/bwd", "lit_rl/algorithms/losses.py", "prepare"),
    ("loss fwd/bwd", "lit_rl/algorithms/losses.py", "backward"),
    # optimizer: one update less its loss (zero_grad, finiteness check, grad norm, clip, step, schedule)
    ("optimizer", "lit_rl/algorithms/rl_module.py", "optimizer_update"),
    # evaluation: greedy validation loop (sanity check too), Pass@k, the reliability study
    ("evaluation", "lightning/pytorch/loops/evaluation_loop.py", "run"),
    ("evaluation", "callbacks/passk.py", "*"),
    ("evaluation", "callbacks/dr_reliability.py", "*"),
    ("evaluation", "lit_rl/algorithms/rl_module.py", "validation_step"),
    ("evaluation", "lit_rl/algorithms/rl_module.py", "on_validation_epoch_end"),
    ("evaluation", "datamodules/rollouts.py", "evaluate_batch"),
    ("evaluation", "datamodules/ar_rollouts.py", "evaluate_batch"),
    # logging: self.log and its result collection, loggers (MLflow), progress bar, rollout tracking
    ("logging", "lightning/pytorch/core/module.py", "log"),
    ("logging", "lightning/pytorch/trainer/connectors/logger_connector/", "*"),
    ("logging", "lightning/pytorch/loggers/", "*"),
    ("logging", "lightning/pytorch/callbacks/progress/", "*"),
    ("logging", "lit_rl/loggers.py", "*"),
    ("logging", "site-packages/mlflow/", "*"),  # with the store's SQL below it (a fresh store creates its schema)
    ("logging", "site-packages/alembic/", "*"),
    ("logging", "site-packages/sqlalchemy/", "*"),
    ("logging", "lit_rl/lightning_cli.py", "save_config"),
    ("logging", "callbacks/progress.py", "*"),
    ("logging", "callbacks/tracking.py", "*"),
    ("logging", "callbacks/run_record.py", "*"),
    ("logging", "lit_rl/algorithms/rl_module.py", "log_batch_metrics"),
    ("logging", "lit_rl/algorithms/rl_module.py", "log_step_axis"),
    ("logging", "datamodules/stream.py", "_write_order_file"),
    # checkpointing: ModelCheckpoint, saving, resume state, the prompt ledger, SIGTERM checkpoints
    ("checkpointing", "lightning/pytorch/callbacks/model_checkpoint.py", "*"),
    ("checkpointing", "lightning/pytorch/trainer/connectors/checkpoint_connector.py", "*"),
    ("checkpointing", "lightning/pytorch/trainer/trainer.py", "save_checkpoint"),
    ("checkpointing", "callbacks/reliability.py", "*"),
    ("checkpointing", "lit_rl/checkpoint_io.py", "*"),
    ("checkpointing", "lit_rl/reliability.py", "*"),
    # Lightning's loop machinery between the entries above, and the teardown
    ("other", "lightning/pytorch/trainer/trainer.py", "_run_stage"),
    ("other", "lightning/pytorch/trainer/trainer.py", "_teardown"),
    ("other", "lit_rl/algorithms/rl_module.py", "training_step"),
)

Key = tuple[str, int, str]  # pstats' (file, line, function)


def entry_bucket(key: Key, entries: tuple[tuple[str, str, str], ...] = ENTRIES) -> str | None:
    """The bucket of ``key`` if it is an entry function, else ``None``."""
    file, _, name = key
    file = file.replace(os.sep, "/")
    for bucket, suffix, fn in entries:
        if (fn == "*" or fn == name) and (file.endswith(suffix) if not suffix.endswith("/") else suffix in file):
            return bucket
    return None


def _order(stats: Mapping[Key, tuple]) -> list[Key]:
    """Callers before callees: reverse postorder of a depth-first walk down the call graph from the roots
    (a cycle's back edge is left out, so a recursive function's context comes from its outside callers)."""
    callees: dict[Key, list[Key]] = defaultdict(list)
    for f, v in stats.items():
        for g in v[4]:
            if g != f and g in stats:
                callees[g].append(f)
    roots = [f for f, v in stats.items() if not any(g != f and g in stats for g in v[4])]
    seen: set[Key] = set()
    post: list[Key] = []
    for start in [*roots, *stats]:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(callees[start]))]
        while stack:
            node, it = stack[-1]
            for nxt in it:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(callees[nxt])))
                    break
            else:
                stack.pop()
                post.append(node)
    return post[::-1]


def bucket_times(stats: Mapping[Key, tuple], entries: tuple[tuple[str, str, str], ...] = ENTRIES) -> dict[str, float]:
    """Seconds per bucket from a ``pstats.Stats(...).stats`` table ``{(file, line, fn): (cc, nc, tt, ct,
    {caller: (cc, nc, tt, ct)})}``; the values sum to the table's total own time (rule: module docstring)."""
    out = dict.fromkeys(BUCKETS, 0.0)
    for parts in own_time_parts(stats, entries).values():
        for b, v in parts.items():
            out[b] += v
    return out


def own_time_parts(stats: Mapping[Key, tuple], entries: tuple[tuple[str, str, str], ...] = ENTRIES
                   ) -> dict[Key, dict[str, float]]:
    """Each function's own time split over the buckets (:func:`bucket_times` sums these)."""
    label = {f: entry_bucket(f, entries) for f in stats}
    ctx: dict[Key, dict[str, float]] = {}
    for f in _order(stats):
        if label[f]:
            ctx[f] = {label[f]: 1.0}
            continue
        mix: dict[str, float] = defaultdict(float)
        for g, edge in stats[f][4].items():
            if g != f and g in ctx:
                w = edge[3] if edge[3] > 0 else 1e-12  # this caller's cumulative time in f
                for b, p in ctx[g].items():
                    mix[b] += w * p
        total = sum(mix.values())
        ctx[f] = {b: v / total for b, v in mix.items()} if total > 0 else {"other": 1.0}
    out: dict[Key, dict[str, float]] = {}
    for f, (_, _, tt, _, callers) in stats.items():
        out[f] = parts = defaultdict(float)
        if label[f]:
            parts[label[f]] += tt
            continue
        rest = tt
        for g, edge in callers.items():
            if g != f and g in ctx and edge[2] > 0:
                part = min(edge[2], rest)  # f's own time when called from g, in g's context
                rest -= part
                for b, p in ctx[g].items():
                    parts[b] += part * p
        for b, p in ctx[f].items():  # the unassigned remainder (self-recursion, rounding) in f's own context
            parts[b] += rest * p
    return out


def _name(key: Key) -> str:
    return pstats.func_std_string(key).replace(str(ROOT) + "/", "").replace(sys.prefix + "/", "")


def top_rows(stats: pstats.Stats, sort: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` functions by ``sort`` ("cumulative" or "tottime")."""
    col = 3 if sort == "cumulative" else 2
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][col], reverse=True)[:n]  # type: ignore[attr-defined]
    return [{"function": _name(k),
             "calls": v[1], "tottime": round(v[2], 3), "cumtime": round(v[3], 3)} for k, v in rows]


def profile_run(configs: list[str], max_steps: int | None, extra: list[str], top: int,
                keep: Path | None = None) -> dict[str, Any]:
    """One ``lit_rl fit`` under cProfile in a subprocess (fresh root dir and MLflow store); its buckets."""
    with tempfile.TemporaryDirectory(prefix="step_profile_") as tmp:
        prof = Path(tmp) / "fit.prof"
        cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "lit_rl", "fit"]
        cmd += [a for c in configs for a in ("--config", c)]
        cmd += [f"--trainer.default_root_dir={tmp}/run", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp}/mlflow.db"]
        cmd += [f"--trainer.max_steps={max_steps}"] if max_steps is not None else []
        cmd += extra
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"lit_rl fit failed (rc {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
        stats = pstats.Stats(str(prof), stream=io.StringIO())
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes(prof.read_bytes())
    parts = own_time_parts(stats.stats)  # type: ignore[attr-defined]
    buckets = dict.fromkeys(BUCKETS, 0.0)
    for v in parts.values():
        for b, x in v.items():
            buckets[b] += x
    other = sorted(((v.get("other", 0.0), k) for k, v in parts.items()), reverse=True)[:top]
    profiled = sum(buckets.values())
    buckets["outside profile"] = max(wall - profiled, 0.0)
    steps = sum(v[1] for k, v in stats.stats.items()  # type: ignore[attr-defined]
                if k[2] == "optimizer_update" and k[0].endswith("rl_module.py"))  # updates made
    shown = " ".join(["python -m lit_rl fit", *cmd[8:]]).replace(tmp, "$TMP")
    return {"command": shown, "wall_s": round(wall, 3), "profiled_s": round(profiled, 3), "updates": steps,
            "buckets": {k: round(v, 3) for k, v in buckets.items()},
            "train_s_per_update": round(sum(buckets[b] for b in TRAIN) / steps, 4) if steps else None,
            "top_cumulative": top_rows(stats, "cumulative", top), "top_tottime": top_rows(stats, "tottime", top),
            "top_other": [{"function": _name(k), "other_s": round(x, 3)} for x, k in other]}


def table(result: dict[str, Any]) -> str:
    """The bucket table as markdown."""
    total = sum(result["buckets"].values())
    lines = ["| bucket | seconds | share |", "|---|---:|---:|"]
    lines += [f"| {b} | {s:.2f} | {s / total:.1%} |" for b, s in result["buckets"].items()]
    lines.append(f"| **total (wall)** | {total:.2f} | 100% |")
    return "\n".join(lines)


def top_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| cumtime | tottime | calls | function |", "|---:|---:|---:|---|"]
    lines += [f"| {r['cumtime']:.2f} | {r['tottime']:.2f} | {r['calls']} | `{r['function']}` |" for r in rows]
    return "\n".join(lines)


def report(label: str, result: dict[str, Any]) -> str:
    per = result["train_s_per_update"]
    return "\n\n".join([
        f"### {label}", f"`{result['command']}`",
        f"{result['updates']} optimizer updates; wall {result['wall_s']:.1f} s "
        f"(profiled {result['profiled_s']:.1f} s); generation + scoring + loss + optimizer per update: {per} s",
        table(result),
        "Top by cumulative time:", top_table(result["top_cumulative"]),
        "Top by own time (tottime):", top_table(result["top_tottime"]),
        "Largest own times counted as `other` (no entry function above them):",
        "\n".join(f"- {r['other_s']:.2f} s `{r['function']}`" for r in result["top_other"])])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", required=True, help="a lit_rl config (repeatable, in order)")
    ap.add_argument("--max-steps", type=int, default=None, help="trainer.max_steps (default: the config's)")
    ap.add_argument("--compare", default=None, metavar="KEY=VALUE",
                    help="profile twice: with --KEY=VALUE (before) and without it (after); prints both and the ratio")
    ap.add_argument("--top", type=int, default=20, help="functions in each top list")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    ap.add_argument("--keep-prof", default=None, help="copy each run's cProfile file into this folder")
    ap.add_argument("overrides", nargs="*", help="passed on to lit_rl fit (after --), e.g. --trainer.x=1")
    args = ap.parse_args(argv)
    extra = [o if o.startswith("--") else f"--{o}" for o in args.overrides]
    runs: dict[str, dict[str, Any]] = {}
    keep = Path(args.keep_prof) if args.keep_prof else None
    def run(extra_args: list[str], name: str) -> dict[str, Any]:
        return profile_run(args.config, args.max_steps, extra_args, args.top, keep and keep / f"{name}.prof")

    if args.compare:
        if "=" not in args.compare:
            ap.error(f"--compare needs KEY=VALUE, got {args.compare!r}")
        runs[f"before ({args.compare})"] = run(extra + [f"--{args.compare}"], "before")
        runs["after (default)"] = run(extra, "after")
    else:
        runs[" + ".join(args.config)] = run(extra, "fit")
    text = "\n\n".join(report(k, v) for k, v in runs.items())
    summary: dict[str, Any] = {"benchmark": "step_profile", "configs": args.config, "max_steps": args.max_steps,
                               "runs": {k: {x: v[x] for x in ("wall_s", "profiled_s", "buckets", "train_s_per_update")}
                                        for k, v in runs.items()},
                               "machine": {"cpu_count": os.cpu_count(), "loadavg": list(os.getloadavg()),
                                           "python": platform.python_version(), "platform": platform.platform()}}
    if args.compare:
        before, after = runs.values()
        if before["train_s_per_update"] and after["train_s_per_update"]:
            summary["per_update_ratio"] = round(before["train_s_per_update"] / after["train_s_per_update"], 3)
            text += f"\n\nper-update time before / after: {summary['per_update_ratio']:.3f}x"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
