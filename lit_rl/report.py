"""``python -m lit_rl report``: compare runs from an MLflow store as PNGs and a Markdown table.

Select runs by experiment, tags, a raw MLflow filter, or a sweep (``--study``), then render into ``--out``:

* ``learning_curves.png``  one panel per curve metric (default the greedy accuracy, Pass@1 and the on-policy
  reward), one line per run labelled by variant: ERILS vs on-policy SPG vs joint (ERILS paper, Fig. 1);
* ``per_source.png``       ``train/<source>/{reward_mean, advantage_mean, length_mean}`` (one panel per
  statistic; colour = run, line style = rollout source: on-policy vs external; ERILS Fig. 12);
* ``pareto.png``           accuracy vs tokens per problem, one point per run, the Pareto front joined
  (double-rollout Fig. 3; ``--pareto_x/--pareto_y`` name the metrics);
* ``sweep_<study>.png``    per sweep: the objective vs each searched parameter, marker by trial state;
* ``report.md``            a table of the final and best value (and its step) of every table metric per
  run, the sweeps' best trials, and the figures.

Everything is also logged as artifacts (``report/``) of a run tagged ``lit_rl.role=report`` (or of
``--log_run_id``). Metric names may be written as logged by Lightning (``pass@1``): MLflow stores them as
``pass_at_1``. "Best" is the maximum, or the minimum for metrics matching ``--minimize`` (default ``loss``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.cli_args import LitArgumentParser
from lit_rl.errors import one_line
from lit_rl.tracking import get_or_create_experiment

__all__ = ["RunData", "ReportSpec", "build_report", "draw_pareto", "load_runs", "main", "mean_std", "pareto_front",
           "runs_with_wall"]

DEFAULT_CURVES = ("val/sudoku/greedy/accuracy", "val/sudoku/det64/pass@1", "train/on_policy/reward_mean")
SOURCE_STATS = ("reward_mean", "advantage_mean", "length_mean")
_SOURCE_RE = re.compile(r"^train/([^/]+)/(" + "|".join(SOURCE_STATS) + r")$")
_STYLES = ("-", "--", ":", "-.")


def mlflow_name(metric: str) -> str:
    """MLflow accepts only ``[/\\w.\\- :]`` in metric names: ``pass@1`` → ``pass_at_1``."""
    return re.sub(r"[^/\w.\- :]", "_", metric.replace("@", "_at_"))


@dataclass
class RunData:
    """One MLflow run with the metric histories the report needs (``history[key] = [(step, value), ...]``)."""

    run_id: str
    name: str
    label: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    final: dict[str, float]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def series(self, metric: str) -> list[tuple[int, float]]:
        return self.history.get(mlflow_name(metric), [])


@dataclass
class ReportSpec:
    """What to draw.

    Args:
        curves: metrics drawn as learning curves (one panel each; missing ones are skipped).
        table_metrics: metrics in the Markdown table (default: curves + Pareto axes + every
            ``train/<source>/<stat>`` present).
        pareto_x: the cost axis of the Pareto plot (tokens per problem).
        pareto_y: the quality axis of the Pareto plot (accuracy).
        minimize: regular expressions of metrics where lower is better.
        label: how a run is labelled: ``name`` (run name), ``tag:<key>`` or ``param:<key>``.
    """

    curves: Sequence[str] = DEFAULT_CURVES
    table_metrics: Sequence[str] | None = None
    pareto_x: str = "train/tokens_per_problem"
    pareto_y: str = "val/sudoku/greedy/accuracy"
    minimize: Sequence[str] = ("loss",)
    label: str = "name"

    def lower_is_better(self, metric: str) -> bool:
        return any(re.search(p, metric) for p in self.minimize)


# ------------------------------------------------------------------------------------------ loading


def _label(run, how: str) -> str:
    if how.startswith("tag:"):
        return run.data.tags.get(how[4:], run.info.run_name or run.info.run_id[:8])
    if how.startswith("param:"):
        return f"{how[6:].rsplit('.', 1)[-1]}={run.data.params.get(how[6:], '?')}"
    return run.info.run_name or run.info.run_id[:8]


def load_runs(
    tracking_uri: str,
    experiments: Sequence[str] | None = None,
    tags: dict[str, str] | None = None,
    study: str | None = None,
    filter_string: str | None = None,
    run_ids: Sequence[str] | None = None,
    label: str = "name",
    history_keys: Iterable[str] | None = None,
) -> list[RunData]:
    """Runs matching every given selector (report runs and sweep parent runs excluded), oldest first.

    ``history_keys``: metric names whose full history is fetched (default: every metric of the run).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if run_ids:
        runs = [client.get_run(r) for r in run_ids]
    else:
        if experiments:
            exps = [client.get_experiment_by_name(n) for n in experiments]
            missing = [n for n, e in zip(experiments, exps) if e is None]
            if missing:
                raise ValueError(f"no MLflow experiment named {missing} in {tracking_uri}")
        else:
            exps = client.search_experiments()
        clauses = [f"tags.`{k}` = '{v}'" for k, v in (tags or {}).items()]
        if study:
            clauses.append(f"tags.`lit_rl.sweep` = '{study}'")
        if filter_string:
            clauses.append(filter_string)
        runs = client.search_runs(
            [e.experiment_id for e in exps], filter_string=" and ".join(clauses), max_results=5000,
            order_by=["attributes.start_time ASC"]
        )
    wanted = None if history_keys is None else {mlflow_name(k) for k in history_keys}
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        if run.data.tags.get("lit_rl.role") in ("report", "study", "evaluation"):  # not a training variant
            continue
        keys = [k for k in run.data.metrics if wanted is None or k in wanted or _SOURCE_RE.match(k)]
        history = {}
        for key in keys:
            points = client.get_metric_history(run.info.run_id, key)
            history[key] = [(m.step, m.value) for m in sorted(points, key=lambda m: (m.step, m.timestamp))
                            if not (key == "sweep/objective" and math.isnan(m.value))]  # a trial's "no value yet"
        tag = _label(run, label)
        seen[tag] = seen.get(tag, 0) + 1
        if seen[tag] > 1:  # labels name lines and table rows: keep them unique
            tag = f"{tag} #{seen[tag]}"
        out.append(RunData(
            run_id=run.info.run_id, name=run.info.run_name or run.info.run_id[:8], label=tag,
            status=run.info.status, tags=dict(run.data.tags), params=dict(run.data.params),
            final={k: v for k, v in run.data.metrics.items() if not (k == "sweep/objective" and math.isnan(v))},
            history=history,
        ))
    return out


