"""Running a study: worker slots, heartbeats, stale-trial handling, one trial through the LightningCLI
(:class:`SweepRunner`, :func:`run_sweep`); the protocol is in :mod:`lit_rl.sweep`'s docstring."""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from lit_rl.atomic import atomic_write_text
import yaml

from lit_rl.sweep.errors import ObjectiveNotLoggedError, SweepConfigError, _bad
from lit_rl.sweep.pruning import StepPruningCallback
from lit_rl.sweep.schema import Objective, SweepConfig
from lit_rl.sweep.mlflow_study import StudyTracker

SURPLUS_KEY = "lit_rl:slot"

log = logging.getLogger("lit_rl.sweep")

__all__ = ["SweepRunner", "fit_trial_with_lightning_cli", "objective_from_mlflow", "run_sweep", "summarize"]


class _Heartbeat:
    """Record the trial's heartbeat every ``interval`` seconds while it runs (Optuna does this only
    inside ``study.optimize``; this sweep drives trials itself to pop enqueued slots exactly)."""

    def __init__(self, storage, trial_id: int, interval: int) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as e:  # a transient lock on SQLite must not kill the trial
                log.debug("heartbeat failed: %s", e)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "_Heartbeat":
        self.storage.record_heartbeat(self.trial_id)  # a heartbeat row from the start
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def _sqlite_lock(*urls: str):
    """Serialise schema creation/migration of fresh SQLite stores between workers on one machine: two
    processes running MLflow's alembic migrations on one new file corrupt it (``_alembic_tmp_*`` tables)."""
    import fcntl

    paths = sorted({u[len("sqlite:///"):] for u in urls if u.startswith("sqlite:///")})
    handles = []
    try:
        for path in paths:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fh = open(f"{path}.lock", "w")
            fcntl.flock(fh, fcntl.LOCK_EX)
            handles.append(fh)
        yield
    finally:
        for fh in reversed(handles):
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()


