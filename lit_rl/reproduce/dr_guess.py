"""The guess testbed's parts of the double-rollout report (``reproduce double-rollout --testbed guess``).

* the premise statistics and the reliability study in DR Fig. 1-2's protocol, on the warm start
  (:mod:`lit_rl.reproduce.premise`), and the premise statistics of every final checkpoint (what RL changed);
* steps to reach GRPO's best accuracy (DR's "fewer RL steps"), from the mean curves and seed by seed;
* the ρ and N trends with their spread over seeds (one fit job per value and seed).

Measurements on checkpoints are cached in the study folder (``premise.json``), keyed by file and mtime.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.report import RunData, _plt
from lit_rl.reproduce.plan_file import StudyPlan
from lit_rl.reproduce.premise import TESTBED_TASK

__all__ = ["TASK", "premise_cached", "premise_section", "progress_sections", "steps_to_reach", "trend_rows",
           "trend_sections", "warm_start_of"]

#: the guess testbed's task (conf/double_rollout_chainsum.yaml + conf/double_rollout_guess.yaml)
TASK = {**TESTBED_TASK, "answer_mod": 2}
_CACHED = re.compile(r"(?:loaded cached weights|saved the warm start to) (\S+\.pt)")


def warm_start_of(folders: Sequence[Path]) -> Path | None:
    """The warm-start file the jobs loaded, read from their logs (``AR SFT warm-up: loaded cached weights ...``)."""
    for folder in folders:
        log = folder / "log.txt"
        if log.is_file():
            m = _CACHED.search(log.read_text(errors="replace"))
            if m and Path(m.group(1)).is_file():
                return Path(m.group(1))
    return None


def premise_cached(out: Path, path: Path, study: bool, quick: bool = False) -> dict[str, Any]:
    """:func:`lit_rl.reproduce.premise.measure` of ``path`` (with the reliability study when ``study``), cached in
    ``out/premise.json`` by path and mtime. Quick mode measures 8 problems, so that a test runs it."""
    from lit_rl.reproduce.premise import measure

    cache_file = out / "premise.json"
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    key = f"{path}|{path.stat().st_mtime_ns}|{study}|{quick}"
    if key not in cache:
        sizes = {"problems": 8, "K": 2, "G": 2, "N": 2, "min_count": 1} if quick else {}
        cache[key] = measure(path, TASK, study=study, **sizes)
        atomic_write_text(cache_file, json.dumps(cache, indent=1) + "\n")
    return cache[key]


def steps_to_reach(curves: dict[str, list[tuple[int, list[float]]]], target: float) -> dict[str, dict[str, Any]]:
    """Per method, the first evaluation step where the mean over seeds reaches ``target`` (``None``: never), and
    the same seed by seed. ``curves``: ``{method: [(step, [value per seed])]}``, steps ascending."""
    out = {}
    for m, pts in curves.items():
        mean_step = next((s for s, v in pts if statistics.fmean(v) >= target - 1e-12), None)
        seeds = len(pts[0][1]) if pts else 0
        per_seed = [next((s for s, v in pts if v[i] >= target - 1e-12), None) for i in range(seeds)]
        out[m] = {"mean_curve": mean_step, "per_seed": per_seed}
    return out


def trend_rows(jobs: dict[str, RunData], metric: str, key: str, values: Sequence[float], seeds: Sequence[int],
               main: dict[float, str]) -> list[dict[str, Any]]:
    """Final ``metric`` over seeds per value of ``key`` (``rho`` / ``n``): jobs ``dr_<key><v>_s<seed>``, and for
    the values in ``main`` (value -> job prefix, e.g. ``{0.9: "dr", ...}``) the main comparison's jobs."""
    rows = []
    for v in sorted({*values, *main}):
        prefix = main.get(v, f"dr_{key}{v:g}")
        finals = [jobs[f"{prefix}_s{s}"].series(metric)[-1][1] for s in seeds
                  if f"{prefix}_s{s}" in jobs and jobs[f"{prefix}_s{s}"].series(metric)]
        if finals:
            rows.append({"value": v, "finals": finals, "mean": statistics.fmean(finals),
                         "std": statistics.stdev(finals) if len(finals) > 1 else 0.0, "job": prefix})
    return rows


