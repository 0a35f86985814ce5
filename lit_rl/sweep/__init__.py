"""``python -m lit_rl sweep``: Optuna studies over any training-config key, linked to MLflow.

A sweep YAML (``conf/sweeps/*.yaml``, fields documented on :class:`SweepConfig`) names the base training
configs, the objective (a logged metric name and direction), the sampler, the pruner, the storage and the
search space. Each trial builds a fresh model/trainer with :func:`lit_rl.cli.run_lightning_cli`
(``run=False``) from ``base`` + ``overrides`` + ``--<key>=<value>`` for every sampled and derived
parameter, then calls ``trainer.fit``.

How it departs from a plain ``study.optimize`` loop, and why:

* **Exact trial counts under several workers.** The process that creates the study enqueues ``n_trials``
  WAITING slots (TPE/random: empty slots the sampler fills when a worker pops one; grid: one slot per grid
  point). Workers pop slots atomically in the storage, so two workers on one SQLite file (or PostgreSQL)
  never run more than ``n_trials`` trials and never repeat a grid point; Optuna's ``GridSampler`` picks
  unvisited points at random and can repeat them under concurrency.
* **Crash-safe resume.** Storage is an ``RDBStorage`` (``sqlite:///`` by default, any SQLAlchemy URL) with
  a heartbeat: a RUNNING trial whose process died stops beating, is marked FAIL by the next worker (after
  ``grace_period`` seconds) and re-enqueued with the same parameters by ``RetryFailedTrialCallback`` (up to
  ``max_retry`` times). Its MLflow child run is marked FAILED. ``load_if_exists`` semantics: re-running the
  same command resumes the study.
* **Step-based pruning.** :class:`StepPruningCallback` reports the monitored metric at ``global_step``
  (RL runs are step-based; optuna-integration's ``PyTorchLightningPruningCallback`` reports
  ``current_epoch`` from ``on_validation_end``, which is one value per epoch here). It never raises inside
  ``fit``: it sets ``trainer.should_stop`` (agreed across DDP ranks by a broadcast) and records the
  decision in the trial's system attributes; :meth:`StepPruningCallback.check_pruned` raises
  ``TrialPruned`` after ``fit`` — in the main process too under ``ddp_spawn``, where the callback that
  decided ran in a child process (the same protocol as optuna-integration's ``check_pruned()``).
* **MLflow without the deprecated ``MLflowCallback``.** One parent run per study; one nested child run
  per trial (tag ``mlflow.parentRunId``) created before the trial starts and handed to the trial's own
  ``MLFlowLogger`` (``run_id``), so training metrics, the sampled/derived parameters, the Optuna trial
  number and state (``optuna.trial_state``: COMPLETE/PRUNED/FAIL; run status FINISHED/KILLED/FAILED)
  and the objective all sit on one run, which the MLflow UI's compare view can line up.

DDP: use ``trainer.strategy: ddp_spawn`` in ``overrides`` (the trial's trainer then runs in spawned
children and the sweep process keeps its Optuna/MLflow state; Lightning's ``ddp`` launcher would re-run
the whole ``sweep`` command on every rank). The trainer, its callbacks and the pruning callback are pickled
into the spawned ranks (the CLI classes live at module level in :mod:`lit_rl.lightning_cli` for that);
``tests/sweep/test_sweep.py::test_ddp_spawn_trials_complete_and_prune_across_processes`` runs real 2-process gloo
trials, one completed and one pruned by the children's rank 0. Every rank needs at least one eval batch
(``data.eval_size / data.eval_batch_size >= devices``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from lit_rl.cli_args import LitArgumentParser
from lit_rl.sweep.derived import DerivedRule
from lit_rl.sweep.errors import SweepConfigError
from lit_rl.sweep.pruning import INTERMEDIATE_KEY, PRUNED_STEP_KEY, StepPruningCallback
from lit_rl.sweep.validate import check_against_base
from lit_rl.sweep.runner import SweepRunner, fit_trial_with_lightning_cli, objective_from_mlflow, run_sweep, summarize
from lit_rl.sweep.schema import Objective, SweepConfig, build_pruner
from lit_rl.sweep.space import ParamSpec

__all__ = [
    "INTERMEDIATE_KEY",
    "PRUNED_STEP_KEY",
    "DerivedRule",
    "Objective",
    "ParamSpec",
    "StepPruningCallback",
    "SweepConfig",
    "SweepConfigError",
    "SweepRunner",
    "build_pruner",
    "fit_trial_with_lightning_cli",
    "main",
    "objective_from_mlflow",
    "run_sweep",
    "summarize",
]


def main(argv: list[str] | None = None) -> int:
    parser = LitArgumentParser(prog="python -m lit_rl sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a sweep YAML (conf/sweeps/<name>.yaml)")
    parser.add_argument("--n_trials", type=int, default=None,
                        help="total trials of the study (tops up a resumed study)")
    parser.add_argument("--max_trials", type=int, default=None,
                        help="this worker runs at most this many trials, then exits")
    parser.add_argument("--study_name", default=None, help="override study_name")
    parser.add_argument("--storage", default=None, help="override storage (any SQLAlchemy URL)")
    parser.add_argument("--tracking_uri", default=None, help="override the MLflow tracking URI")
    parser.add_argument("--sampler", default=None, help="override sampler.name (tpe, random, grid, class path)")
    parser.add_argument("--output_dir", default=None, help="override output_dir")
    parser.add_argument("--max_steps", type=int, default=None,
                        help="every trial's budget: trainer.max_steps (goes into the sweep's overrides)")
    parser.add_argument("--eval_size", type=int, default=None,
                        help="every trial's evaluation set size: data.init_args.eval_size (overrides)")
    parser.add_argument("--overlay", action="append", default=[], metavar="FILE",
                        help="a training overlay for every trial, after the sweep's base configs (repeatable)")
    args = parser.parse_args(argv)
    if args.max_trials is not None and args.max_trials < 1:
        parser.error(f"--max_trials must be >= 1, got {args.max_trials}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides: dict[tuple, tuple[Any, str]] = {}
    for key in ("study_name", "storage", "tracking_uri", "output_dir", "n_trials"):
        if getattr(args, key) is not None:
            overrides[(key,)] = (getattr(args, key), f"command line (--{key.replace('_', '-')})")
    if args.sampler:
        overrides[("sampler", "name")] = (args.sampler, "command line (--sampler)")
    if args.max_steps is not None:  # a trial budget: one key of the overlay every trial gets
        overrides[("overrides", "trainer", "max_steps")] = (args.max_steps, "command line (--max_steps)")
    if args.eval_size is not None:
        overrides[("overrides", "data", "init_args", "eval_size")] = (args.eval_size, "command line (--eval_size)")
    try:  # a bad sweep file is one line naming the file, line and key (exit 2), not a traceback
        cfg = SweepConfig.from_yaml(args.config, overrides)
        for path in args.overlay:
            if not Path(path).is_file():
                raise SweepConfigError(f"{path}: overlay not found (--overlay)")
            cfg.base = [*cfg.base, str(path)]
        check_against_base(cfg)  # space keys, choices, derived values, the objective: before any trial trains
        runner = SweepRunner(cfg)
        runner.setup(args.n_trials)
        ran = runner.run(args.max_trials)
    except SweepConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summarize(runner.study))
    print(f"  runs list, objective first: {runner.tracker.view_url()}")
    return _exit_status(runner.study, [n for n in ran if n not in runner.dropped])


def _exit_status(study, ran: list[int]) -> int:
    """1 when every trial this worker ran failed (a scheduler then marks the job failed), else 0 (also when it
    ran none, or only trials another worker declared stale and re-enqueued: those are left out of ``ran``)."""
    import optuna

    failed = [t.number for t in study.get_trials(deepcopy=False)
              if t.number in ran and t.state == optuna.trial.TrialState.FAIL]
    if ran and len(failed) == len(ran):
        print(f"error: all {len(ran)} trials this worker ran failed (trials {failed}); each error is in the log "
              "above and in its MLflow child run (tag lit_rl.error)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