def _retry(fn: Callable[[], Any], what: str, attempts: int = 5) -> Any:
    """SQLite schema creation races when two fresh workers start together: retry briefly."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any DB error here is worth a retry
            if i == attempts - 1:
                raise
            log.warning("%s failed (%s); retrying", what, e)
            time.sleep(0.5 + i)


def retry_callback_class() -> type:
    """Optuna's stale-trial retry hook: ``RetryHeartbeatStaleTrialCallback`` in newer Optuna (not in 4.0),
    ``RetryFailedTrialCallback`` before it."""
    import optuna

    return (getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            or optuna.storages.RetryFailedTrialCallback)


class _StaleTrialHandler:
    """The storage's stale-trial hook: a RUNNING trial stopped beating (its process died), so its MLflow
    child run is marked FAILED and the trial re-enqueued with the same parameters (up to ``max_retry``).
    Small and picklable: the storage (and so this hook) travels with the trial into ``ddp_spawn`` ranks."""

    def __init__(self, tracking_uri: str, max_retry: int) -> None:
        self.tracking_uri = tracking_uri
        self.retry = retry_callback_class()(max_retry=max_retry)

    def __call__(self, study, trial) -> None:
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id:
            from mlflow.tracking import MlflowClient

            try:
                client = MlflowClient(tracking_uri=self.tracking_uri)
                client.set_tag(run_id, "optuna.trial_state", "FAIL")
                client.set_tag(run_id, "lit_rl.error", "stale heartbeat: the worker process died")
                client.set_terminated(run_id, "FAILED")
            except Exception as e:  # noqa: BLE001 - MLflow bookkeeping must not stop the sweep
                log.warning("could not mark MLflow run %s failed: %s", run_id, e)
        log.warning("trial %d went stale (crashed worker); re-enqueueing it", trial.number)
        self.retry(study, trial)


class SweepRunner:
    """Drives one worker of a study: create or join it, pop slots, run trials, keep MLflow in sync."""

    def __init__(self, cfg: SweepConfig, fit_trial: Callable[..., float] | None = None) -> None:
        import optuna

        self.cfg = cfg
        with _sqlite_lock(cfg.tracking_uri, cfg.storage):
            self.tracker = _retry(lambda: StudyTracker(cfg), "opening the MLflow store")
            self._on_stale = _StaleTrialHandler(cfg.tracking_uri, cfg.max_retry)
            self.storage = _retry(lambda: cfg.make_storage(failed_trial_callback=self._on_stale), "opening the storage")
        self.fit_trial = fit_trial or fit_trial_with_lightning_cli
        self._retry_cb = self._on_stale.retry
        direction = cfg.objective.direction
        try:
            self.study = optuna.create_study(
                study_name=cfg.study_name, storage=self.storage, sampler=cfg.make_sampler(),
                pruner=cfg.make_pruner(), direction=direction, load_if_exists=False,
            )
            self.creator = True
        except optuna.exceptions.DuplicatedStudyError:
            self.study = optuna.load_study(study_name=cfg.study_name, storage=self.storage, sampler=cfg.make_sampler(),
                                           pruner=cfg.make_pruner())
            self.creator = False
            if self.study.direction.name.lower() != direction:
                raise _bad(("objective", "direction"), f"study {cfg.study_name!r} exists in {cfg.storage} "
                           f"with direction {self.study.direction.name.lower()}, the config says {direction}")
        self.out = Path(cfg.output_dir) / cfg.study_name
        self.out.mkdir(parents=True, exist_ok=True)
        self.overlay = self.out / "overrides.yaml"
        atomic_write_text(self.overlay, yaml.safe_dump(cfg.overrides or {}, sort_keys=False))
        self.ran: list[int] = []
        #: trials of ``ran`` whose result was dropped: another worker declared them stale and re-enqueued them
        self.dropped: list[int] = []

    # -- setup: exactly one worker (the creator) creates the parent run and the slots -----------------

    def setup(self, n_trials: int | None = None, wait_s: float = 120.0) -> None:
        attrs = self.study.user_attrs
        if self.creator:
            parent = self.tracker.create_parent(self.study)
            self.study.set_user_attr("mlflow_parent_run_id", parent)
            self.study.set_user_attr("mlflow_experiment_id", self.tracker.experiment_id)
            self._top_up(n_trials or self.cfg.target_trials())
            self.study.set_user_attr("ready", True)
        else:
            deadline = time.time() + wait_s
            while not attrs.get("ready") and time.time() < deadline:
                time.sleep(0.5)
                attrs = self.study.user_attrs
            if not attrs.get("ready"):  # the creator died before finishing setup: finish it here
                log.warning("study %s was never set up by its creator; setting it up", self.cfg.study_name)
                if "mlflow_parent_run_id" not in attrs:
                    self.study.set_user_attr("mlflow_parent_run_id", self.tracker.create_parent(self.study))
                self._top_up(n_trials or self.cfg.target_trials())
                self.study.set_user_attr("ready", True)
            elif n_trials is not None and n_trials != attrs.get("n_trials"):
                self._top_up(n_trials)
        self.parent_id = self.study.user_attrs["mlflow_parent_run_id"]
        self.tracker.client.set_terminated(self.parent_id, "RUNNING")
        self.tracker.publish_view()  # every setup: a study made before the view existed gets it too

    def _top_up(self, n_trials: int) -> None:
        """Enqueue slots until the study holds ``n_trials`` trials that are not FAIL."""
        import optuna

        TS = optuna.trial.TrialState
        live = [t for t in self.study.get_trials(deepcopy=False) if t.state != TS.FAIL]
        self.study.set_user_attr("n_trials", n_trials)
        missing = n_trials - len(live)
        if missing <= 0:
            return
        if self.cfg.sampler_name == "grid":
            def key(params: dict[str, Any]) -> tuple:
                return tuple(sorted((k, json.dumps(v)) for k, v in params.items() if k in self.cfg.space))

            seen = {key({**t.params, **t.system_attrs.get("fixed_params", {})}) for t in live}
            todo = [p for p in self.cfg.grid() if key(p) not in seen][:missing]
            for params in todo:
                self.study.enqueue_trial(params, user_attrs={SURPLUS_KEY: "grid"})
        else:
            for _ in range(missing):
                self.study.enqueue_trial({}, user_attrs={SURPLUS_KEY: "slot"})

    # -- crashed trials ------------------------------------------------------------------------------

    # -- the loop ------------------------------------------------------------------------------------

    def _pop(self):
        import optuna

        TS = optuna.trial.TrialState
        for t in self.study.get_trials(deepcopy=False, states=(TS.WAITING,)):
            try:
                if self.study._storage.set_trial_state_values(t._trial_id, state=TS.RUNNING):
                    return optuna.Trial(self.study, t._trial_id)
            except RuntimeError:  # claimed by another worker (5.x: UpdateFinishedTrialError; 4.x: RuntimeError)
                continue
        return None

    def run(self, max_trials: int | None = None) -> list[int]:
        """Pop and run waiting trials until none is left (or this worker has run ``max_trials``)."""
        import optuna

        TS = optuna.trial.TrialState
        while max_trials is None or len(self.ran) < max_trials:
            with warnings.catch_warnings():  # experimental since Optuna 2.9, still the public entry point
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
            trial = self._pop()
            if trial is None:
                running = self.study.get_trials(deepcopy=False, states=(TS.RUNNING,))
                if running and self.cfg.wait_for_running:
                    time.sleep(min(2.0, self.cfg.heartbeat_interval))
                    continue
                break
            self._run_one(trial)
        self.tracker.update_parent(self.parent_id, self.study)
        if not self.study.get_trials(deepcopy=False, states=(TS.RUNNING, TS.WAITING)):
            self.tracker.client.set_terminated(self.parent_id, "FINISHED")
        return self.ran

    def _run_one(self, trial) -> None:
        import optuna

        TS = optuna.trial.TrialState
        cfg = self.cfg
        with _Heartbeat(self.storage, trial._trial_id, cfg.heartbeat_interval):
            sampled = {name: spec.suggest(trial) for name, spec in cfg.space.items()}
            try:  # a derived rule that fails at this point (6 / (g_ext - 2) at g_ext=2) fails the trial below
                values, derived_error = cfg.trial_values(sampled), None
            except SweepConfigError as e:
                values, derived_error = dict(sampled), e
            derived = [name for name in cfg.derived if name in values]
            for name in derived:
                trial.set_user_attr(name, values[name])
            run_id = self.tracker.create_child(self.parent_id, trial.number, values, derived)
            trial.set_user_attr("mlflow_run_id", run_id)
            trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
            log.info("trial %d: %s", trial.number, values)
            state, value, error = "FAIL", None, None
            try:
                if derived_error is not None:
                    raise derived_error
                value = self.fit_trial(cfg, trial, values, run_id, self.out / f"trial_{trial.number}", self.overlay)
                state = "COMPLETE"
            except optuna.TrialPruned as e:
                state, error = "PRUNED", str(e)
            except (KeyboardInterrupt, SystemExit):  # interrupted: FAIL now, retried on the next run
                self.tracker.finish_child(run_id, "FAIL", error="interrupted")
                frozen = self.study.tell(trial, state=TS.FAIL)
                self._retry_cb(self.study, frozen)
                raise
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"
                log.error("trial %d failed: %s", trial.number, error, exc_info=not isinstance(e, SweepConfigError))
                if not cfg.catch_exceptions or isinstance(e, ObjectiveNotLoggedError):  # the latter: every trial
                    self.tracker.finish_child(run_id, "FAIL", error=error)
                    self.study.tell(trial, state=TS.FAIL)
                    raise
        if state == "COMPLETE" and (value is None or not math.isfinite(value)):
            state, error = "FAIL", f"objective {cfg.objective.metric} is {value}"
        # skip_if_finished: another worker may have declared this trial stale (its heartbeat came late, e.g.
        # on an overloaded machine) and failed + re-enqueued it meanwhile; then that decision stands.
        if state == "COMPLETE":
            frozen = self.study.tell(trial, value, skip_if_finished=True)
        elif state == "PRUNED":
            frozen = self.study.tell(trial, state=TS.PRUNED, skip_if_finished=True)
        else:
            frozen = self.study.tell(trial, state=TS.FAIL, skip_if_finished=True)
        if frozen.state.name != state:
            log.warning("trial %d was declared stale by another worker while it ran; its %s result is dropped "
                        "(it was re-enqueued)", trial.number, state)
            self.tracker.client.set_tag(run_id, "lit_rl.error", "declared stale while running (late heartbeat); its "
                                        f"{state} result (value {value}) was dropped and the trial re-enqueued")
            self.tracker.client.set_tag(run_id, "optuna.trial_state", frozen.state.name)
            self.tracker.client.set_terminated(run_id, "FAILED")
            self.ran.append(trial.number)
            self.dropped.append(trial.number)
            return
        if state == "PRUNED":
            value = frozen.value
        last_step = max(frozen.intermediate_values) if frozen.intermediate_values else None
        if frozen.state == TS.PRUNED:
            self.tracker.client.set_tag(run_id, "optuna.pruned_step", str(last_step))
            error = None
            if (cfg.prune_monitor or cfg.objective.metric) != cfg.objective.metric:
                value = None  # Optuna's value of a pruned trial is the last *monitor* value: not the objective
        self.tracker.finish_child(run_id, frozen.state.name, value, last_step, error)
        self.tracker.update_parent(self.parent_id, self.study)
        self.ran.append(trial.number)
        log.info("trial %d %s value=%s", trial.number, frozen.state.name, value)


def objective_from_mlflow(tracking_uri: str, run_id: str, objective: Objective) -> float | None:
    """The objective from a run's MLflow history (``last`` value or ``best`` by direction)."""
    from mlflow.tracking import MlflowClient

    name = objective.metric.replace("@", "_at_")
    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, name)
    if not history:
        return None
    if objective.reduce == "last":
        return sorted(history, key=lambda m: (m.step, m.timestamp))[-1].value
    pick = max if objective.direction == "maximize" else min
    return pick(m.value for m in history)