# ------------------------------------------------------------------------------------------ figures



def runs_with_wall(tracking_uri: str, history_keys: Iterable[str], finished_only: bool = True
                   ) -> list[tuple[RunData, float | None]]:
    """The store's runs (:func:`load_runs`, finished ones only unless ``finished_only`` is false), each with its
    wall seconds from MLflow's start and end times (``None`` while it runs): what the study scripts tabulate."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    out = []
    for r in load_runs(tracking_uri, history_keys=history_keys):
        if finished_only and r.status != "FINISHED":
            continue
        info = client.get_run(r.run_id).info
        out.append((r, (info.end_time - info.start_time) / 1000 if info.end_time else None))
    return out


def mean_std(xs: Sequence[float], digits: int = 3) -> str:
    """``mean ± sample std`` of the seeds' values (one value: itself; none: ``–``), for the study tables."""
    if not xs:
        return "–"
    if len(xs) > 1:
        return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"
    return f"{xs[0]:.{digits}f}"

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, n)
    return math.ceil(n / cols), cols


def plot_learning_curves(runs: list[RunData], metrics: Sequence[str], path: Path) -> list[str]:
    """Fig. 1: one panel per metric present in some run, one line per run. Returns the metrics drawn."""
    present = [m for m in metrics if any(r.series(m) for r in runs)]
    if not present:
        return []
    plt = _plt()
    rows, cols = _grid(len(present))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, present):
        for i, run in enumerate(runs):
            pts = run.series(metric)
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o" if len(pts) < 12 else None, ms=3,
                        label=run.label, color=f"C{i % 10}")
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("step (as logged)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Learning curves per variant")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return present


