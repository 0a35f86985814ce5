"""A real MLflow tracking server: ``mlflow server`` on loopback with a PostgreSQL backend store
and a served local artifact folder (tests/support/mlflow_server.py), and the faults it meets.

* two fits log to it and the server is killed (SIGKILL) mid-fit, once (the ``outage`` fixture):
  - one fit outlives the outage: it finishes and its run holds every metric a CSVLogger beside it wrote,
    some of them logged while the server was down (training went on);
  - the other ends while the server is down: it fails naming the URI and the spill file, and
    ``python -m lit_rl.loggers replay`` sends the rest once the server is back, so again no metric is lost;
* a sweep (study on PostgreSQL) logs a parent run and linked child runs to it.

Skipped when PostgreSQL or the server cannot start; under ``CI=true`` that fails instead.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from lit_rl.sweep import SweepConfig, run_sweep
from support.sweeps import POOL
from support.sweeps import tiny_sweep as _cfg

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[1]
STEPS = 40  # long enough that both fits are still training when the server is killed


@pytest.fixture(scope="module")
def mlflow_server(postgres_server):
    from support.mlflow_server import start_or_skip

    if not postgres_server.running():
        postgres_server.start()
    server = start_or_skip(postgres_server, "mlflow_tracking")
    yield server
    server.cleanup()


@pytest.fixture
def server(mlflow_server):
    """The module's server, up (a test before may have left it stopped)."""
    if mlflow_server.proc is None:
        mlflow_server.start()
    return mlflow_server


