"""Where a training run's time goes: ``python -m lit_rl fit`` timed by bucket, under cProfile.

    python benchmarks/step_profile.py --config conf/erils.yaml --max-steps 60
    python benchmarks/step_profile.py --config conf/double_rollout.yaml --config conf/double_rollout_chainsum.yaml \\
        --compare model.init_args.loss.old_logprobs=separate_pass      # before (the override) / after (default)
    python benchmarks/step_profile.py --config conf/erils.yaml -- --trainer.val_check_interval=2   # passthrough
    python benchmarks/step_profile.py --config conf/erils.yaml --no-cprofile --before-ref 4fae4e7   # old code / new

Each run is a fresh process (this script with ``--child``) that runs lit_rl's CLI ``main(["fit", ...])`` with a
fresh ``trainer.default_root_dir`` and MLflow store (a temporary folder; the warm-start cache ``runs/cache`` is
the config's, so a second run loads it). The config's callbacks (evaluation, checkpointing, logging) stay on.
Prints the bucket table, the top functions by cumulative and by own time (and lit_rl's own functions by
cumulative time), and a JSON line last.

Buckets (:class:`BucketClock`, exact wall time). ``ENTRIES`` names functions, each with a bucket; the child
wraps them so that entering one opens its bucket and returning closes it. Every second between the child's
start and end belongs to the innermost open bucket (so a nested entry, the loss's ``backward`` inside
``optimizer_update``, is counted once, in the inner bucket), except that ``start-up`` and ``evaluation`` keep
the model work opened inside them (the warm start's and the evaluation's generation stay theirs). The root
bucket is ``start-up`` (imports, config parsing and checks, building the classes, data setup, the warm start:
everything before Lightning's ``_run_stage``); ``other`` is what runs inside the training stage and teardown
without an entry (Lightning's loops, batch hand-over); ``outside`` is the process's wall time before and after
the clock (interpreter start and exit). The buckets sum to the process's wall time by construction.

Each run also reports its **training part** (``train_part_s``: the wall less ``start-up`` and ``outside``, i.e.
Lightning's training stage with its evaluations, logging and checkpoints; the warm start is start-up) and the
final evaluation's numbers (``final``: the ``val/*`` values of the fit's last line). ``--compare`` may be given
several times: the before run gets every override. ``--before-ref REF`` runs the before run on commit ``REF``'s
code instead (a temporary ``git worktree``, sharing this checkout's ``runs/`` for the warm-start cache), with any
``--compare`` overrides, and the after run on this checkout's: code and default changes measured together.

Why not bucket the cProfile table itself: cProfile keeps one level of callers, so time below a shared wrapper
(torch's ``no_grad`` decorator, ``nn.Module.__call__``) cannot be told apart by caller; gprof-style
proportional splitting put vanilla GRPO's 2.7 s of rollout generation into the loss (it shares
``torch.no_grad``'s wrapper with the π_old pass). The profile is kept for the top lists; ``--no-cprofile``
times the buckets without its overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fnmatch
import functools
import importlib
import io
import json
import os
import platform
import pstats
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = ("start-up", "generation", "scoring", "loss fwd/bwd", "optimizer", "evaluation", "logging",
           "checkpointing", "other", "outside")
TRAIN = ("generation", "scoring", "loss fwd/bwd", "optimizer")  # model work; the per-update figure
ABSORBING = ("start-up", "evaluation")  # keep the model work opened inside them

# (bucket, module, "Class.method" | "function"), a method name may be a glob ("on_*": every hook the class defines)
ENTRIES: tuple[tuple[str, str, str], ...] = (
    ("other", "lightning.pytorch.trainer.trainer", "Trainer._run_stage"),  # the end of start-up
    ("other", "lightning.pytorch.trainer.trainer", "Trainer._teardown"),
    # generation: the rollout batch (sources' rows, stacking) and double-rollout continuations
    ("generation", "datamodules.stream", "PromptStreamDataModule.produce_rollouts"),
    ("generation", "datamodules.sources", "*.rows"),
    ("generation", "lit_rl.generation.ar", "HFBackend.continue_from"),
    ("generation", "lit_rl.generation.continuations", "DiffusionContinuations.continue_from"),
    # scoring: rewards, processors (advantages; the double-rollout estimate less its continuations)
    ("scoring", "lit_rl.tasks.base", "Task.total_rewards"),
    ("scoring", "lit_rl.algorithms.rl_module", "run_processors"),
    # loss: prepare (π_old / π_ref passes, masks) and one update's micro-batches (the loss's forwards and autograd
    # backward, which the module runs: RLModule.loss_backward)
    ("loss fwd/bwd", "lit_rl.algorithms.losses", "*.prepare"),
    ("loss fwd/bwd", "lit_rl.algorithms.rl_module", "RLModule.loss_backward"),
    # optimizer: one update less its loss (zero_grad, finiteness check, grad norm, clip, step, schedule)
    ("optimizer", "lit_rl.algorithms.rl_module", "RLModule.optimizer_update"),
    # evaluation: greedy validation loop (the sanity check too), Pass@k, the reliability study
    ("evaluation", "lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop.run"),
    ("evaluation", "callbacks.passk", "PassAtKEvaluation.evaluate"),
    ("evaluation", "callbacks.passk", "PassAtKEvaluation.write_report"),
    ("evaluation", "callbacks.dr_reliability", "ContinuationReliability.on_*"),
    # logging: self.log, the logger connector, loggers (MLflow), progress bar, rollout tracking, run records
    ("logging", "lightning.pytorch.core.module", "LightningModule.log"),
    ("logging", "lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.*"),
    ("logging", "lightning.pytorch.loggers.mlflow", "MLFlowLogger.*"),
    ("logging", "lit_rl.loggers", "MLFlowLogger.*"),
    ("logging", "lightning.pytorch.callbacks.progress.rich_progress", "RichProgressBar.on_*"),
    ("logging", "callbacks.tracking", "RolloutTracker.on_*"),
    ("logging", "callbacks.run_record", "RunRecord.on_*"),
    ("logging", "lit_rl.lightning_cli", "SaveConfigToRun.setup"),
    ("logging", "datamodules.stream", "PromptStreamDataModule._write_order_file"),
    # checkpointing: ModelCheckpoint, saving, resume state, the prompt ledger, SIGTERM checkpoints
    ("checkpointing", "lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint.on_*"),
    ("checkpointing", "lightning.pytorch.trainer.trainer", "Trainer.save_checkpoint"),
    ("checkpointing", "callbacks.resume", "ExactResume.on_*"),
    ("checkpointing", "callbacks.resume", "PromptLedger.on_*"),
    ("checkpointing", "callbacks.resume", "CheckpointOnSigterm.on_*"),
)


class BucketClock:
    """Exclusive seconds per bucket: the innermost open bucket owns the time, except that a bucket in
    ``ABSORBING`` keeps the model work (``TRAIN``) opened inside it. ``now`` is injectable for tests."""

    def __init__(self, root: str = "start-up", now: Callable[[], float] = time.perf_counter) -> None:
        self.now, self.stack = now, [root]
        self.start = self.last = now()
        self.seconds = dict.fromkeys(BUCKETS, 0.0)
        self.calls: dict[str, int] = {}

    def tick(self) -> None:
        t = self.now()
        self.seconds[self.stack[-1]] += t - self.last
        self.last = t

    def enter(self, bucket: str) -> None:
        self.tick()
        top = self.stack[-1]
        self.stack.append(top if top in ABSORBING and bucket in TRAIN else bucket)

    def exit(self) -> None:
        self.tick()
        self.stack.pop()


def _timed(fn: Callable, bucket: str, clock: BucketClock) -> Callable:
    main = threading.get_ident()

    name = getattr(fn, "__qualname__", "?")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != main:  # the clock follows the main thread only
            return fn(*args, **kwargs)
        clock.calls[name] = clock.calls.get(name, 0) + 1
        clock.enter(bucket)
        try:
            return fn(*args, **kwargs)
        finally:
            clock.exit()

    return wrapper


def install(clock: BucketClock, entries: tuple[tuple[str, str, str], ...] = ENTRIES) -> list[tuple[str, Any, str, Any]]:
    """Wrap every entry (imports its module); returns ``(bucket, owner, name, original)`` per wrapped function
    (``setattr(owner, name, original)`` undoes it). An entry that matches nothing fails."""
    done = []
    for bucket, module, target in entries:
        mod = importlib.import_module(module)
        owner_pat, _, attr_pat = target.rpartition(".")
        owners = [mod] if not owner_pat else [
            v for k, v in vars(mod).items()
            if isinstance(v, type) and v.__module__ == mod.__name__ and fnmatch.fnmatchcase(k, owner_pat)]
        hits = 0
        for owner in owners:
            for name, v in list(vars(owner).items()):
                if not fnmatch.fnmatchcase(name, attr_pat) or name.startswith("__"):
                    continue
                done.append((bucket, owner, name, v))
                if isinstance(v, property) and v.fget is not None:
                    setattr(owner, name, property(_timed(v.fget, bucket, clock), v.fset, v.fdel, v.__doc__))
                elif callable(v) and not isinstance(v, (type, staticmethod, classmethod)):
                    setattr(owner, name, _timed(v, bucket, clock))
                else:
                    done.pop()
                    continue
                hits += 1
        if not hits:
            raise LookupError(f"step_profile entry {module}:{target} matches nothing")
    return done


def child(out: Path, argv: list[str], profile: bool) -> None:
    """In the profiled process: clock (and cProfile) around the imports, the wrapping and lit_rl's CLI main."""
    sys.path.insert(0, str(ROOT))
    clock = BucketClock()
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    rc: int | None = None
    try:
        install(clock)
        from lit_rl.cli import main as cli_main

        rc = cli_main(argv)
    finally:
        clock.tick()
        if prof is not None:
            prof.disable()
            prof.dump_stats(str(out / "fit.prof"))
        (out / "clock.json").write_text(json.dumps({
            "seconds": clock.seconds, "total": clock.last - clock.start, "rc": rc,
            "updates": clock.calls.get("RLModule.optimizer_update", 0), "calls": clock.calls}))


