"""ERILS Fig. 8 in miniature: the report of the G_ext sweep (``conf/sweeps/erils_gext.yaml``).

The sweep runs the embedded ERILS default at the paper's group size G = 6 with G_ext ∈ {1, 2, 3, 4}
(G_on = 6 − G_ext), 3 seeds each, as an Optuna grid (``python -m lit_rl sweep --config
conf/sweeps/erils_gext.yaml``, one worker per core). This module reads the finished trials from the sweep's
MLflow store and writes, into ``--out``:

* ``report.md`` / ``summary.json``: per G_ext the final greedy cell accuracy on all 256 test puzzles (mean ±
  std, min-max, each seed), the best point, the on-policy reward and advantage balance, wall time; with
  ``--lengths`` also Table XI's protocol (three generation lengths) on every trial's final checkpoint;
* ``gext.png``: final accuracy against G_ext (seeds as points, mean ± std) and the learning curves (mean and
  min-max band over seeds).

``--lengths`` first runs ``python -m lit_rl validate`` with ``conf/eval/erils_lengths.yaml`` on each finished
trial's ``last.ckpt`` (resumable: a trial's evaluation that finished is not run again)::

    python -m lit_rl.reproduce.gext --config conf/sweeps/erils_gext.yaml --out docs/results/erils_gext --lengths
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.cli_args import LitArgumentParser
from lit_rl.report import RunData, _plt, load_runs
from lit_rl.reproduce.dr_report import _f, _stats
from lit_rl.reproduce.erils import LENGTHS_EVAL, METRIC
from lit_rl.reproduce.erils_report import CHANCE
from lit_rl.reproduce.lengths import lengths_rows

__all__ = ["GEXT", "METRIC", "Trial", "build", "main", "trials_of"]

GEXT = "data.init_args.g_ext"
SEED = "seed_everything"


class Trial:
    """A finished trial: its run, G_ext, seed, folder (checkpoints, config) and wall time."""

    def __init__(self, run: RunData, folder: Path, seconds: float | None) -> None:
        self.run, self.folder, self.seconds = run, folder, seconds
        self.g_ext = int(run.params[GEXT])
        self.seed = int(run.params.get(SEED, 0))
        self.number = int(run.tags["optuna.trial_number"])


def trials_of(tracking_uri: str, experiment: str, study: str, output_dir: Path,
              storage: str | None = None) -> list[Trial]:
    """The study's COMPLETE trials (the latest run of each grid point), sorted by (G_ext, seed). Wall times come
    from the Optuna ``storage`` when given (start to completion of the trial), else from the MLflow run, whose
    end moves when a later ``validate`` of the trial's checkpoint logs into it (the trial config names its run)."""
    from mlflow.tracking import MlflowClient

    durations: dict[int, float] = {}
    if storage is not None:
        import optuna

        try:
            found = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # no such study in that storage: no Optuna wall times
            found = []
        for t in found:
            if t.datetime_start and t.datetime_complete:
                durations[t.number] = (t.datetime_complete - t.datetime_start).total_seconds()
    client = MlflowClient(tracking_uri=tracking_uri)
    runs = load_runs(tracking_uri, experiments=[experiment], tags={"lit_rl.sweep": study})
    by_point: dict[tuple[int, int], Trial] = {}
    for r in runs:
        done = r.tags.get("lit_rl.role") == "trial" and r.tags.get("optuna.trial_state") == "COMPLETE"
        if not done or GEXT not in r.params:
            continue
        info = client.get_run(r.run_id).info
        secs = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else None
        secs = durations.get(int(r.tags["optuna.trial_number"]), secs if storage is None else None)
        t = Trial(r, output_dir / study / f"trial_{r.tags['optuna.trial_number']}", secs)
        by_point[(t.g_ext, t.seed)] = t
    return sorted(by_point.values(), key=lambda t: (t.g_ext, t.seed))


def _last(run: RunData, metric: str, k: int = 1) -> float | None:
    s = [v for _, v in run.series(metric)][-k:]
    return sum(s) / len(s) if s else None