def _start_fit(tmp: Path, uri: str, run_name: str, final_wait_s: float) -> tuple[subprocess.Popen, Path]:
    overlay = tmp / "overlay.yaml"
    overlay.write_text(f"""
trainer:
  max_steps: {STEPS}
  val_check_interval: 20
  enable_progress_bar: false
  default_root_dir: {tmp}/run
  logger:
    - class_path: lit_rl.loggers.MLFlowLogger
      init_args:
        tracking_uri: {uri}
        experiment_name: tracking-server
        run_name: {run_name}
        retry_every_s: 1
        final_wait_s: {final_wait_s}
        spill_dir: {tmp}/unsent
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp}/csv, name: truth}}
data:
  init_args:
    pool_path: {POOL}
""")
    cmd = [sys.executable, "-m", "lit_rl", "fit", "--config", str(ROOT / "conf/erils.yaml"),
           "--config", str(ROOT / "tests/tiny_overlay.yaml"), "--config", str(overlay)]
    log = tmp / "fit.log"
    env = dict(os.environ, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false", OMP_WAIT_POLICY="PASSIVE")
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return proc, log


def _run(uri: str, run_name: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tracking-server")
    if exp is None:
        return client, None
    runs = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    return client, (runs[0] if runs else None)


def _wait_for_first_metrics(uri: str, run_name: str, proc: subprocess.Popen, log: Path, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the fit ended before logging:\n{log.read_text()[-3000:]}"
        client, run = _run(uri, run_name)
        if run is not None and client.get_metric_history(run.info.run_id, "train/loss"):
            return run.info.run_id
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"no train/loss in the server after {timeout} s:\n{log.read_text()[-3000:]}")


def _wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in log.read_text():
            return
        assert proc.poll() is None or text in log.read_text(), f"fit ended without {text!r}:\n{log.read_text()[-3000:]}"
        time.sleep(0.3)
    pytest.fail(f"no {text!r} in the fit log after {timeout} s:\n{log.read_text()[-3000:]}")


def _csv_metrics(tmp: Path) -> set[tuple[str, int]]:
    """(key, step) of every metric the CSVLogger wrote: what the MLflow run must hold."""
    (path,) = (tmp / "csv").rglob("metrics.csv")
    out = set()
    with path.open() as fh:
        for row in csv.DictReader(fh):
            for k, v in row.items():
                if k != "step" and v != "":
                    out.add((k, int(row["step"])))
    return out


def _mlflow_metrics(client: MlflowClient, run_id: str, keys: set[str]) -> dict[tuple[str, int], int]:
    """(key, step) -> timestamp (ms) of every logged value of ``keys``."""
    return {(k, m.step): m.timestamp for k in keys for m in client.get_metric_history(run_id, k)}


@pytest.fixture(scope="module")
def outage(mlflow_server, tmp_path_factory):
    """One outage, two fits beside each other: the server is SIGKILLed once both have logged; fit ``back``
    (final_wait_s 240) outlives the outage, fit ``gone`` (final_wait_s 2) ends while the server is still
    down; then the server is started again and ``back`` finishes."""
    server = mlflow_server
    if server.proc is None:
        server.start()
    fits = {}
    for name, wait in (("back", 240), ("gone", 2)):
        tmp = tmp_path_factory.mktemp(name)
        proc, log = _start_fit(tmp, server.uri, name, final_wait_s=wait)
        fits[name] = {"tmp": tmp, "proc": proc, "log": log}
    for name, f in fits.items():
        f["run_id"] = _wait_for_first_metrics(server.uri, name, f["proc"], f["log"])
    server.stop()
    for name, f in fits.items():
        assert "`Trainer.fit` stopped" not in f["log"].read_text(), f"fit {name} ended before the outage"
    t_down = time.time()
    for f in fits.values():
        _wait_for_text(f["log"], "is not taking metrics", f["proc"])
    fits["gone"]["rc"] = fits["gone"]["proc"].wait(timeout=600)
    assert fits["back"]["proc"].poll() is None or fits["back"]["proc"].returncode == 0
    t_up = time.time()
    took = server.start()
    fits["back"]["rc"] = fits["back"]["proc"].wait(timeout=600)
    return {"fits": fits, "t_down": t_down, "t_up": t_up, "start_s": took, "uri": server.uri}


def test_a_server_restart_mid_fit_loses_no_metric_and_training_goes_on(outage):
    f, uri = outage["fits"]["back"], outage["uri"]
    text = f["log"].read_text()
    assert f["rc"] == 0, text[-4000:]
    assert uri in text and "answers again" in text

    truth = _csv_metrics(f["tmp"])
    client = MlflowClient(uri)
    got = _mlflow_metrics(client, f["run_id"], {k for k, _ in truth})
    assert set(got) == truth, f"lost: {sorted(truth - set(got))[:10]}"
    down, up = outage["t_down"] * 1000, outage["t_up"] * 1000
    during = [k for k, ts in got.items() if down < ts < up]
    assert during, (f"no metric logged while the server was down ({(up - down) / 1000:.0f} s; restart took "
                    f"{outage['start_s']:.0f} s)")
    run = client.get_run(f["run_id"])
    assert run.info.status == "FINISHED"
    assert "model.init_args.updates_per_batch" in run.data.params  # params and the config artifact reached it
    assert any(a.path == "config.yaml" for a in client.list_artifacts(f["run_id"]))


def test_a_server_that_stays_down_fails_the_fit_naming_it_and_replay_sends_the_rest(outage):
    f, uri = outage["fits"]["gone"], outage["uri"]
    text = f["log"].read_text()
    assert f["rc"] != 0, "a fit whose metrics never reached the server must not pass"
    (line,) = [ln for ln in text.splitlines() if ln.startswith("error: ")]  # one line (was a traceback)
    assert "did not take the metrics" in line and uri in line and f["run_id"] in line, line
    assert "Traceback" not in text
    files = sorted((f["tmp"] / "unsent").glob("*.jsonl"))
    assert len(files) == 1 and str(files[0]) in text
    assert not list((f["tmp"] / "unsent").glob(".*.partial"))

    replay = subprocess.run([sys.executable, "-m", "lit_rl.loggers", "replay", str(files[0])], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-3000:]
    truth = _csv_metrics(f["tmp"])
    got = _mlflow_metrics(MlflowClient(uri), f["run_id"], {k for k, _ in truth})
    assert set(got) == truth, f"lost: {sorted(truth - set(got))[:10]}"
    assert not files[0].exists()


def test_a_sweep_on_postgres_logs_linked_parent_and_child_runs_to_the_server(server, postgres_url, tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(ROOT)
    raw = _cfg(tmp_path, study_name="served", storage=postgres_url, tracking_uri=server.uri,
               space={"data.init_args.g_ext": {"type": "categorical", "choices": [1, 2]}},
               pruner={"name": "none"}, prune_monitor=None)
    study = run_sweep(SweepConfig.from_dict(raw))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2

    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("lit_rl-sweeps")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`lit_rl.sweep` = 'served'")
    (parent,) = [r for r in runs if r.data.tags.get("lit_rl.role") == "study"]
    children = sorted((r for r in runs if r.data.tags.get("lit_rl.role") == "trial"),
                      key=lambda r: int(r.data.tags["optuna.trial_number"]))
    assert len(children) == 2 and parent.info.status == "FINISHED"
    for trial, child in zip(sorted(study.trials, key=lambda t: t.number), children):
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert trial.user_attrs["mlflow_run_id"] == child.info.run_id
        assert child.info.status == "FINISHED"
        assert "train/on_policy/reward_mean" in child.data.metrics  # the trial's own logger wrote to the server
        assert child.data.metrics["sweep/objective"] == pytest.approx(trial.value)
    assert parent.data.tags["optuna.best_run_id"] in {c.info.run_id for c in children}
