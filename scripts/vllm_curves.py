"""GRPO on the chain-sum testbed with HF rollouts and with vLLM rollouts, same seeds: do the two backends learn
alike? (docs/vllm.md). Run in the vLLM environment (both backends then share one transformers):

    .venv-vllm/bin/python scripts/vllm_curves.py [--seeds 0 1 2] [--out runs/vllm_curves] [--quick]

Each run is ``python -m lit_rl fit --config conf/double_rollout.yaml --config conf/double_rollout_chainsum.yaml
--config conf/grpo_chainsum.yaml``
(+ ``--config conf/vllm/chainsum.yaml`` for vLLM), with the seeds of ``reproduce double-rollout`` (a seed moves the
prompt order, the rollout noise and the module's draws), one after another; finished runs are skipped on a re-run.
The two samplers draw different noise, so the curves are compared as distributions over seeds, not step by step.
Writes ``<out>/report.md``, ``<out>/curves.png`` and, last on stdout, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.atomic import atomic_savefig, atomic_write_text  # noqa: E402
from lit_rl.report import load_runs  # noqa: E402
from lit_rl.reproduce.dr import GREEDY, METRIC  # noqa: E402
from lit_rl.reproduce.plan_file import load_plan  # noqa: E402
from lit_rl.reproduce.plan_jobs import expand  # noqa: E402
from lit_rl.reproduce.runner import init_stores, run_jobs, seconds_of  # noqa: E402

PLAN = ROOT / "conf" / "reproduce" / "vllm_curves.yaml"
EXPERIMENT = load_plan(PLAN).experiment
BACKENDS = ("hf", "vllm")


def jobs(out: Path, seeds: list[int], quick: bool, cache: str):
    """The plan's jobs (conf/reproduce/vllm_curves.yaml), run one at a time with 2 threads each."""
    return expand(load_plan(PLAN), out, seeds, quick, workers=1, threads=2, cache_dir=cache).jobs


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def report(out: Path, seeds: list[int], quick: bool) -> dict:
    runs = {r.tags.get("lit_rl.job"): r for r in load_runs(f"sqlite:///{(out / 'mlflow.db').resolve()}",
                                                            experiments=[EXPERIMENT])
            if r.status == "FINISHED"}
    summary: dict = {"metric": METRIC, "seeds": seeds, "backends": {}}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    quick_note = " (quick mode: a smoke run, its numbers mean nothing)" if quick else ""
    md = [f"# GRPO on chain sums: HF vs vLLM rollouts{quick_note}",
          "", f"Held-out accuracy `{METRIC}` (T 1, 4 samples on 128 problems) and `{GREEDY}` (256 problems); "
          f"seeds {', '.join(map(str, seeds))}; configs: conf/double_rollout.yaml + "
          "conf/double_rollout_chainsum.yaml + conf/grpo_chainsum.yaml + "
          "conf/vllm/chainsum.yaml (vLLM) and the same "
          "without the last (HF).", "",
          "| backend | start | final (mean ± std) | per seed | greedy final | best | rollout s / run | wall s / run |",
          "|---|---|---|---|---|---|---|---|"]
    for i, backend in enumerate(BACKENDS):
        rs = [runs[f"grpo_{backend}_s{s}"] for s in seeds if f"grpo_{backend}_s{s}" in runs]
        if not rs:
            continue
        finals = [r.series(METRIC)[-1][1] for r in rs]
        starts = [r.series(METRIC)[0][1] for r in rs]
        greedy = [r.series(GREEDY)[-1][1] for r in rs if r.series(GREEDY)]
        best = [max(v for _, v in r.series(METRIC)) for r in rs]
        gen = [sum(v for _, v in r.series("time/stage1_s")) for r in rs]
        wall = [seconds_of(out / "runs" / f"grpo_{backend}_s{s}") or 0.0 for s in seeds]
        f_m, f_s = _mean_std(finals)
        summary["backends"][backend] = {
            "final_mean": f_m, "final_std": f_s, "finals": finals, "start_mean": statistics.fmean(starts),
            "greedy_final_mean": statistics.fmean(greedy) if greedy else None, "best_mean": statistics.fmean(best),
            "rollout_s_mean": statistics.fmean(gen), "wall_s_mean": statistics.fmean(wall)}
        md.append(f"| {backend} | {statistics.fmean(starts):.3f} | {f_m:.3f} ± {f_s:.3f} | "
                  f"{' / '.join(f'{v:.3f}' for v in finals)} | "
                  f"{statistics.fmean(greedy) if greedy else float('nan'):.3f} | {statistics.fmean(best):.3f} | "
                  f"{statistics.fmean(gen):.0f} | {statistics.fmean(wall):.0f} |")
        for ax, metric in zip(axes, (METRIC, GREEDY)):
            steps = sorted({s for r in rs for s, _ in r.series(metric)})
            per = [[dict(r.series(metric)).get(s) for r in rs] for s in steps]
            mean = [statistics.fmean([v for v in p if v is not None]) for p in per]
            lo = [min(v for v in p if v is not None) for p in per]
            hi = [max(v for v in p if v is not None) for p in per]
            ax.plot(steps, mean, color=f"C{i}", marker="o", ms=3, label=f"{backend} (mean of {len(rs)} seeds)")
            ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2)
            ax.set_title(metric, fontsize=9)
            ax.set_xlabel("optimizer step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("GRPO on chain sums: HF vs vLLM rollouts (band: min-max over seeds)")
    fig.tight_layout()
    atomic_savefig(fig, out / "curves.png", dpi=110)
    plt.close(fig)
    hf, vl = summary["backends"].get("hf"), summary["backends"].get("vllm")
    if hf and vl:
        gap = vl["final_mean"] - hf["final_mean"]
        spread = max(hf["final_std"], vl["final_std"])
        summary["final_gap"] = gap
        md += ["", f"Final gap (vLLM − HF): {gap:+.3f}; the larger seed std is {spread:.3f}."]
    md += ["", "![curves](curves.png)", ""]
    atomic_write_text(out / "report.md", "\n".join(md))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "vllm_curves")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "cache"), help="warm-start cache (shared by all runs)")
    ap.add_argument("--quick", action="store_true", help="a few steps of each run (a smoke test)")
    ap.add_argument("--report_only", action="store_true")
    args = ap.parse_args(argv)
    args.out, args.cache = args.out.resolve(), str(Path(args.cache).resolve())
    os.chdir(ROOT)  # the plan's config paths are relative to the repository
    init_stores(args.out, EXPERIMENT)
    if not args.report_only:
        results = run_jobs(jobs(args.out, args.seeds, args.quick, args.cache), workers=1, threads=2)
        failed = [r.name for r in results if not r.ok]
        if failed:
            print(f"vllm_curves: failed runs {failed}; see their log files", file=sys.stderr)
            return 1
    summary = report(args.out, args.seeds, args.quick)
    print(f"vllm_curves: {args.out / 'report.md'}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