Key = tuple[str, int, str]  # pstats' (file, line, function)


def _name(key: Key) -> str:
    return pstats.func_std_string(key).replace(str(ROOT) + "/", "").replace(sys.prefix + "/", "")


def top_rows(stats: pstats.Stats, sort: str, n: int, own_only: bool = False) -> list[dict[str, Any]]:
    """The first ``n`` functions by ``sort`` ("cumulative" or "tottime"); ``own_only``: lit_rl's own files."""
    col = 3 if sort == "cumulative" else 2
    mine = (str(ROOT / d) for d in ("lit_rl", "datamodules", "callbacks"))
    prefixes = tuple(mine)
    rows = [(k, v) for k, v in stats.stats.items()  # type: ignore[attr-defined]
            if not k[0].endswith("step_profile.py") and (not own_only or k[0].startswith(prefixes))]
    rows = sorted(rows, key=lambda kv: kv[1][col], reverse=True)[:n]
    return [{"function": _name(k), "calls": v[1], "tottime": round(v[2], 3), "cumtime": round(v[3], 3)}
            for k, v in rows]


@contextlib.contextmanager
def before_worktree(ref: str) -> Iterator[tuple[Path, str]]:
    """A temporary detached ``git worktree`` of ``ref`` (removed afterwards) and its commit. The runs' caches
    (``runs/cache``: the warm start) are the after checkout's, linked in, so both runs find the same state."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                         text=True)
    if sha.returncode != 0:
        raise SystemExit(f"--before-ref: {ref!r} is not a commit of {ROOT}: {sha.stderr.strip()}")
    with tempfile.TemporaryDirectory(prefix="step_profile_before_") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha.stdout.strip()], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            (ROOT / "runs").mkdir(exist_ok=True)
            (tree / "runs").symlink_to(ROOT / "runs", target_is_directory=True)
            yield tree, sha.stdout.strip()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def final_metrics(output: str) -> dict[str, float]:
    """The ``val/*`` numbers of the fit's last line (``fit ended at step N: key value, key value; run folder``)."""
    lines = [ln for ln in output.splitlines() if ln.startswith("fit ended at step ")]
    if not lines:
        return {}
    shown = lines[-1].split(": ", 1)[1].split("; ", 1)[0]
    return {m[1]: float(m[2]) for m in re.finditer(r"(val/\S+) (-?inf|nan|[-+0-9.eE]+)", shown)}


def profile_run(configs: list[str], max_steps: int | None, extra: list[str], top: int, profile: bool = True,
                keep: Path | None = None, root: Path = ROOT) -> dict[str, Any]:
    """One ``lit_rl fit`` in a child process (fresh root dir and MLflow store): its buckets and top lists.
    ``root``: the checkout whose code (and this script's copy) runs, e.g. a ``--before-ref`` worktree."""
    with tempfile.TemporaryDirectory(prefix="step_profile_") as tmp:
        fit = [a for c in configs for a in ("--config", c)]
        fit += [f"--trainer.default_root_dir={tmp}/run",
                f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp}/mlflow.db"]
        fit += ([f"--trainer.max_steps={max_steps}"] if max_steps is not None else []) + extra
        cmd = [sys.executable, str(root / "benchmarks" / "step_profile.py"), "--child", tmp, "--config", "-",
               *([] if profile else ["--no-cprofile"]), "--", "fit", *fit]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        clock = json.loads((Path(tmp) / "clock.json").read_text()) if (Path(tmp) / "clock.json").exists() else {}
        if proc.returncode != 0 or clock.get("rc") != 0:
            raise RuntimeError(f"lit_rl fit failed (rc {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
        stats = pstats.Stats(str(Path(tmp) / "fit.prof"), stream=io.StringIO()) if profile else None
        if keep is not None and profile:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes((Path(tmp) / "fit.prof").read_bytes())
        shown = " ".join(["python -m lit_rl fit", *fit]).replace(tmp, "$TMP")
    buckets = dict(clock["seconds"])
    buckets["outside"] = max(wall - clock["total"], 0.0)  # interpreter start and exit
    updates = int(clock["updates"])
    result = {"command": shown, "wall_s": round(wall, 3), "updates": updates,
              "buckets": {k: round(v, 3) for k, v in buckets.items()},
              "train_part_s": round(wall - buckets["start-up"] - buckets["outside"], 3),
              "final": final_metrics(proc.stdout + "\n" + proc.stderr),
              "train_s_per_update": round(sum(buckets[b] for b in TRAIN) / updates, 4) if updates else None}
    if stats is not None:
        result |= {"top_cumulative": top_rows(stats, "cumulative", top), "top_tottime": top_rows(stats, "tottime", top),
                   "top_lit_rl": top_rows(stats, "cumulative", top, own_only=True)}
    return result


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
    parts = [f"### {label}", f"`{result['command']}`",
             f"{result['updates']} optimizer updates; wall {result['wall_s']:.1f} s; generation + scoring + loss + "
             f"optimizer per update: {result['train_s_per_update']} s; training part (wall less start-up and outside): "
             f"{result['train_part_s']:.1f} s; final: {result['final']}", table(result)]
    if "top_cumulative" in result:
        parts += ["Top by cumulative time:", top_table(result["top_cumulative"]),
                  "Top by own time (tottime):", top_table(result["top_tottime"]),
                  "lit_rl's own functions (lit_rl/, datamodules/, callbacks/) by cumulative time:",
                  top_table(result["top_lit_rl"])]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", required=True, help="a lit_rl config (repeatable, in order)")
    ap.add_argument("--max-steps", type=int, default=None, help="trainer.max_steps (default: the config's)")
    ap.add_argument("--compare", action="append", default=None, metavar="KEY=VALUE",
                    help="run twice: with --KEY=VALUE (before; repeatable, all apply) and without (after); the ratios")
    ap.add_argument("--before-ref", default=None, metavar="GIT_REF",
                    help="run twice: this commit's code (before, a temporary git worktree) and this checkout's (after)")
    ap.add_argument("--top", type=int, default=20, help="functions in each top list")
    ap.add_argument("--no-cprofile", action="store_true", help="buckets only, without cProfile's overhead")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    ap.add_argument("--keep-prof", default=None, help="copy each run's cProfile file into this folder")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="passed on to lit_rl fit (after --), e.g. --trainer.x=1")
    args = ap.parse_args(argv)
    if args.child:
        child(Path(args.child), args.overrides, profile=not args.no_cprofile)
        return {}
    extra = [o if o.startswith("--") else f"--{o}" for o in args.overrides]
    keep = Path(args.keep_prof) if args.keep_prof else None

    def run(extra_args: list[str], name: str, root: Path = ROOT) -> dict[str, Any]:
        return profile_run(args.config, args.max_steps, extra_args, args.top, not args.no_cprofile,
                           keep and keep / f"{name}.prof", root)

    runs: dict[str, dict[str, Any]] = {}
    if args.before_ref:
        with before_worktree(args.before_ref) as (old_root, sha):
            runs[f"before ({args.before_ref} = {sha[:10]})"] = run(extra + [f"--{c}" for c in args.compare or []],
                                                                   "before", old_root)
        runs["after (this checkout)"] = run(extra, "after")
    elif args.compare:
        bad = [c for c in args.compare if "=" not in c]
        if bad:
            ap.error(f"--compare needs KEY=VALUE, got {bad[0]!r}")
        runs[f"before ({', '.join(args.compare)})"] = run(extra + [f"--{c}" for c in args.compare], "before")
        runs["after (default)"] = run(extra, "after")
    else:
        runs[" + ".join(args.config)] = run(extra, "fit")
    text = "\n\n".join(report(k, v) for k, v in runs.items())
    summary: dict[str, Any] = {
        "benchmark": "step_profile", "configs": args.config, "max_steps": args.max_steps,
        "cprofile": not args.no_cprofile,
        "runs": {k: {x: v[x] for x in ("command", "wall_s", "updates", "buckets", "train_s_per_update", "train_part_s",
                                       "final")}
                 for k, v in runs.items()},
        "machine": {"cpu_count": os.cpu_count(), "loadavg": list(os.getloadavg()),
                    "python": platform.python_version(), "platform": platform.platform()}}
    if args.compare or args.before_ref:
        before, after = runs.values()
        if before["train_s_per_update"] and after["train_s_per_update"]:
            summary["per_update_ratio"] = round(before["train_s_per_update"] / after["train_s_per_update"], 3)
            summary["wall_ratio"] = round(before["wall_s"] / after["wall_s"], 3)
            summary["train_part_ratio"] = round(before["train_part_s"] / after["train_part_s"], 3)
            loss = [r["buckets"]["loss fwd/bwd"] for r in (before, after)]
            summary["loss_ratio"] = round(loss[0] / loss[1], 3) if loss[1] else None
            text += (f"\n\nbefore / after: per update (generation + scoring + loss + optimizer) "
                     f"{summary['per_update_ratio']:.3f}x; loss fwd/bwd {summary['loss_ratio']}x; "
                     f"training part {summary['train_part_ratio']:.3f}x; whole run {summary['wall_ratio']:.3f}x")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
