"""MLflow for sweeps: one parent run per study, one nested child run per trial (:class:`StudyTracker`)."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterable

from lit_rl.sweep.schema import SweepConfig
from lit_rl.tracking import get_or_create_experiment

__all__ = ["StudyTracker"]


class StudyTracker:
    """MLflow bookkeeping: the study's parent run and one nested child run per trial."""

    def __init__(self, cfg: SweepConfig) -> None:
        from mlflow.tracking import MlflowClient

        if cfg.tracking_uri.startswith("sqlite:///"):
            Path(cfg.tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        self.experiment_id = get_or_create_experiment(self.client, cfg.experiment_name)  # workers start together

    def create_parent(self, study) -> str:
        cfg = self.cfg
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"study:{cfg.study_name}",
            tags={"lit_rl.sweep": cfg.study_name, "lit_rl.role": "study", "optuna.study_name": cfg.study_name},
        )
        params = {
            "objective.metric": cfg.objective.metric, "objective.direction": cfg.objective.direction,
            "sampler": json.dumps(cfg.sampler), "pruner": json.dumps(cfg.pruner), "n_trials": cfg.target_trials(),
            "base": ",".join(cfg.base),
            "space": json.dumps({k: {kk: vv for kk, vv in vars(v).items() if vv not in (None, False) and kk != "name"}
                                 for k, v in cfg.space.items()}),
            "derived": json.dumps({k: v.expr for k, v in cfg.derived.items()}),
        }
        for k, v in params.items():
            self.client.log_param(run.info.run_id, k, str(v)[:6000])
        return run.info.run_id

    def create_child(self, parent_id: str, trial_number: int, values: dict[str, Any], derived: Iterable[str]) -> str:
        from mlflow.entities import Param, RunTag
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        cfg = self.cfg
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{cfg.study_name}-trial-{trial_number}",
            tags={
                MLFLOW_PARENT_RUN_ID: parent_id, "lit_rl.sweep": cfg.study_name, "lit_rl.role": "trial",
                "optuna.study_name": cfg.study_name, "optuna.trial_number": str(trial_number),
                "optuna.trial_state": "RUNNING", "optuna.direction": cfg.objective.direction,
                "lit_rl.space": ",".join(cfg.space), "lit_rl.worker": f"{socket.gethostname()}:{os.getpid()}",
            },
        )
        self.client.log_batch(
            run.info.run_id,
            params=[Param(k, str(v)) for k, v in values.items()],
            tags=[RunTag("lit_rl.derived", ",".join(derived))] if derived else [],
        )
        return run.info.run_id

    _STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}

    def finish_child(self, run_id: str, state: str, value: float | None = None, step: int | None = None,
                     error: str | None = None) -> None:
        self.client.set_tag(run_id, "optuna.trial_state", state)
        if value is not None and math.isfinite(value):
            self.client.log_metric(run_id, "sweep/objective", value, step=step or 0)
        if error:
            self.client.set_tag(run_id, "lit_rl.error", error[:4000])
        self.client.set_terminated(run_id, self._STATUS[state])

    def update_parent(self, parent_id: str, study) -> None:
        import optuna

        trials = study.get_trials(deepcopy=False)
        states = [t.state for t in trials]
        TS = optuna.trial.TrialState
        counts = {s.name.lower(): states.count(s) for s in (TS.COMPLETE, TS.PRUNED, TS.FAIL, TS.RUNNING, TS.WAITING)}
        for k, v in counts.items():
            self.client.log_metric(parent_id, f"study/n_{k}", v, step=len(trials))
        try:
            best = study.best_trial
        except ValueError:
            return
        self.client.log_metric(parent_id, "study/best_value", best.value, step=best.number)
        self._set_shared_tag(parent_id, "optuna.best_trial_number", str(best.number))
        self._set_shared_tag(parent_id, "optuna.best_params", json.dumps(best.params))
        run = best.user_attrs.get("mlflow_run_id")
        if run:
            self._set_shared_tag(parent_id, "optuna.best_run_id", run)

    def _set_shared_tag(self, run_id: str, key: str, value: str, attempts: int = 3) -> None:
        """A tag of the parent run, which every worker writes: MLflow's SQL store inserts a new tag key with
        no upsert, so two workers setting it at once make one fail on the unique key; the retry updates the
        row the other inserted."""
        from mlflow.exceptions import MlflowException

        for i in range(attempts):
            try:
                return self.client.set_tag(run_id, key, value)
            except MlflowException as e:
                if i == attempts - 1 or "UNIQUE constraint" not in str(e) and "unique constraint" not in str(e):
                    raise
                time.sleep(0.1 * (i + 1))