def _plot(groups: dict[int, list[Trial]], group_size: int, path: Path) -> None:
    plt = _plt()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    xs = sorted(groups)
    for g in xs:
        finals = [_last(t.run, METRIC) for t in groups[g]]
        ax0.scatter([g] * len(finals), finals, s=18, color="grey", zorder=3)
    st = [_stats([_last(t.run, METRIC) for t in groups[g]]) for g in xs]
    ax0.errorbar(xs, [s["mean"] for s in st], yerr=[s["std"] for s in st], marker="o", capsize=4, label="mean ± std")
    ax0.axhline(CHANCE, color="k", ls=":", lw=1, label="chance")
    ax0.set_xticks(xs, [f"{g}\n(G_on {group_size - g})" for g in xs])
    ax0.set_xlabel(f"G_ext (G = {group_size})")
    ax0.set_ylabel("final greedy cell accuracy (256 puzzles)")
    ax0.legend(fontsize=8)
    for g in xs:
        per_seed = [dict(t.run.series(METRIC)) for t in groups[g]]
        steps = sorted(set.intersection(*(set(p) for p in per_seed)))
        vals = [[p[s] for p in per_seed] for s in steps]
        x = [s + 1 for s in steps]
        line, = ax1.plot(x, [sum(v) / len(v) for v in vals], label=f"G_ext {g}")
        ax1.fill_between(x, [min(v) for v in vals], [max(v) for v in vals], color=line.get_color(), alpha=0.2)
    ax1.axhline(CHANCE, color="k", ls=":", lw=1)
    ax1.set_xlabel("optimizer updates")
    ax1.set_ylabel("greedy cell accuracy")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def build(trials: Sequence[Trial], out: Path, group_size: int = 6) -> dict[str, Any]:
    """Write ``report.md``, ``summary.json`` and ``gext.png`` into ``out``; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[int, list[Trial]] = {}
    for t in trials:
        groups.setdefault(t.g_ext, []).append(t)
    summary: dict[str, Any] = {"metric": METRIC, "group_size": group_size, "chance": CHANCE, "g_ext": {}}
    md = [f"# ERILS Fig. 8 in miniature: the external share of each group (G = {group_size})", "",
          f"`conf/sweeps/erils_gext.yaml`: the embedded ERILS default (`conf/erils.yaml`: 300 updates, the same warm "
          f"start and evaluation) with G_ext external and G_on = {group_size} − G_ext on-policy rollouts per prompt. "
          f"Greedy cell accuracy on all 256 test puzzles (chance {CHANCE}); each seed moves the prompt order, the "
          "rollout noise and the SPG masks.", "",
          "| G_ext | G_on | seeds | final (mean ± std) | min-max | per seed | best (mean) | on-policy reward, last 5 "
          "| on-policy advantages > 0 (last 5) | wall time / run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for g in sorted(groups):
        ts = groups[g]
        finals = [_last(t.run, METRIC) for t in ts]
        final, best = _stats(finals), _stats([max((v for _, v in t.run.series(METRIC)), default=None) for t in ts])
        reward = _stats([_last(t.run, "train/on_policy/reward_mean", 5) for t in ts])
        pos = _stats([_last(t.run, "train/on_policy/advantage_pos_frac", 5) for t in ts])
        secs = _stats([t.seconds for t in ts])
        summary["g_ext"][g] = {"g_on": group_size - g, "final": final, "best": best, "on_policy_reward": reward,
                               "advantage_pos_frac": pos, "seconds": secs,
                               "per_seed": {t.seed: f for t, f in zip(ts, finals)}}
        md.append(f"| {g} | {group_size - g} | {len(ts)} | **{_f(final['mean'])}** ± {_f(final['std'])} | "
                  f"{_f(final['min'])}-{_f(final['max'])} | "
                  + ", ".join(f"s{t.seed} {_f(f)}" for t, f in zip(ts, finals))
                  + f" | {_f(best['mean'])} | {_f(reward['mean'])} | {_f(pos['mean'])} | {_f(secs['mean'], 0)} s |")
    if groups:
        _plot(groups, group_size, out / "gext.png")
        md += ["", "![G_ext](gext.png)", ""]
    lines, by_length = lengths_rows({f"G_ext {g}": [t.folder for t in groups[g]] for g in sorted(groups)})
    if lines:
        summary["lengths"] = by_length
        md += ["## Table XI's protocol on the final checkpoints", "",
               "Deterministic decoding (T 0, L_gen/2 steps, block 16) at L_gen 48 / 96 / 192 "
               "(`conf/eval/erils_lengths.yaml`), all 256 puzzles, mean ± std over seeds.", "", *lines, ""]
    total = sum(t.seconds or 0 for t in trials)
    md.append(f"{len(trials)} trials, {total / 60:.1f} min of training in all (sum over trials).")
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = LitArgumentParser(prog="python -m lit_rl.reproduce.gext", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/sweeps/erils_gext.yaml", help="the sweep YAML")
    parser.add_argument("--out", default="runs/reproduce/erils_gext", help="where the report goes")
    parser.add_argument("--lengths", action="store_true",
                        help="first evaluate every finished trial's last checkpoint at three generation lengths")
    parser.add_argument("--workers", type=int, default=2, help="evaluations run at once (default 2)")
    args = parser.parse_args(argv)
    from lit_rl.reproduce.runner import run_jobs, validate_job
    from lit_rl.sweep.schema import SweepConfig

    cfg = SweepConfig.from_yaml(args.config)
    trials = trials_of(cfg.tracking_uri, cfg.experiment_name, cfg.study_name, Path(cfg.output_dir), cfg.storage)
    if not trials:
        print(f"error: no finished trials of study {cfg.study_name!r} in {cfg.tracking_uri} (run the sweep first: "
              f"python -m lit_rl sweep --config {args.config})", file=sys.stderr)
        return 2
    if args.lengths:
        # seed-major: an interrupted evaluation has covered every G_ext once before any twice
        jobs = [validate_job(f"trial_{t.number}_lengths", t.folder, [LENGTHS_EVAL], {"trial": str(t.number)})
                for t in sorted(trials, key=lambda t: (t.seed, t.g_ext))
                if (t.folder / "checkpoints/last.ckpt").exists()]
        failed = [r.name for r in run_jobs(jobs, workers=args.workers, threads=1) if not r.ok]
        if failed:
            print(f"[gext] {len(failed)} evaluation(s) failed (logs under {cfg.output_dir})", file=sys.stderr)
    g_on = trials[0].run.params.get("data.init_args.g_on")
    group_size = trials[0].g_ext + int(g_on) if g_on is not None else 6
    summary = build(trials, Path(args.out), group_size)
    print(f"[gext] report: {Path(args.out) / 'report.md'}")
    print(json.dumps({"trials": len(trials), "out": args.out,
                      "final": {g: v["final"]["mean"] for g, v in summary["g_ext"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
