"""MLflow for sweeps: one parent run per study, one nested child run per trial (:class:`StudyTracker`).

What a researcher opens after a sweep is MLflow's runs list and its compare view; both are arranged so that the
objective comes first (checked in a real Chromium, ``tests/e2e/test_mlflow_sweep_view.py``):

* **Compare view** (select trials -> Compare): its parallel-coordinates plot preselects the *first* metric the
  first run holds (MLflow lists a run's metrics in the order they were first logged) against the first three
  params that differ, in alphabetical order. So each trial's run logs ``sweep/objective`` first, as NaN ("no
  value yet") at step 0, before the fit logs anything; the trial's end logs the value (a later step or time:
  it becomes the run's latest value). Params that only name the run (its folder, run name) are tags
  (:func:`lit_rl.run_params.split_identity`), so the differing params are the searched ones.
* **Runs list**: the study writes an MLflow *shared view* (experiment tag ``mlflow.sharedViewState.<key>``, the
  JSON the UI's own "share view" writes) that filters the list to the study's runs, shows ``sweep/objective``
  and the searched params as its first columns and sorts by the objective; :meth:`StudyTracker.view_url` is its
  address, printed at the end of a sweep. The parent row carries the best value so far as ``sweep/objective``.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterable

from lit_rl.sweep.schema import SweepConfig
from lit_rl.tracking import get_or_create_experiment

__all__ = ["OBJECTIVE", "StudyTracker"]

#: the objective's name in the trials' MLflow runs (and the parent's: the best value so far)
OBJECTIVE = "sweep/objective"


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

    # -- the runs list: a shared view with the objective first ----------------------------------------------
    @property
    def view_key(self) -> str:
        """The shared view's key (URL-safe: letters, digits, ``-``, ``_``)."""
        return "lit_rl-sweep-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.cfg.study_name)

    def view_state(self) -> dict[str, Any]:
        """The runs list's state: the study's runs, objective and searched params as the first columns, sorted
        best first (the keys of MLflow's experiment-page state: search facets and ``selectedColumns``)."""
        def column(kind: str, key: str) -> str:
            return f"{kind}.`{key}`"

        return {
            "searchFilter": f"tags.`lit_rl.sweep` = '{self.cfg.study_name}'",
            "orderByKey": column("metrics", OBJECTIVE),
            "orderByAsc": self.cfg.objective.direction == "minimize",
            "selectedColumns": [column("metrics", OBJECTIVE), column("metrics", self.cfg.objective.metric),
                                *(column("params", k) for k in [*self.cfg.space, *self.cfg.derived])],
        }

    def publish_view(self) -> None:
        """Write :meth:`view_state` as the experiment's shared view (plain JSON, which the UI reads)."""
        self.client.set_experiment_tag(self.experiment_id, f"mlflow.sharedViewState.{self.view_key}",
                                       json.dumps(self.view_state()))

    def view_url(self) -> str:
        """The runs list in that view: on the tracking server itself, or on ``mlflow ui`` for a local store (the
        line says how to start it)."""
        uri = self.cfg.tracking_uri
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs?viewStateShareKey={self.view_key}"
        return (f"http://127.0.0.1:5000/#/experiments/{self.experiment_id}/runs?viewStateShareKey={self.view_key} "
                f"(after: mlflow ui --backend-store-uri {uri})")

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
        # the first metric of the run: the compare view preselects it (NaN until the trial's end logs the value)
        self.client.log_metric(run.info.run_id, OBJECTIVE, float("nan"), step=0)
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
            self.client.log_metric(run_id, OBJECTIVE, value, step=step or 0)
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
        self.client.log_metric(parent_id, OBJECTIVE, best.value, step=len(trials))  # the parent row's column
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