def sources_of(runs: list[RunData]) -> list[str]:
    """Rollout sources: ``<source>`` of every ``train/<source>/reward_mean`` (``train/spg/...`` holds the
    surrogate's statistics, not a source)."""
    found = {m.group(1) for r in runs for k in r.history if (m := _SOURCE_RE.match(k)) and m.group(2) == "reward_mean"}
    order = {"on_policy": 0, "external": 1}
    return sorted(found, key=lambda s: (order.get(s, 2), s))


def plot_per_source(runs: list[RunData], path: Path) -> list[str]:
    """Fig. 12: per-source reward/advantage/length curves. Returns the sources drawn."""
    sources = sources_of(runs)
    if not sources:
        return []
    plt = _plt()
    fig, axes = plt.subplots(1, len(SOURCE_STATS), figsize=(5 * len(SOURCE_STATS), 3.8), squeeze=False)
    for ax, stat in zip(axes[0], SOURCE_STATS):
        for i, run in enumerate(runs):
            for j, src in enumerate(sources):
                pts = run.series(f"train/{src}/{stat}")
                if pts:
                    ax.plot([s for s, _ in pts], [v for _, v in pts], _STYLES[j % len(_STYLES)], color=f"C{i % 10}",
                            label=f"{run.label} · {src}")
        ax.set_title(f"train/<source>/{stat}", fontsize=9)
        ax.set_xlabel("step (as logged)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Per-source statistics (colour: run, line style: rollout source)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return sources


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (lower x = cost, higher y = quality), by increasing x.

    >>> pareto_front([(100, 0.5), (200, 0.4), (300, 0.7), (50, 0.1)])
    [3, 0, 2]
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def draw_pareto(
    rows: Sequence[tuple[str, float, float]], path: Path, xlabel: str, ylabel: str, title: str | None = None,
) -> set[int]:
    """Scatter ``(label, cost, quality)`` points, join the Pareto front, save to ``path``; the front's indices."""
    front = set(pareto_front([(a, b) for _, a, b in rows]))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for i, (label, a, b) in enumerate(rows):
        ax.scatter([a], [b], s=40, color=f"C{i % 10}", edgecolor="black" if i in front else "none", zorder=3)
        ax.annotate(label, (a, b), fontsize=7, xytext=(4, 4), textcoords="offset points")
    fx = sorted(front, key=lambda i: rows[i][1])
    ax.plot([rows[i][1] for i in fx], [rows[i][2] for i in fx], "k--", lw=1, label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return front


def plot_pareto(runs: list[RunData], x: str, y: str, path: Path) -> list[tuple[str, float, float, bool]]:
    """Fig. 3: final accuracy vs tokens per problem (the run's mean over its history), Pareto front joined."""
    rows = []
    for run in runs:
        xs, ys = run.series(x), run.series(y)
        if xs and ys:
            rows.append((run.label, sum(v for _, v in xs) / len(xs), ys[-1][1]))
    if not rows:
        return []
    front = draw_pareto(rows, path, f"{x} (mean over training)", f"{y} (final)", "Accuracy vs tokens per problem")
    return [(label, a, b, i in front) for i, (label, a, b) in enumerate(rows)]


def sweeps_of(runs: list[RunData]) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for run in runs:
        if run.tags.get("lit_rl.role") == "trial":
            out.setdefault(run.tags["lit_rl.sweep"], []).append(run)
    return out


def _num(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


def plot_sweep(study: str, trials: list[RunData], path: Path) -> list[str]:
    """Objective (``sweep/objective``) vs each searched parameter, marker by trial state. Returns params."""
    params = sorted({p for t in trials for p in t.tags.get("lit_rl.space", "").split(",") if p})
    if not params or not any("sweep/objective" in t.final for t in trials):
        return []
    plt = _plt()
    markers = {"COMPLETE": ("o", "C0"), "PRUNED": ("x", "C1"), "FAIL": ("s", "C3")}
    fig, axes = plt.subplots(1, len(params), figsize=(4.5 * len(params), 3.6), squeeze=False)
    for ax, p in zip(axes[0], params):
        for state, (marker, color) in markers.items():
            pts = [(_num(t.params[p]), t.final["sweep/objective"]) for t in trials
                   if t.tags.get("optuna.trial_state") == state and p in t.params and "sweep/objective" in t.final]
            if pts:
                xs = [a for a, _ in pts]
                ax.scatter(xs if all(isinstance(a, float) for a in xs) else [str(a) for a in xs], [b for _, b in pts],
                           marker=marker, color=color, label=state.lower())
        ax.set_xlabel(p.rsplit(".", 1)[-1] + f"\n({p})", fontsize=8)
        ax.set_ylabel("objective")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Sweep {study}: objective vs parameter")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return params


# ------------------------------------------------------------------------------------------ tables


def final_and_best(series: list[tuple[int, float]], lower_is_better: bool) -> tuple[float, float, int] | None:
    """(final value, best value, step of the best) of a metric history; ``None`` if empty."""
    if not series:
        return None
    pick = min if lower_is_better else max
    best_step, best = pick(series, key=lambda sv: sv[1])
    return series[-1][1], best, best_step


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def markdown_table(runs: list[RunData], metrics: Sequence[str], spec: ReportSpec) -> str:
    present = [m for m in metrics if any(r.series(m) for r in runs)]
    head = "| run | status | " + " | ".join(f"{m} final / best (step)" for m in present) + " |"
    lines = [head, "|" + "---|" * (2 + len(present))]
    for run in runs:
        cells = []
        for m in present:
            fb = final_and_best(run.series(m), spec.lower_is_better(m))
            cells.append("–" if fb is None else f"{_fmt(fb[0])} / {_fmt(fb[1])} ({fb[2]})")
        lines.append(f"| {run.label} | {run.status} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ report


def build_report(runs: list[RunData], out: Path, spec: ReportSpec | None = None,
                 title: str = "lit_rl report") -> dict[str, Any]:
    """Write the PNGs and ``report.md`` into ``out``; return what was drawn (figure → contents)."""
    spec = spec or ReportSpec()
    out.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, Any] = {}
    md = [f"# {title}", "", f"{len(runs)} runs: " + ", ".join(f"`{r.label}`" for r in runs), ""]
    if (curves := plot_learning_curves(runs, spec.curves, out / "learning_curves.png")):
        drawn["learning_curves.png"] = curves
        md += ["## Learning curves per variant", "", "![learning curves](learning_curves.png)", ""]
    if (sources := plot_per_source(runs, out / "per_source.png")):
        drawn["per_source.png"] = sources
        md += ["## Per-source reward / advantage / length", "", f"Sources: {', '.join(sources)}.", "",
               "![per source](per_source.png)", ""]
    if (pts := plot_pareto(runs, spec.pareto_x, spec.pareto_y, out / "pareto.png")):
        drawn["pareto.png"] = pts
        md += ["## Accuracy vs tokens per problem", "", "![pareto](pareto.png)", "",
               f"| run | {spec.pareto_x} (mean) | {spec.pareto_y} (final) | on the front |", "|---|---|---|---|"]
        md += [f"| {label} | {_fmt(a)} | {_fmt(b)} | {'yes' if f else ''} |" for label, a, b, f in pts] + [""]
    for study, trials in sweeps_of(runs).items():
        fname = f"sweep_{re.sub(r'[^A-Za-z0-9_.-]', '_', study)}.png"
        params = plot_sweep(study, trials, out / fname)
        scored = [t for t in trials if "sweep/objective" in t.final and t.tags.get("optuna.trial_state") == "COMPLETE"]
        states = [t.tags.get("optuna.trial_state", "?") for t in trials]
        md += [f"## Sweep `{study}`", "", f"{len(trials)} trials: "
               + ", ".join(f"{states.count(s)} {s.lower()}" for s in sorted(set(states))) + ".", ""]
        if params:
            drawn[fname] = params
            md += [f"![sweep {study}]({fname})", ""]
        if scored:
            lower = trials[0].tags.get("optuna.direction") == "minimize"
            best = (min if lower else max)(scored, key=lambda t: t.final["sweep/objective"])
            shown = {k: best.params.get(k) for k in best.tags.get("lit_rl.space", "").split(",")
                     + best.tags.get("lit_rl.derived", "").split(",") if k}
            md += [f"Best: trial {best.tags.get('optuna.trial_number')} objective "
                   f"{_fmt(best.final['sweep/objective'])}, params `{json.dumps(shown)}`.", ""]
    metrics = list(spec.table_metrics) if spec.table_metrics is not None else list(dict.fromkeys(
        [*spec.curves, spec.pareto_y, spec.pareto_x,
         *(f"train/{s}/{t}" for s in sources_of(runs) for t in SOURCE_STATS)]))
    md += ["## Final and best metrics", "", markdown_table(runs, metrics, spec), ""]
    atomic_write_text(out / "report.md", "\n".join(md))
    drawn["report.md"] = metrics
    return drawn


def log_report(tracking_uri: str, out: Path, experiment: str | None = None, run_id: str | None = None) -> str:
    """Log ``out`` as ``report/`` artifacts to ``run_id`` or to a new run tagged ``lit_rl.role=report``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if run_id is None:
        name = experiment or "lit_rl-reports"
        exp_id = get_or_create_experiment(client, name)
        run_id = client.create_run(exp_id, run_name=f"report-{time.strftime('%Y%m%d-%H%M%S')}",
                                   tags={"lit_rl.role": "report"}).info.run_id
        client.log_artifacts(run_id, str(out), artifact_path="report")
        client.set_terminated(run_id, "FINISHED")
    else:
        client.log_artifacts(run_id, str(out), artifact_path="report")
    return run_id


def main(argv: list[str] | None = None) -> int:
    p = LitArgumentParser(prog="python -m lit_rl report", description=__doc__.split("\n\n")[0],
                          epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--tracking_uri", default="sqlite:///runs/mlflow.db", help="the MLflow store (default %(default)s)")
    p.add_argument("--experiment", action="append", default=None, help="experiment name (repeatable; default all)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                   help="only runs with this tag (repeatable)")
    p.add_argument("--study", default=None, help="only the trials of this sweep")
    p.add_argument("--filter", default=None,
                   help="a raw MLflow filter string, e.g. \"attributes.run_name LIKE 'erils%%'\"")
    p.add_argument("--run_id", action="append", default=None, help="explicit runs (repeatable)")
    p.add_argument("--label", default="name", help="run label: name, tag:<key> or param:<key> (default %(default)s)")
    p.add_argument("--curves", nargs="+", default=list(DEFAULT_CURVES), help="learning-curve metrics")
    p.add_argument("--table_metrics", nargs="+", default=None, help="metrics of the Markdown table")
    p.add_argument("--pareto_x", default=ReportSpec.pareto_x, help="tokens-per-problem metric (default %(default)s)")
    p.add_argument("--pareto_y", default=ReportSpec.pareto_y, help="accuracy metric (default %(default)s)")
    p.add_argument("--minimize", nargs="+", default=["loss"], help="regexes of lower-is-better metrics")
    p.add_argument("--out", default="runs/report", help="output folder (default %(default)s)")
    p.add_argument("--title", default="lit_rl report")
    p.add_argument("--no_log", action="store_true", help="do not log the report to MLflow")
    p.add_argument("--log_run_id", default=None, help="log the report to this run instead of a new report run")
    p.add_argument("--log_experiment", default=None,
                   help="experiment of the new report run (default: the first --experiment)")
    a = p.parse_args(argv)
    tags = {}
    for kv in a.tag:
        if "=" not in kv:
            p.error(f"--tag {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        tags[k] = v
    spec = ReportSpec(curves=a.curves, table_metrics=a.table_metrics, pareto_x=a.pareto_x, pareto_y=a.pareto_y,
                      minimize=a.minimize, label=a.label)
    problem = store_problem(a.tracking_uri)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:  # a wrong selector or a broken store is one line (exit 2), not a traceback
        runs = load_runs(a.tracking_uri, a.experiment, tags, a.study, a.filter, a.run_id, a.label)
        if not runs:
            print(no_match(a.tracking_uri, a.experiment, tags, a.study, a.filter), file=sys.stderr)
            return 1
        out = Path(a.out)
        drawn = build_report(runs, out, spec, a.title)
        for name, what in drawn.items():
            print(f"{out / name}: {what}")
        if not a.no_log:
            run_id = log_report(a.tracking_uri, out, a.log_experiment or (a.experiment[0] if a.experiment else None),
                                a.log_run_id)
            print(f"logged to MLflow run {run_id} (artifacts report/)")
    except Exception as e:  # noqa: BLE001 - MLflow / SQLAlchemy / OS errors of the store, a selector that matches no experiment
        if not _store_error(e):
            raise
        first = one_line(e) or type(e).__name__
        print(f"error: MLflow store {a.tracking_uri}: {first}", file=sys.stderr)
        return 2
    return 0


def no_match(tracking_uri: str, experiments: Sequence[str] | None, tags: dict[str, str], study: str | None,
             filter_string: str | None) -> str:
    """The line for selectors that matched no run: which selectors, and what the store does hold (its
    experiments, and its sweeps for ``--study``)."""
    from mlflow.tracking import MlflowClient

    said = [f"--experiment {' '.join(experiments)}" if experiments else "",
            " ".join(f"--tag {k}={v}" for k, v in tags.items()), f"--study {study}" if study else "",
            f"--filter {filter_string!r}" if filter_string else ""]
    line = f"no runs matched {' '.join(x for x in said if x) or 'in the store'} in {tracking_uri}"
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        exps = [e for e in client.search_experiments() if e.name != "Default" or not experiments]
        names = sorted(e.name for e in exps)
        if study:
            runs = client.search_runs([e.experiment_id for e in exps], max_results=5000)
            sweeps = sorted({r.data.tags["lit_rl.sweep"] for r in runs if r.data.tags.get("lit_rl.sweep")})
            line += f"; its sweeps: {', '.join(sweeps[:20]) or 'none'}"
        line += f"; its experiments: {', '.join(names[:20]) or 'none'}"
    except Exception:  # noqa: BLE001 - the hint is a courtesy: the store said nothing more
        pass
    return line


def store_problem(uri: str) -> str | None:
    """Why ``report`` cannot read the store ``uri`` (``None`` if it looks readable). A missing sqlite file is an
    error, not an empty store: MLflow would create the database there."""
    if uri.startswith("file:") or "://" not in uri:  # MLflow's file store: its deprecation notice is a paragraph
        return (f"MLflow tracking URI {uri!r} (--tracking_uri): MLflow 3's file store is not supported; use the "
                "sqlite:/// URI the runs' config names (e.g. sqlite:///runs/mlflow.db) or a server")
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):])
    if not db.is_file():
        return f"no MLflow store at {db} (--tracking_uri {uri}): nothing to report (the runs' config names its store)"
    with open(db, "rb") as fh:
        head = fh.read(16)
    if head != b"SQLite format 3\x00" and (head or db.stat().st_size):
        return f"{db} is not an SQLite database (--tracking_uri {uri})"
    return None


def _store_error(e: BaseException) -> bool:
    """Whether ``e`` is the store's or the selection's fault (printed as one line) rather than lit_rl's."""
    names = {c.__module__.split(".")[0] for c in type(e).__mro__}
    return isinstance(e, (ValueError, OSError)) or bool(names & {"mlflow", "sqlalchemy", "sqlite3"})


if __name__ == "__main__":
    sys.exit(main())
