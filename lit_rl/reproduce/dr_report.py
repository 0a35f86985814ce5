"""The report of ``python -m lit_rl reproduce double-rollout``: figures and tables from its MLflow store.

* ``curves.png``: held-out sampled accuracy (mean and min-max band over seeds) of DR, GRPO and GRPO-large
  against RL steps and against generated rollout tokens (first + second stage: equal compute);
* ``trends.png``: final accuracy against ρ and against N (DR Tables 2-3 in miniature);
* ``pareto.png``: final accuracy against mean completion tokens at evaluation (DR Fig. 3);
* ``report.md`` with the tables, the reliability table of the DR runs (DR Fig. 1-2) and run times;
  ``summary.json`` with the same numbers.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.report import RunData, _plt, draw_pareto, load_runs
from lit_rl.reproduce.dr_guess import premise_section, progress_sections, trend_sections
from lit_rl.reproduce.plan_file import StudyPlan

__all__ = ["build", "cumulative_tokens", "latest_finished", "reliability_rows_of"]

LABELS = {"dr": "double rollout", "grpo": "GRPO", "grpo_large": "GRPO-large",
          "dr_nemo": "double rollout, NeMo-RL advantages", "grpo_nemo": "GRPO, NeMo-RL advantages"}


def latest_finished(runs: Sequence[RunData], key: str) -> dict[str, RunData]:
    """One run per value of tag ``key``: the last FINISHED training run (an interrupted attempt is ignored, and
    so is a ``validate`` of the job's checkpoint, which carries the job's tags: :mod:`lit_rl.eval_runs`)."""
    out: dict[str, RunData] = {}
    for r in runs:  # oldest first
        if key in r.tags and r.status == "FINISHED" and r.tags.get("lit_rl.role") != "evaluation":
            out[r.tags[key]] = r
    return out


def cumulative_tokens(run: RunData, prompts_per_batch: int) -> list[tuple[int, float]]:
    """``(step, generated tokens so far)`` from the per-problem stage-1 and stage-2 token costs (the step as
    logged: the optimizer step, or the rollout batch in runs before the one-step-axis change, :func:`_cost_key`)."""
    s1 = dict(run.series("train/cost/tokens_stage1"))
    s2 = dict(run.series("train/cost/tokens_stage2"))
    total, out = 0.0, []
    for step in sorted(s1):
        total += (s1[step] + s2.get(step, 0.0)) * prompts_per_batch
        out.append((step, total))
    return out


def run_settings(folder: Path) -> tuple[int, int]:
    """``(updates_per_batch, prompts_per_batch)`` from the config Lightning saved in the run folder."""
    import yaml

    files = sorted(folder.rglob("config.yaml"))
    if not files:
        return 2, 4
    cfg = yaml.safe_load(files[0].read_text()) or {}
    model = (cfg.get("model") or {}).get("init_args") or {}
    data = (cfg.get("data") or {}).get("init_args") or {}
    return int(model.get("updates_per_batch", 2)), int(data.get("prompts_per_batch", 4))


def _at(series: list[tuple[int, float]], step: float) -> float | None:
    """The last value at or before ``step``."""
    best = None
    for s, v in series:
        if s <= step:
            best = v
    return best


def _cost_key(run: RunData, step: float, updates_per_batch: int) -> float:
    """Where the token costs of ``run`` stand at optimizer step ``step``. Runs since the one-step-axis change
    log ``train/cost/*`` at the optimizer step (they have a ``train/rollout_batch`` metric): ``step`` itself;
    older runs logged them at the rollout batch: the last batch trained before ``step``."""
    if run.series("train/rollout_batch"):
        return step
    return step / max(updates_per_batch, 1) - 1


def _accuracy_at_tokens(run: RunData, metric: str, budget: float, updates_per_batch: int,
                        prompts_per_batch: int) -> float | None:
    """The last evaluation made before the run had generated ``budget`` rollout tokens (equal compute)."""
    tok = cumulative_tokens(run, prompts_per_batch)
    best = None
    for step, value in run.series(metric):
        spent = _at(tok, _cost_key(run, step, updates_per_batch)) or 0.0
        if spent <= budget * 1.0001:
            best = value
    return best


def _stats(values: list[float]) -> dict[str, float]:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "n": len(vals)}


def _f(v: float | None, d: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"


def _method_curves(runs: dict[str, RunData], metric: str, methods: Sequence[str], seeds: Sequence[int]):
    """``{method: [(step, [value per seed])]}`` on the steps every seed logged."""
    out = {}
    for m in methods:
        per_seed = [dict(runs[f"{m}_s{s}"].series(metric)) for s in seeds if f"{m}_s{s}" in runs]
        if not per_seed:
            continue
        steps = sorted(set.intersection(*(set(p) for p in per_seed)))
        out[m] = [(st, [p[st] for p in per_seed]) for st in steps]
    return out


def _plot_curves(runs, metric, methods, seeds, updates_per_batch, ppb, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    curves = _method_curves(runs, metric, methods, seeds)
    for i, (m, pts) in enumerate(curves.items()):
        xs = [s for s, _ in pts]
        mean = [statistics.fmean(v) for _, v in pts]
        axes[0].plot(xs, mean, marker="o", ms=3, color=f"C{i}", label=f"{LABELS.get(m, m)} ({len(pts[0][1])} seeds)")
        axes[0].fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts], color=f"C{i}", alpha=0.2)
        # equal compute: x = generated rollout tokens up to that optimizer step (mean over seeds)
        seed_runs = [runs[f"{m}_s{s}"] for s in seeds if f"{m}_s{s}" in runs]
        tok = [(r, cumulative_tokens(r, ppb)) for r in seed_runs]
        tx = []
        for s, _ in pts:
            vals = [(_at(t, _cost_key(r, s, updates_per_batch)) or 0.0) for r, t in tok]
            tx.append(statistics.fmean(vals) / 1e3)
        axes[1].plot(tx, mean, marker="o", ms=3, color=f"C{i}", label=LABELS.get(m, m))
        axes[1].fill_between(tx, [min(v) for _, v in pts], [max(v) for _, v in pts], color=f"C{i}", alpha=0.2)
    axes[0].set_xlabel("RL step (optimizer updates)")
    axes[1].set_xlabel("generated rollout tokens (thousands; stage 1 + stage 2)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy (T 1 samples)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("equal RL steps (mean, band = min-max over seeds)", fontsize=9)
    axes[1].set_title("equal rollout compute", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def reliability_rows_of(folder: Path) -> dict[str, list] | None:
    """The raw reliability rows of one DR run: ``reliability_rows.json``, or (runs written before that file
    existed) the ``ContinuationReliability`` state in the run's last checkpoint."""
    files = sorted(folder.rglob("reliability_rows.json"))
    if files:
        return json.loads(files[-1].read_text())
    ckpts = sorted(folder.rglob("last*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not ckpts:
        return None
    import torch

    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False).get("callbacks", {})
    for key, value in state.items():
        if key.startswith("ContinuationReliability"):
            return {k: [x for part in v for x in part] for k, v in value.items()}
    return None


def _reliability(runs: dict[str, RunData], seeds: Sequence[int]) -> tuple[str, list[dict[str, Any]]]:
    """One table from the DR runs' raw rows pooled over seeds (common length bins)."""
    import torch

    from lit_rl.algorithms.dr_reliability import reliability_table, table_markdown

    pooled: dict[str, list] = {}
    for s in seeds:
        run = runs.get(f"dr_s{s}")
        folder = Path(run.tags.get("lit_rl.folder", "")) if run else None
        rows = reliability_rows_of(folder) if folder and folder.is_dir() else None
        for k, v in (rows or {}).items():
            pooled.setdefault(k, []).extend(v)
    if not pooled.get("correct"):
        return "(no double-rollout run with reliability rows)", []
    dtypes = {"correct": torch.bool, "cont_acc": torch.float32, "length": torch.long, "pass_rate": torch.float32}
    table = reliability_table({k: torch.tensor(pooled[k], dtype=dtypes[k]) for k in dtypes})
    return table_markdown(table).rstrip(), table


def _trend_points(runs_by_job, trials, metric, key, main_value, main_job, extra=()):
    """``[(value, final metric)]`` from sweep trials (param ``key``) plus the main run(s)."""
    pts = []
    for t in trials:
        v, ser = t.params.get(key), t.series(metric)
        if v is not None and ser and t.tags.get("optuna.trial_state", "COMPLETE") == "COMPLETE":
            pts.append((float(v), ser[-1][1], t.name))
    for value, job in [(main_value, main_job), *extra]:
        r = runs_by_job.get(job)
        if r and r.series(metric):
            pts.append((float(value), r.series(metric)[-1][1], job))
    return sorted(pts)


def build(out: Path, seeds: Sequence[int], times: dict[str, float], quick: bool = False,
          testbed: str = "chainsum", plan: StudyPlan | None = None) -> dict[str, Any]:
    """Write the report of the study on ``testbed`` (its plan, :data:`lit_rl.reproduce.dr.PLANS`, or ``plan``) into
    ``out`` from ``out/mlflow.db``; returns the summary (also ``summary.json``). The methods are the plan's ``main``
    group (and on the guess testbed its ``nemo`` group), the trends its ``rho`` and ``n`` groups, the Pareto its
    ``length`` group."""
    from lit_rl.reproduce.dr import GREEDY, study_plan

    plan = plan or study_plan(testbed)
    testbed = plan.report.get("testbed", testbed)
    experiment, metric, main_methods = plan.experiment, plan.metric, plan.stems("main")  # runs: <stem>_s<seed>

    if not (out / "mlflow.db").exists():
        raise FileNotFoundError(f"{out / 'mlflow.db'}: no runs to report yet (run without --report_only first)")
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    all_runs = load_runs(uri, experiments=[experiment])
    jobs = latest_finished([r for r in all_runs if r.tags.get("lit_rl.reproduce") == "double-rollout"], "lit_rl.job")
    for name, r in jobs.items():
        r.tags["lit_rl.folder"] = str(out / "runs" / name)
    first = next((jobs[f"{m}_s{s}"] for m in main_methods for s in seeds if f"{m}_s{s}" in jobs), None)
    updates_per_batch, prompts_per_batch = run_settings(Path(first.tags["lit_rl.folder"])) if first else (2, 4)
    trials = {st: [r for r in all_runs if r.tags.get("lit_rl.sweep") == f"reproduce-{st}" and r.status == "FINISHED"]
              for st in ("rho", "n")}
    methods = list(main_methods)
    if testbed == "guess":
        methods += plan.stems("nemo")
    summary: dict[str, Any] = {"metric": metric, "seeds": list(seeds), "main": {}, "trends": {}, "pareto": [],
                               "times_s": times}
    guess = testbed == "guess"
    # a plan on another testbed says what it is (conf/reproduce/real_smollm2.yaml's report block)
    title = plan.report.get("title") or (
        "the guess testbed (guessable answers, lucky guesses)" if guess else "the chain-sum testbed")
    held_out = plan.report.get("metric_text") or (
        f"mean correctness of 4 samples at T 1 on 128 held-out problems; greedy = `{GREEDY}` on 256")
    md = [f"# Double rollout on {title}"
          f"{' (quick mode: a smoke run, its numbers mean nothing)' if quick else ''}", ""]
    md += [f"Held-out accuracy = `{metric}`: {held_out}. Seeds: {', '.join(map(str, seeds))}."
           + (" Every run is a few steps (`--quick`: a smoke run of the pipeline, not the study's budget)."
              if quick else ""), ""]

    if guess:
        md += premise_section(out, jobs, quick, summary)

    # 1. main comparison
    md += ["## DR vs GRPO vs GRPO-large (equal RL steps)", "",
           "| method | start | final (mean ± std) | min-max | best (mean) | at GRPO's token budget | greedy final "
           "| rollout tokens | wall time / run |",
           "|---|---|---|---|---|---|---|---|---|"]
    budget = _stats([cumulative_tokens(jobs[f"grpo_s{s}"], prompts_per_batch)[-1][1] for s in seeds
                     if f"grpo_s{s}" in jobs and cumulative_tokens(jobs[f"grpo_s{s}"], prompts_per_batch)])["mean"]
    for m in methods:
        rs = [jobs[f"{m}_s{s}"] for s in seeds if f"{m}_s{s}" in jobs]
        if not rs:
            continue
        start = _stats([r.series(metric)[0][1] for r in rs if r.series(metric)])
        final = _stats([r.series(metric)[-1][1] for r in rs if r.series(metric)])
        best = _stats([max(v for _, v in r.series(metric)) for r in rs if r.series(metric)])
        greedy = _stats([r.series(GREEDY)[-1][1] for r in rs if r.series(GREEDY)])
        tokens = _stats([cumulative_tokens(r, prompts_per_batch)[-1][1] for r in rs
                         if cumulative_tokens(r, prompts_per_batch)])
        secs = _stats([times.get(f"{m}_s{s}") for s in seeds])
        at_budget = _stats([_accuracy_at_tokens(r, metric, budget, updates_per_batch, prompts_per_batch) for r in rs])
        summary["main"][m] = {"start": start, "final": final, "best": best, "at_grpo_tokens": at_budget,
                              "greedy_final": greedy, "tokens": tokens, "seconds": secs}
        md.append(f"| {LABELS.get(m, m)} | {_f(start['mean'])} | {_f(final['mean'])} ± {_f(final['std'])} | "
                  f"{_f(final['min'])}-{_f(final['max'])} | {_f(best['mean'])} | {_f(at_budget['mean'])} | "
                  f"{_f(greedy['mean'])} | {_f(tokens['mean'] / 1e3, 1)}k | {_f(secs['mean'], 0)} s |")
    if any(f"{m}_s{s}" in jobs for m in methods for s in seeds):
        _plot_curves(jobs, metric, methods, seeds, updates_per_batch, prompts_per_batch, out / "curves.png")
        md += ["", "Rollout tokens: generated tokens of both stages (continuation prefixes are prefilled, not "
               "generated, and not counted). \"At GRPO's token budget\": the last evaluation before the run had "
               "generated as many rollout tokens as GRPO's whole run.", "", "![curves](curves.png)", ""]

    if guess:
        def tokens_at(method: str, step: int) -> float:
            rs = [jobs[f"{method}_s{s}"] for s in seeds if f"{method}_s{s}" in jobs]
            return statistics.fmean(_at(cumulative_tokens(r, prompts_per_batch),
                                        _cost_key(r, step, updates_per_batch)) or 0.0 for r in rs)

        md += progress_sections(out, jobs, _method_curves(jobs, metric, methods, seeds), seeds, quick, summary,
                                tokens_at)

    # 2. reliability
    table, rel_rows = _reliability(jobs, seeds)
    summary["reliability"] = rel_rows
    departure = (" **A departure from the paper's protocol:** pooled over the whole of training (not the starting "
                 "model), difficulty is the group's pass rate (not separate samples), length and difficulty are "
                 "not crossed, and the continuations have the training budget. The paper's protocol is above, "
                 "under the premise.") if guess else ""
    md += ["## Reliability of the continuations (DR Fig. 1-2), pooled over the DR runs", "",
           "Continuation accuracy from the first ρ of correct vs incorrect rollouts, by original length and by "
           "the prompt's pass rate in its group." + departure, "", table, ""]
    if guess:
        md += trend_sections(out, jobs, metric, seeds, summary, plan)
        return _finish(out, md, summary, times)

    if not (plan.entries_of("rho") or plan.entries_of("n") or plan.entries_of("length")):  # the main group only
        return _finish(out, md, summary, times)
    # 3. trends
    md += ["## ρ and N (DR Tables 2-3 in miniature; one seed, final held-out accuracy)", ""]
    s0 = seeds[0]
    rho = _trend_points(jobs, trials["rho"], metric, "model.init_args.double_rollout.rho", 0.9, f"dr_s{s0}")
    n = _trend_points(jobs, trials["n"], metric, "model.init_args.double_rollout.num_continuations", 4, f"dr_s{s0}",
                      extra=[(1, f"grpo_s{s0}")])
    summary["trends"] = {"rho": [(v, y) for v, y, _ in rho], "n": [(v, y) for v, y, _ in n]}
    md += ["| ρ | " + " | ".join(f"{v:g}" for v, _, _ in rho) + " |", "|---|" + "---|" * len(rho),
           "| accuracy | " + " | ".join(_f(y) for _, y, _ in rho) + " |", "",
           "| N | " + " | ".join(f"{v:g}" for v, _, _ in n) + " |", "|---|" + "---|" * len(n),
           "| accuracy | " + " | ".join(_f(y) for _, y, _ in n) + " |", "",
           "N 1 is vanilla GRPO (no second stage).", ""]
    if rho or n:
        plt = _plt()
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for ax, pts, name in ((axes[0], rho, "ρ (share of the trace kept)"), (axes[1], n, "N (continuations)")):
            ax.plot([v for v, _, _ in pts], [y for _, y, _ in pts], marker="o")
            ax.set_xlabel(name)
            ax.set_ylabel("final held-out accuracy")
            ax.grid(alpha=0.3)
        axes[1].set_xscale("log", base=2)
        fig.tight_layout()
        atomic_savefig(fig, out / "trends.png", dpi=110)
        plt.close(fig)
        md += ["![trends](trends.png)", ""]

    # 4. accuracy vs tokens
    length_key = metric.rsplit("/", 1)[0] + "/length_mean"
    pts = []
    wanted = [f"{n}_s{s0}" for n in plan.stems("length")]  # this plan's length runs (not those of an older plan)
    for name, r in sorted(((n, jobs[n]) for n in wanted if n in jobs), key=lambda x: wanted.index(x[0])):
        if r.tags.get("group") == "length":
            acc, ln = r.series(metric), r.series(length_key)
            if acc and ln:
                if not pts:  # the verbose warm start: every length run's first evaluation
                    pts.append(("warm start", ln[0][1], acc[0][1]))
                pts.append((name, ln[-1][1], acc[-1][1]))
    if pts:
        front = draw_pareto(pts, out / "pareto.png", "mean completion tokens at evaluation (final)",
                            "final held-out accuracy")
        summary["pareto"] = [{"run": nm, "tokens": a, "accuracy": b, "front": i in front}
                             for i, (nm, a, b) in enumerate(pts)]
        md += ["## Accuracy vs tokens (DR Fig. 3): length bonus vs Arora-Zanette penalty", "",
               "On the verbose teacher (restatements such as `8+2=10 =10` after half of the steps), so that correct "
               "solutions of one problem differ in length; 64-token completions; one seed. With the plain teacher a "
               "correct trace is one fixed string and both length terms would see z = 0.", "",
               "| run | eval tokens | accuracy | on the front |", "|---|---|---|---|"]
        md += [f"| {nm} | {_f(a, 1)} | {_f(b)} | {'yes' if i in front else ''} |" for i, (nm, a, b) in enumerate(pts)]
        md += ["", "![pareto](pareto.png)", ""]
    return _finish(out, md, summary, times)


def _finish(out: Path, md: list[str], summary: dict[str, Any], times: dict[str, float]) -> dict[str, Any]:
    total = sum(v for v in times.values() if v)
    md += [f"Total job time: {total / 60:.1f} min (sum over jobs; several run at once)."]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    return summary