def fit_trial_with_lightning_cli(cfg: SweepConfig, trial, values: dict[str, Any], run_id: str, trial_dir: Path,
                                 overlay: Path) -> float:
    """Build a fresh model/trainer through the LightningCLI, fit, check pruning, return the objective."""
    import gc

    from lit_rl.cli import run_lightning_cli

    trial_dir.mkdir(parents=True, exist_ok=True)
    args = cfg.cli_args(values, trial_dir, overlay, run_id, f"{cfg.study_name}-trial-{trial.number}")
    atomic_write_text(trial_dir / "cli_args.json", json.dumps(args, indent=1))
    argv, sys.argv = sys.argv, sys.argv[:1]  # the sweep's own arguments are not the trial's (LightningCLI warns)
    try:
        cli = run_lightning_cli(args, run=False)
    except SystemExit as e:  # jsonargparse exits on a bad config: a failed trial, not a dead sweep
        raise ValueError(f"the trial's config did not parse (exit {e.code}); see stderr") from None
    finally:
        sys.argv = argv
    trainer = cli.trainer
    for cb in trainer.checkpoint_callbacks:  # the base config's dirpath is shared by all trials
        cb.dirpath = str(trial_dir / "checkpoints")
    pruning = StepPruningCallback(trial, cfg.prune_monitor or cfg.objective.metric, cfg.report_every_n_steps)
    trainer.callbacks.append(pruning)
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule)
        pruning.check_pruned()
        value = None
        if cfg.objective.reduce == "last" and cfg.objective.metric in trainer.callback_metrics:
            value = float(trainer.callback_metrics[cfg.objective.metric])
        if value is None:
            value = objective_from_mlflow(cfg.tracking_uri, run_id, cfg.objective)
        if value is None:
            logged = sorted(k for k in trainer.callback_metrics if "/" in k)
            near = difflib.get_close_matches(cfg.objective.metric, logged, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"logged: {', '.join(logged[:12])}"
            raise ObjectiveNotLoggedError(f"objective.metric: {cfg.objective.metric!r} was not logged by trial "
                                          f"{trial.number}; {hint}")
        return value
    finally:
        del cli, trainer
        gc.collect()


def run_sweep(
    cfg: SweepConfig, n_trials: int | None = None, fit_trial: Callable[..., float] | None = None,
    max_trials: int | None = None,
) -> "Any":
    """Create or join the study, run trials until no slot is left, return the Optuna study.

    ``max_trials`` caps the trials *this worker* runs (e.g. one per SLURM array task); the study's total
    stays ``n_trials``, and the remaining slots wait for other workers or the next run.
    """
    if max_trials is not None and max_trials < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    runner = SweepRunner(cfg, fit_trial)
    runner.setup(n_trials)
    runner.run(max_trials)
    return runner.study


def summarize(study) -> str:
    import optuna

    TS = optuna.trial.TrialState
    lines = [f"study {study.study_name}:"]
    for t in study.get_trials(deepcopy=False):
        lines.append(f"  trial {t.number:>3} {t.state.name:<8} value={t.value} params={t.params}")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    lines.append(f"  complete={states.count(TS.COMPLETE)} pruned={states.count(TS.PRUNED)} "
                 f"failed={states.count(TS.FAIL)}")
    try:
        lines.append(f"  best: trial {study.best_trial.number} value={study.best_value} params={study.best_params}")
    except ValueError:
        lines.append("  best: none (no complete trial)")
    return "\n".join(lines)