def trend_markdown(name: str, rows: Sequence[dict[str, Any]], note: str) -> list[str]:
    head = f"| {name} | " + " | ".join(f"{r['value']:g}" for r in rows) + " |"
    return [head, "|---|" + "---|" * len(rows),
            "| final accuracy (mean ± std) | " + " | ".join(f"{r['mean']:.3f} ± {r['std']:.3f}" for r in rows) + " |",
            "| per seed | " + " | ".join(" / ".join(f"{x:.3f}" for x in r["finals"]) for r in rows) + " |", "",
            note, ""]


def plot_trends(rho: Sequence[dict[str, Any]], n: Sequence[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, rows, label in ((axes[0], rho, "ρ (share of the trace kept)"), (axes[1], n, "N (continuations)")):
        xs = [r["value"] for r in rows]
        ax.errorbar(xs, [r["mean"] for r in rows], yerr=[r["std"] for r in rows], marker="o", capsize=3)
        for r in rows:
            ax.scatter([r["value"]] * len(r["finals"]), r["finals"], s=8, color="grey", alpha=0.6)
        ax.set_xlabel(label)
        ax.set_ylabel("final held-out accuracy")
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log", base=2)
    axes[0].set_title("mean ± std over seeds, dots = seeds", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def premise_section(out: Path, jobs: dict[str, RunData], quick: bool, summary: dict[str, Any]) -> list[str]:
    """The warm start's premise statistics and the reliability study in the paper's protocol."""
    from lit_rl.reproduce.premise import describe

    warm = warm_start_of([out / "runs" / name for name in jobs])
    md = ["## The premise, on the warm start (before any RL)", ""]
    if warm is None:
        return md + ["(no job log names its warm start yet)", ""]
    res = premise_cached(out, warm, study=True, quick=quick)
    summary["premise"] = res
    return md + [f"`scripts/dr_premise.py` on the warm start every job loads (`{warm.name}`), task "
                 f"`{json.dumps(TASK)}`. Lucky guesses are what the outcome reward credits and the continuations "
                 "should not; slips are the reverse. The tables below are DR Fig. 1-2's protocol: the starting "
                 "model, difficulty from separate samples, length crossed with difficulty, both with and without "
                 "the continuation budget.", "", describe(res)]


def progress_sections(out: Path, jobs: dict[str, RunData], curves: dict[str, list[tuple[int, list[float]]]],
                      seeds: Sequence[int], quick: bool, summary: dict[str, Any],
                      tokens_at: Callable[[str, int], float] | None = None) -> list[str]:
    """Steps to reach GRPO's best accuracy; the premise statistics of every final checkpoint. ``tokens_at(method,
    step)``: mean rollout tokens generated by ``step``. ``curves`` hold the seeds every method logged, in order."""
    md = []
    grpo = curves.get("grpo")
    if grpo:
        target = max(statistics.fmean(v) for _, v in grpo)
        reach = steps_to_reach(curves, target)
        summary["steps_to_grpo_best"] = {"target": target, **reach}
        every = min((b[0] - a[0] for a, b in zip(grpo, grpo[1:])), default=0)
        md += ["## Steps to reach GRPO's best accuracy (DR's \"fewer RL steps\")", "",
               f"GRPO's best mean accuracy over its {len(grpo[0][1])} seeds is {target:.3f}. The first evaluation "
               f"(every {every} updates) where each method's mean curve reaches it, the rollout tokens generated by "
               "then (mean over seeds), each method's own best and where it is, and the same seed by seed. GRPO "
               "reaches the target at its own best by construction, so a method equal to GRPO misses it about half "
               "the time: read the own-best columns with it.", "",
               "| method | reaches GRPO's best at | rollout tokens by then | own best (mean curve) | at update | "
               "per seed: reaches at |", "|---|---|---|---|---|---|"]
        for m, r in reach.items():
            pts = curves[m]
            best_step, best = max(((s, statistics.fmean(v)) for s, v in pts), key=lambda x: (x[1], -x[0]))
            at = r["mean_curve"]
            tokens = "-" if at is None or tokens_at is None else f"{tokens_at(m, at) / 1e3:.0f}k"
            seeds_cell = ", ".join(f"s{sd}: {'-' if st is None else st}" for sd, st in zip(seeds, r["per_seed"]))
            md.append(f"| {m} | {'not reached' if at is None else f'update {at}'} | {tokens} | {best:.3f} | "
                      f"{best_step} | {seeds_cell} |")
            r.update(own_best=best, own_best_step=best_step)
        md += ["", "Per seed: the first update where that seed's curve reaches the target (\"-\": never).", ""]
        start = statistics.fmean(grpo[0][1])
        levels = [(f, start + f * (target - start)) for f in (0.5, 0.75, 0.9)]
        md += ["Where each mean curve gets part of the way from the start to GRPO's best (the early-training view of "
               "the same claim):", "", "| method | " + " | ".join(f"{f:.0%} ({lv:.3f})" for f, lv in levels) + " |",
               "|---|" + "---|" * len(levels)]
        part = {}
        for m in curves:
            steps = [steps_to_reach({m: curves[m]}, lv)[m]["mean_curve"] for _, lv in levels]
            part[m] = steps
            md.append(f"| {m} | " + " | ".join("-" if st is None else f"update {st}" for st in steps) + " |")
        summary["steps_to_fraction_of_grpo_best"] = {"levels": levels, **part}
        md.append("")
    rows = []
    for m in curves:
        per = []
        for s in seeds:
            ckpt = out / "runs" / f"{m}_s{s}" / "checkpoints" / "last.ckpt"
            if ckpt.is_file():
                per.append(premise_cached(out, ckpt, study=False, quick=quick)["premise"])
        if per:
            rows.append((m, per))
    if rows:
        def cell(per, key):
            vals = [p[key] for p in per]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            return f"{statistics.fmean(vals):.3f} ± {sd:.3f}"

        summary["final_premise"] = {m: per for m, per in rows}
        warm = summary.get("premise", {}).get("premise")
        md += ["## What RL changed: the premise statistics of the final checkpoints", "",
               f"{rows[0][1][0]['samples']:,} T-1 samples per checkpoint on the warm start's problems with its "
               "sampling seed (mean ± std over seeds). "
               "Supported accuracy counts a correct answer only after a right trace.", "",
               "| policy | accuracy | supported accuracy | right traces | lucky share of rewarded | slips (of all) |",
               "|---|---|---|---|---|---|"]
        if warm:
            md.append(f"| warm start | {warm['accuracy']:.3f} | {warm['supported_accuracy']:.3f} | "
                      f"{warm['trace_accuracy']:.3f} | {warm['lucky_share_of_rewarded']:.3f} | "
                      f"{warm['slip_share_of_all']:.3f} |")
        for m, per in rows:
            md.append(f"| {m} ({len(per)} seeds) | {cell(per, 'accuracy')} | {cell(per, 'supported_accuracy')} | "
                      f"{cell(per, 'trace_accuracy')} | {cell(per, 'lucky_share_of_rewarded')} | "
                      f"{cell(per, 'slip_share_of_all')} |")
        md.append("")
    return md


def trend_sections(out: Path, jobs: dict[str, RunData], metric: str, seeds: Sequence[int],
                   summary: dict[str, Any], plan: StudyPlan) -> list[str]:
    """ρ and N with the spread over seeds (DR Tables 2-3 in miniature): the values of the plan's ``rho`` and ``n``
    jobs (their tags)."""
    rho = trend_rows(jobs, metric, "rho", [float(e.tags["rho"]) for e in plan.entries_of("rho") if "rho" in e.tags],
                     seeds, {0.9: "dr"})
    n = trend_rows(jobs, metric, "n", [int(e.tags["n"]) for e in plan.entries_of("n") if "n" in e.tags], seeds,
                   {4: "dr", 1: "grpo"})
    summary["trends"] = {"rho": rho, "n": n}
    md = [f"## ρ and N (DR Tables 2-3 in miniature; seeds {', '.join(map(str, seeds))}, final held-out accuracy)", ""]
    md += trend_markdown("ρ", rho, "ρ 0.9 is the main DR run (N 4).")
    md += trend_markdown("N", n, "N 1 is vanilla GRPO (no second stage); N 4 is the main DR run (ρ 0.9).")
    if rho or n:
        plot_trends(rho, n, out / "trends.png")
        md += ["![trends](trends.png)", ""]
    return md
