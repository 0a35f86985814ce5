"""``python -m lit_rl reproduce <study>``: run a study's jobs and write its report.

Studies:

* ``erils``: ERILS vs on-policy-only SPG, joint processing, external-only and SFT on the embedded Sudoku
  default at equal budget, seeds and thread counts as bands, length-controlled vs uncontrolled external
  rollouts (:mod:`lit_rl.reproduce.erils`); ``--task countdown``: the main comparison, the thread spread and
  the capacity check on miniature Countdown, with the pool a real external model wrote.
* ``double-rollout``: DR vs GRPO vs GRPO-large on the chain-sum testbed with seeds, ρ / N sweeps, the
  length bonus vs the Arora-Zanette penalty, the reliability table (:mod:`lit_rl.reproduce.dr`);
  ``--testbed guess``: the same comparison where its premise holds (lucky guesses on the starting model), with
  the ρ / N trends over every seed, the premise statistics and the reliability study in the paper's protocol.

Each study's jobs are a plan file (``conf/reproduce/*.yaml``, :mod:`lit_rl.reproduce.plan_file`): fit configs plus
training-config overlays; ``--plan FILE`` runs your own plan of a study (its report reads the plan's groups).

``--quick`` runs every job for a few steps (a smoke test of the whole pipeline, minutes on 2 cores; its
numbers mean nothing). Re-running the same command skips the jobs that finished (``done.json``).
The last line printed is a JSON summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lit_rl.cli_args import LitArgumentParser

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = LitArgumentParser(
        prog="python -m lit_rl reproduce", description=__doc__.split("\n\n")[0],
        epilog="example:\n  python -m lit_rl reproduce erils --workers 2\n"
               "  python -m lit_rl reproduce erils --task countdown\n"
               "  python -m lit_rl reproduce double-rollout --workers 2\n"
               "  python -m lit_rl reproduce double-rollout --testbed guess\n"
               "  python -m lit_rl reproduce double-rollout --quick --out /tmp/dr_quick\n"
               "  python -m lit_rl reproduce erils --plan my_plan.yaml --out runs/reproduce/mine",
    )
    parser.add_argument("study", choices=["erils", "double-rollout"])
    parser.add_argument("--task", default="sudoku", choices=["sudoku", "countdown"],
                        help="erils: the embedded Sudoku default, or miniature Countdown with the pool a real external "
                             "model wrote (main comparison, thread spread, capacity check; default sudoku)")
    parser.add_argument("--testbed", default="chainsum", choices=["chainsum", "guess"],
                        help="double-rollout: the plain chain sums, or the guessable-answer testbed (default chainsum)")
    parser.add_argument("--plan", default=None, metavar="FILE",
                        help="a plan file of the study (default: conf/reproduce/<study>[_<testbed>|_<task>].yaml; "
                             "its keys: docs/configuration.md, Study plans)")
    parser.add_argument("--out", default=None,
                        help="output folder (default runs/reproduce/<study>[_<testbed>|_<task>][_quick]; with --plan, "
                             "runs/reproduce/<plan file's name>[_quick])")
    parser.add_argument("--quick", action="store_true", help="a few steps per job: checks the pipeline, not the method")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seeds of the main comparison (default 0 1 2; quick: 0)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once (default 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per job (default: 2 // workers, at least 1)")
    parser.add_argument("--report_only", action="store_true", help="only (re)write the report from finished jobs")
    parser.add_argument("--only", nargs="+", default=None, metavar="GROUP",
                        help="run only these job groups (the plan's groups; erils: main threads length capacity "
                             "spg_lr lengths); the report covers what has finished")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.testbed != "chainsum" and args.study != "double-rollout":
        parser.error(f"--testbed {args.testbed}: only the double-rollout study has testbeds")
    if args.task != "sudoku" and args.study != "erils":
        parser.error(f"--task {args.task}: only the erils study has tasks")

    from lit_rl.errors import ConfigError
    from lit_rl.reproduce import dr, dr_report, erils, erils_report
    from lit_rl.reproduce.plan_file import load_plan
    from lit_rl.reproduce.plan_jobs import check_jobs, expand
    from lit_rl.reproduce.runner import init_stores, jobs_to_run, run_jobs, seconds_of

    study, report = (erils, erils_report) if args.study == "erils" else (dr, dr_report)

    suffix = "".join(f"_{v}" for v, default in ((args.testbed, "chainsum"), (args.task, "sudoku")) if v != default)
    name = Path(args.plan).stem if args.plan else f"{args.study.replace('-', '_')}{suffix}"
    out = Path(args.out or f"runs/reproduce/{name}{'_quick' if args.quick else ''}")
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    threads = args.threads or max(1, 2 // args.workers)
    extra = {"testbed": args.testbed} if args.study == "double-rollout" else {"task": args.task}
    try:
        study_plan = load_plan(args.plan) if args.plan else study.study_plan(**extra)
        if study_plan.study != args.study:
            raise ConfigError(f"{study_plan.path}: study: the plan is of the {study_plan.study} study, not "
                              f"{args.study}")
        plan = expand(study_plan, out, seeds, args.quick, args.workers, threads, write=False)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    evals = list(getattr(plan, "eval_jobs", []))
    if args.only:
        groups = {j.tags.get("group") for j in [*plan.jobs, *evals]}
        unknown = sorted(set(args.only) - groups)
        if unknown:
            parser.error(f"--only: no job group {', '.join(map(repr, unknown))} in the {args.study} plan "
                         f"(groups: {', '.join(sorted(g for g in groups if g))})")
        plan.jobs = [j for j in plan.jobs if j.tags.get("group") in args.only]
        evals = [j for j in evals if j.tags.get("group") in args.only]
    failed: list[str] = []
    if not args.report_only:
        try:  # every job's command line as `fit` checks it, before anything runs or is written
            check_jobs([j for j in plan.jobs if not j.is_done()])
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        init_stores(out, study_plan.experiment)
        # the first job alone: it builds the warm-start cache that every other job then loads
        first, rest = (plan.jobs[:1], plan.jobs[1:]) if plan.first_alone else ([], plan.jobs)
        for job in first if plan.boost_first else []:  # alone, it may use every thread the workers would share
            job.argv = [f"--threads={threads * args.workers}" if a.startswith("--threads=") else a for a in job.argv]
        # an evaluation counts if the fit it reads runs now or finished before
        evals = [j for j in evals if j.after is None or j.after in plan.jobs or j.after.is_done()]
        total, before = jobs_to_run([*plan.jobs, *evals]), jobs_to_run(first)
        results = run_jobs(first, workers=1, threads=threads, total=total)
        results += run_jobs(rest, workers=args.workers, threads=threads, numbered_from=before, total=total)
        # evaluations of finished fits' checkpoints, after every fit (a fit that failed has none to read)
        ready = [j for j in evals if j.after is None or j.after.is_done()]
        results += run_jobs(ready, workers=args.workers, threads=threads, numbered_from=total - jobs_to_run(ready),
                            total=total)
        failed = [r.name for r in results if not r.ok]
    times = {j.name: seconds_of(j.folder) for j in plan.jobs}
    try:
        summary = report.build(out, seeds, {k: v for k, v in times.items() if v is not None}, quick=args.quick,
                               plan=study_plan, **extra)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[reproduce] report: {out / 'report.md'}")
    if failed:
        print(f"[reproduce] {len(failed)} job(s) failed: {', '.join(failed)} (logs under {out})", file=sys.stderr)
    print(json.dumps({"study": args.study, "out": str(out), "failed": failed,
                      "main": {m: v["final"]["mean"] for m, v in summary["main"].items()}}))
    return 1 if failed else 0
