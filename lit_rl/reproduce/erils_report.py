"""The report of ``python -m lit_rl reproduce erils``: figures and tables from its MLflow store.

* ``curves.png``: greedy cell accuracy on all 256 test puzzles of every variant against optimizer updates
  (mean and min-max band over seeds; chance, 0.25, as a line);
* ``diagnostics.png``: per-source curves (mean over seeds): on-policy and external reward, the on-policy
  advantages' sign balance, on-policy completion length, format rate, the external rows' ELBO, the share
  of on-policy rows that hit L_gen without EOS, and Pass@k (k = 1..4) at the end;
* ``report.md`` with the equal-budget table, the seed / thread spread, the length-control comparison and
  run times; ``summary.json`` with the same numbers; ``curves.json``: every finished job's curves behind the two
  figures (``job -> metric -> [[step, value], ...]``), so that they can be redrawn without the store.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Sequence

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.report import RunData, _plt, load_runs
from lit_rl.reproduce.dr_report import _f, _stats, latest_finished
from lit_rl.reproduce.plan_file import StudyPlan

__all__ = ["CHANCE", "DIAGNOSTICS", "build", "countdown_chance", "expression_chance"]

CHANCE = 0.25  # a uniformly random digit in every blank
LABELS = {
    "erils": "ERILS (source-specific, Eq. 9)", "spg": "SPG (on-policy only)", "joint": "joint processing (Eq. 11)",
    "external_only": "external rollouts only", "sft": "SFT on the external rollouts",
}
#: (metric, panel title) of diagnostics.png, all logged once per rollout batch (at the optimizer step after it)
DIAGNOSTICS = (
    ("train/on_policy/reward_mean", "on-policy reward"),
    ("train/external/reward_mean", "external reward"),
    ("train/on_policy/advantage_pos_frac", "on-policy advantages > 0 (share)"),
    ("train/on_policy/length_mean", "on-policy completion length (tokens)"),
    ("train/on_policy/format_rate", "on-policy format rate (<answer> block)"),
    ("train/spg/elbo_external", "external rows' ELBO (per token)"),
    ("train/on_policy/hit_limit_frac", "on-policy rows hitting L_gen without EOS"),
)
PASS_AT = tuple(f"val/sudoku/multi/pass_at_{k}" for k in range(1, 5))


def _band(runs: Sequence[RunData], metric: str) -> list[tuple[int, list[float]]]:
    """``[(step, [value per run])]`` on the steps every run logged."""
    per = [dict(r.series(metric)) for r in runs]
    per = [p for p in per if p]
    if not per:
        return []
    steps = sorted(set.intersection(*(set(p) for p in per)))
    return [(s, [p[s] for p in per]) for s in steps]


def _plot_curves(groups: dict[str, list[RunData]], metric: str, path: Path, extra: dict[str, list[RunData]],
                 chance: float = CHANCE, ylabel: str = "greedy cell accuracy (256 test puzzles)") -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    highest = chance
    for i, (name, runs) in enumerate([*groups.items(), *extra.items()]):
        pts = _band(runs, metric)
        if not pts:
            continue
        highest = max(highest, *(max(v) for _, v in pts))
        xs = [s for s, _ in pts]
        style = "--" if name in extra else "-"
        ax.plot(xs, [statistics.fmean(v) for _, v in pts], style, marker="o", ms=3, color=f"C{i}",
                label=f"{LABELS.get(name, name)} ({len(pts[0][1])} run{'s' if len(pts[0][1]) > 1 else ''})")
        if len(pts[0][1]) > 1:
            ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], color=f"C{i}", alpha=0.2)
    ax.axhline(chance, color="grey", ls=":", lw=1, label=f"chance ({chance:.3g})")
    ax.set_xlabel("optimizer updates")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02 if highest > 0.6 else max(0.3, 1.25 * highest))  # low curves (Countdown) readable
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center right" if highest > 0.6 else "upper right")
    ax.set_title("equal budget; band = min-max over seeds", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _plot_diagnostics(groups: dict[str, list[RunData]], path: Path, pass_at: Sequence[str] = PASS_AT) -> None:
    plt = _plt()
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5))
    for ax, (metric, title) in zip(axes.flat, DIAGNOSTICS):
        for i, (name, runs) in enumerate(groups.items()):
            pts = _band(runs, metric)
            if pts:
                ax.plot([s for s, _ in pts], [statistics.fmean(v) for _, v in pts], color=f"C{i}", lw=1.2,
                        label=LABELS.get(name, name))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer updates", fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes.flat[len(DIAGNOSTICS)]  # Pass@k at the end of training (mean over seeds)
    for i, (name, runs) in enumerate(groups.items()):
        ks = [(k, [_last(r, m) for r in runs]) for k, m in enumerate(pass_at, 1)]
        ks = [(k, [v for v in vals if v is not None]) for k, vals in ks]
        ks = [(k, statistics.fmean(v)) for k, v in ks if v]
        if ks:
            ax.plot([k for k, _ in ks], [v for _, v in ks], marker="o", color=f"C{i}", label=LABELS.get(name, name))
    ax.set_title("pass@k at the end (T 0.9, 64 test problems)", fontsize=9)
    ax.set_xlabel("k", fontsize=8)
    ax.set_xticks(range(1, 5))
    ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


def _last(run: RunData, metric: str) -> float | None:
    s = run.series(metric)
    return s[-1][1] if s else None


def _mean_of(runs: Sequence[RunData], metric: str, which: str = "last", k: int = 5) -> dict[str, float]:
    """Per-run mean of the first or last ``k`` points of ``metric``, then stats over runs."""
    vals = []
    for r in runs:
        s = [v for _, v in r.series(metric)]
        if s:
            part = s[:k] if which == "first" else s[-k:]
            vals.append(statistics.fmean(part))
    return _stats(vals)


def _failure_reading(final: float | None, format_rate: float | None, start: float | None) -> str:
    """How a run ended: ``learns`` (more than 0.1 above its start), ``collapses`` (below 0.05: under chance, 0.25,
    whatever the format rate says: measured, SPG at lr 3e-4 kept an ``<answer>`` tag in 96-100% of its rollouts
    while writing only repeated tags), ``degrades`` (more than 0.1 below its start, not collapsed) or ``stays low``
    (within 0.1 of its start). ``format_rate`` is not used: it is the table's column."""
    if final is None:
        return "-"
    if start is not None and final > start + 0.1:
        return "learns"
    if final < 0.05:
        return "collapses"
    if start is not None and final < start - 0.1:
        return "degrades"
    return "stays low"


def expression_chance(problems: Sequence[tuple[Sequence[int], int]]) -> float:
    """Chance on Countdown problems ``[(numbers, target)]``: the mean share of the 192 expressions of a problem's
    three numbers (:func:`~lit_rl.tasks.countdown_problems.three_number_expressions`) that hit its target, i.e.
    the accuracy of a policy that writes a uniformly random expression of the right numbers."""
    from lit_rl.tasks.countdown_problems import three_number_expressions

    return statistics.fmean(statistics.fmean(v == t for _, _, v in three_number_expressions(n)) for n, t in problems)


def countdown_chance(config: str = "conf/erils_countdown.yaml") -> float:
    """:func:`expression_chance` on the test split of the task that ``config`` (a fit overlay) sets."""
    import yaml

    from lit_rl.tasks import CountdownTask

    args = yaml.safe_load(Path(config).read_text())["data"]["init_args"]["task"]["init_args"]
    return expression_chance(CountdownTask(**{**args, "num_train": 0}).test_problems())


def build(out: Path, seeds: Sequence[int], times: dict[str, float], quick: bool = False,
          task: str = "sudoku", plan: StudyPlan | None = None) -> dict[str, Any]:
    """Write the report of the study on ``task`` (its plan, :data:`lit_rl.reproduce.erils.PLANS`, or ``plan``) into
    ``out`` from ``out/mlflow.db``; returns the summary (also ``summary.json``). The plan's ``report`` block gives
    the wording: ``task``, ``title``, ``measure``, ``eval_set``, ``recipe`` (the overlay the budget names; Countdown's
    test split gives the chance line) and ``base_lr`` (the main runs' learning rate)."""
    from lit_rl.reproduce.erils import study_plan

    plan = plan or study_plan(task)
    setup = {"task": task, "title": f"ERILS study ({plan.path})", "measure": "accuracy", "eval_set": "the eval set",
             "recipe": plan.path, "base_lr": None, **plan.report}  # a plan's report block, or plain defaults
    task = setup["task"]
    experiment, methods = plan.experiment, plan.stems("main")  # main runs are <stem>_s<seed>
    metric = plan.metric
    chance = CHANCE if task == "sudoku" else countdown_chance(setup["recipe"]) if task == "countdown" else float("nan")
    pass_at = [f"val/{task}/multi/pass_at_{k}" for k in range(1, 5)]

    if not (out / "mlflow.db").exists():
        raise FileNotFoundError(f"{out / 'mlflow.db'}: no runs to report yet (run without --report_only first)")
    runs = load_runs(f"sqlite:///{(out / 'mlflow.db').resolve()}", experiments=[experiment])
    jobs = latest_finished([r for r in runs if r.tags.get("lit_rl.reproduce") == "erils"
                            and r.tags.get("task", "sudoku") == task], "lit_rl.job")
    main = {m: [jobs[f"{m}_s{s}"] for s in seeds if f"{m}_s{s}" in jobs] for m in methods}
    main = {m: rs for m, rs in main.items() if rs}
    threads = [r for n, r in jobs.items() if r.tags.get("group") == "threads"]
    uncontrolled = [r for n, r in jobs.items() if r.tags.get("group") == "length"]
    summary: dict[str, Any] = {"task": task, "metric": metric, "chance": chance, "seeds": list(seeds), "main": {},
                               "times_s": times}
    budget = ("a few steps (`--quick`: a smoke run of the pipeline, not `conf/erils.yaml`'s budget; the "
              "numbers below say nothing about the methods)" if quick else
              "`conf/erils.yaml`'s budget (same updates, rollout batches, warm start)")
    budget = budget.replace("`conf/erils.yaml`'s", f"`conf/erils.yaml` + `{setup['recipe']}`'s")
    md = [f"# {setup['title']}"
          f"{' (quick mode: a smoke run, its numbers mean nothing)' if quick else ''}", "",
          f"{setup['measure'].capitalize()} = `{metric}` on {setup['eval_set']} (chance {chance:.3g}). Every "
          f"variant runs {budget}. Seeds: {', '.join(map(str, seeds))}.", ""]

    # 1. equal budget
    md += ["## Equal budget", "",
           "| method | start | final (mean ± std) | min-max | last 3 evaluations (mean ± std) "
           "| pass@1 / pass@4 (T 0.9, 64 test problems) "
           "| on-policy reward, first → last 5 batches | on-policy length (last 5) | wall time / run |",
           "|---|---|---|---|---|---|---|---|---|"] if main else [
               "(No main-comparison run has finished here: `--only` ran other groups; the sections below are theirs.)",
               ""]
    for m, rs in main.items():
        start = _stats([r.series(metric)[0][1] for r in rs if r.series(metric)])
        final = _stats([_last(r, metric) for r in rs])
        last3 = _mean_of(rs, metric, "last", k=3)  # a noisy curve's level, less its last point's luck
        p1 = _stats([_last(r, pass_at[0]) for r in rs])
        p4 = _stats([_last(r, pass_at[3]) for r in rs])
        r0 = _mean_of(rs, "train/on_policy/reward_mean", "first")
        r1 = _mean_of(rs, "train/on_policy/reward_mean", "last")
        ln = _mean_of(rs, "train/on_policy/length_mean", "last")
        secs = _stats([times.get(f"{m}_s{s}") for s in seeds])
        summary["main"][m] = {"start": start, "final": final, "last3": last3, "pass_at_1": p1, "pass_at_4": p4,
                              "on_policy_reward_first": r0, "on_policy_reward_last": r1, "on_policy_length": ln,
                              "seconds": secs, "runs": len(rs)}
        reward = f"{_f(r0['mean'])} → {_f(r1['mean'])}" if r0["n"] else "(no on-policy rollouts)"
        md.append(f"| {LABELS.get(m, m)} | {_f(start['mean'])} | **{_f(final['mean'])}** ± {_f(final['std'])} | "
                  f"{_f(final['min'])}-{_f(final['max'])} | {_f(last3['mean'])} ± {_f(last3['std'])} | "
                  f"{_f(p1['mean'])} / {_f(p4['mean'])} | {reward} | "
                  f"{_f(ln['mean'], 1) if ln['n'] else '-'} | {_f(secs['mean'], 0)} s |")
    if "erils" in main:
        for other in ("spg", "joint", "external_only", "sft"):
            if other in main:
                gap = summary["main"]["erils"]["final"]["mean"] - summary["main"][other]["final"]["mean"]
                summary["main"][other]["erils_minus_this"] = gap
        md += ["", "ERILS minus each baseline (final, mean over seeds): " + ", ".join(
            f"{LABELS.get(o, o)} {summary['main'][o]['erils_minus_this']:+.3f}" for o in main
            if "erils_minus_this" in summary["main"][o]) + "."]
    if main:
        _plot_curves(main, metric, out / "curves.png",
                     {f"{LABELS.get(r.tags.get('method', ''), r.name)}, uncontrolled pool": [r] for r in uncontrolled},
                     chance, f"{setup['measure']} ({setup['eval_set']})")
        _plot_diagnostics(main, out / "diagnostics.png", pass_at)
        md += ["", "![curves](curves.png)", "", "Per-source diagnostics (mean over seeds): why a run learns or "
               "stalls.", "", "![diagnostics](diagnostics.png)", ""]

    capacity = [r for r in jobs.values() if r.tags.get("group") == "capacity"]
    if capacity:
        c = capacity[-1]
        pts = c.series(metric)
        summary["capacity"] = {"final": _last(c, metric), "curve": pts}
        md += ["## Capacity check (not a comparison)", "",
               "Masked-denoising SFT on the pool (32 prompts × their first usable row per update, one update per "
               "batch, 900 updates, every row whatever its reward): can the tiny model learn the task from the pool at "
               "all? Greedy accuracy at updates "
               + ", ".join(f"{s + 1}: {_f(v)}" for s, v in pts[1:]) + f" (start {_f(pts[0][1]) if pts else '-'}).", ""]

    # 2. spread
    erils_runs = [*main.get("erils", []), *threads]
    if erils_runs:
        md += ["## Spread of ERILS over seeds and thread counts", "",
               "| run | seed | threads | final | best | wall time |", "|---|---|---|---|---|---|"]
        for r in erils_runs:
            s = r.series(metric)
            md.append(f"| {r.name} | {r.tags.get('seed')} | {r.tags.get('threads')} | {_f(_last(r, metric))} | "
                      f"{_f(max(v for _, v in s) if s else None)} | {_f(times.get(r.name), 0)} s |")
        spread = _stats([_last(r, metric) for r in erils_runs])
        summary["erils_spread"] = spread
        same = {}
        for r in threads:  # does the thread count change the run? (reduction order may or may not change)
            twin = jobs.get(f"erils_s{r.tags.get('seed')}")
            if twin is not None:
                same[r.name] = twin.series(metric) == r.series(metric)
        summary["threads_identical"] = same
        if quick:
            note = "(Quick mode: too few steps to say whether the thread count changes the run.)"
        elif same and all(same.values()):
            note = ("At 1 and 2 threads the curves are identical on this machine: the spread here is the seeds'. "
                    "Another CPU or library build may still round differently: compare spreads, not digits.")
        else:
            note = ("The thread count changed the run (floating-point reduction order), so a second machine gives a "
                    "different run of the same recipe, not the same numbers.")
        md += ["", f"All {spread['n']} ERILS runs: {_f(spread['mean'])} ± {_f(spread['std'])} "
               f"(min {_f(spread['min'])}, max {_f(spread['max'])}). {note}", ""]

    # 3. length control
    if uncontrolled:
        md += ["## Length-controlled vs uncontrolled external rollouts (ERILS Fig. 1(b) / Fig. 4)", "",
               "The uncontrolled pool restates the puzzle and checks the grid column by column (69 tokens, longer "
               "than the policy's L_gen of 48); the controlled pool writes the grid once (37 tokens). Same answers, "
               "same error draws, same warm start (the grid format), first seed: only the pool differs. Fig. 4 "
               "trains external-only on each pool; ERILS on each pool is the extra row.", "",
               "| method | external pool | final greedy | on-policy length (last 5) "
               "| on-policy hits L_gen without EOS (last 5) | format rate (last 5) |",
               "|---|---|---|---|---|---|"]
        summary["length_control"] = {}
        for method in ("external_only", "erils"):
            rows = {"length-controlled (grid, 37 tokens)": jobs.get(f"{method}_s{seeds[0]}"),
                    "uncontrolled (grid_verbose, 69 tokens)": jobs.get(f"{method}_uncontrolled_s{seeds[0]}")}
            for pool, r in rows.items():
                if r is None:
                    continue
                stats = {"final": _stats([_last(r, metric)]), "length": _mean_of([r], "train/on_policy/length_mean"),
                         "hit_limit": _mean_of([r], "train/on_policy/hit_limit_frac"),
                         "format_rate": _mean_of([r], "train/on_policy/format_rate")}
                summary["length_control"][f"{method}: {pool}"] = stats
                md.append(f"| {LABELS.get(method, method)} | {pool} | {_f(stats['final']['mean'])} | "
                          f"{_f(stats['length']['mean'], 1)} | {_f(stats['hit_limit']['mean'])} | "
                          f"{_f(stats['format_rate']['mean'])} |")
        spg = jobs.get(f"spg_s{seeds[0]}")
        if spg is not None:
            md.append(f"| {LABELS['spg']} (reference) | none | {_f(_last(spg, metric))} | | | |")
        md.append("")
    # 4. SPG's failure mode across learning rates (the main runs are the config's rate)
    lr_runs = [r for r in jobs.values() if r.tags.get("group") == "spg_lr"]
    if lr_runs:
        md += ["## SPG's failure mode across learning rates", "",
               "SPG and ERILS at the same settings, first seed, at the embedded learning rate (the main runs) and "
               "below it. Collapses: greedy accuracy ends below 0.05, under chance; degrades: more than 0.1 below its "
               "start; stays low: within 0.1 of its start; learns: more than 0.1 above its start. The format rate "
               "counts rollouts with an `<answer>` tag, which a degenerate policy that repeats tags still has.", "",
               "| method | lr | final greedy | best | on-policy reward, first → last 5 | format rate (last 5) "
               "| on-policy length (last 5) | reading |", "|---|---|---|---|---|---|---|---|"]
        summary["spg_lr"] = {}
        rows = [(m, float(setup["base_lr"]), jobs.get(f"{m}_s{seeds[0]}")) for m in ("spg", "erils")
                if setup["base_lr"] is not None]
        rows += [(r.tags.get("method"), float(r.tags.get("lr", "nan")), r) for r in lr_runs]
        for method, lr, r in sorted((x for x in rows if x[2] is not None), key=lambda x: (x[0] != "spg", -x[1])):
            s = r.series(metric)
            final, best = _last(r, metric), (max(v for _, v in s) if s else None)
            fmt = _mean_of([r], "train/on_policy/format_rate")
            r0, r1 = _mean_of([r], "train/on_policy/reward_mean", "first"), _mean_of([r], "train/on_policy/reward_mean")
            ln = _mean_of([r], "train/on_policy/length_mean")
            reading = _failure_reading(final, fmt["mean"] if fmt["n"] else None, s[0][1] if s else None)
            summary["spg_lr"][f"{method}@{lr:g}"] = {"final": final, "best": best, "format_rate": fmt,
                                                     "reward_first": r0, "reward_last": r1, "length": ln,
                                                     "reading": reading}
            md.append(f"| {LABELS.get(method, method)} | {lr:g} | {_f(final)} | {_f(best)} | {_f(r0['mean'])} → "
                      f"{_f(r1['mean'])} | {_f(fmt['mean'])} | {_f(ln['mean'], 1)} | {reading} |")
        md.append("")

    # 5. Table XI's protocol: three generation lengths, deterministic, every final checkpoint
    from lit_rl.reproduce.lengths import lengths_rows
    run_dirs = out / "runs"
    groups = {LABELS.get(m, m): [run_dirs / f"{m}_s{s}" for s in seeds] for m in methods}
    groups.update({f"{LABELS.get(r.tags.get('method'), r.name)}, lr {r.tags.get('lr')}": [run_dirs / r.name]
                   for r in lr_runs})
    lines, by_length = lengths_rows(groups)
    if lines:
        summary["lengths"] = by_length
        md += ["## Table XI's protocol: three generation lengths", "",
               "Each final checkpoint decoded deterministically (T 0, one completion, L_gen/2 steps, block 16) on all "
               "256 puzzles at L_gen 48 / 96 / 192 (`conf/eval/erils_lengths.yaml`; the paper: 128 / 256 / 512 with a "
               "training length of 256, so 48 / 96 / 192 are 1x / 2x / 4x the embedded training length). Greedy cell "
               "accuracy, mean ± std over seeds.", "", *lines, ""]
    total = sum(v for v in times.values() if v)
    md += [f"Total job time: {total / 60:.1f} min (sum over jobs; two run at once by default)."]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    keys = [metric, *(k for k, _ in DIAGNOSTICS), *pass_at]
    curves = {name: {k: [[s, v] for s, v in r.series(k)] for k in keys if r.series(k)} for name, r in jobs.items()}
    atomic_write_text(out / "curves.json", json.dumps(curves, indent=0) + "\n")
    return summary
