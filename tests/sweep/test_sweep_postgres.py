"""Sweep workers on one PostgreSQL study: the SQLite scenarios of tests/sweep/test_sweep.py on a
``postgresql+psycopg://`` storage served by a throwaway server (tests/support/postgres.py), plus a server
restart mid-sweep.

Workers are separate processes (forked from a forkserver that imported lit_rl once) running the real sweep
command line, tests/support/sweep_worker.py, with a sleeping trial in place of the LightningCLI fit: what is
under test is the storage protocol (claims, ``--max_trials``, heartbeats, stale-trial retry, connection
retry), not training, which test_sweep.py covers with real tiny trials.
MLflow stays on a SQLite file (a tracking server is item 2). Skipped when PostgreSQL cannot start; under
``CI=true`` that fails instead.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from support.sweep_worker import start_worker
from support.sweeps import sweep_runs as _runs
from support.sweeps import tiny_sweep as _cfg

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
TS = optuna.trial.TrialState
G_EXT, LR = [1, 2, 3], [0.0001, 0.0002, 0.0003, 0.0004]  # the grid: 12 points
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _config(tmp_path: Path, storage: str, study: str, **kw) -> Path:
    raw = _cfg(
        tmp_path, study_name=study, storage=storage,
        space={"data.init_args.g_ext": {"type": "categorical", "choices": G_EXT},
               "model.init_args.optimizer.init_args.lr": {"type": "categorical", "choices": LR}},
        derived={}, pruner={"name": "none"}, prune_monitor=None, **kw,
    )
    path = tmp_path / f"{study}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _worker(config: Path, log: Path, *extra: str, trial_s: float = 1.0, barrier: int = 0):
    """A worker process; ``barrier=n``: its first trial waits until ``n`` workers are in theirs."""
    folder = config.parent / "barrier"
    folder.mkdir(exist_ok=True)
    return start_worker(config, log, *extra, trial_s=trial_s, barrier=(folder, barrier) if barrier else None)


def _wait_all(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 240) -> None:
    deadline = time.time() + timeout
    for p, log in zip(procs, logs):
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"worker {log.name} still running after {timeout} s:\n{log.read_text()[-3000:]}")
        assert rc == 0, f"{log.name} exited {rc}:\n{log.read_text()[-3000:]}"


def _trials(storage: str, study: str):
    return sorted(optuna.load_study(study_name=study, storage=storage).trials, key=lambda t: t.number)


def _point(t) -> tuple:
    params = t.params or t.system_attrs.get("fixed_params", {})
    return params["data.init_args.g_ext"], params["model.init_args.optimizer.init_args.lr"]


def _assert_each_point_complete_once(trials) -> None:
    done = Counter(_point(t) for t in trials if t.state == TS.COMPLETE)
    assert sorted(done) == sorted((g, lr) for g in G_EXT for lr in LR), f"grid points missing: {done}"
    assert set(done.values()) == {1}, f"a grid point COMPLETE more than once: {done}"
    for t in trials:
        if t.state == TS.COMPLETE:
            assert t.value == pytest.approx(sum(_point(t)))  # each trial's own result


def _wait_for(predicate, what: str, proc_logs=(), timeout: float = 180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            found = predicate()
        except Exception:  # noqa: BLE001 - the study may not exist yet
            found = None
        if found:
            return found
        for p, log in proc_logs:
            assert p.poll() is None, f"{log.name} exited {p.returncode} early:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def test_four_workers_finish_every_grid_point_exactly_once(tmp_path, postgres_url):
    config = _config(tmp_path, postgres_url, "four")
    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    procs = [_worker(config, log, trial_s=0.5, barrier=4) for log in logs]  # all 4 in a trial at once, then racing
    _wait_all(procs, logs)
    trials = _trials(postgres_url, "four")
    assert len(trials) == 12 and all(t.state == TS.COMPLETE for t in trials), [t.state for t in trials]
    _assert_each_point_complete_once(trials)
    workers = Counter(t.user_attrs["worker"] for t in trials)
    assert len(workers) == 4, f"not every worker ran a trial: {workers}"
    parents, children = _runs(tmp_path, "four")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and sorted(children) == list(range(12))
    assert {r.data.tags["lit_rl.worker"] for r in children.values()} == set(workers)


def test_max_trials_caps_each_worker_and_a_last_run_takes_the_rest(tmp_path, postgres_url):
    config = _config(tmp_path, postgres_url, "capped")
    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    procs = [_worker(config, log, "--max-trials", "2", trial_s=0.5, barrier=4) for log in logs]  # hyphenated flag
    _wait_all(procs, logs)
    trials = _trials(postgres_url, "capped")
    states = Counter(t.state for t in trials)
    assert states == {TS.COMPLETE: 8, TS.WAITING: 4}, states
    workers = Counter(t.user_attrs["worker"] for t in trials if t.state == TS.COMPLETE)
    assert sorted(workers.values()) == [2, 2, 2, 2], workers  # 12 slots: every capped worker ran exactly 2
    assert len({_point(t) for t in trials}) == 12
    parents, _ = _runs(tmp_path, "capped")
    assert parents[0].info.status == "RUNNING"  # 4 slots still wait
    log = tmp_path / "last.log"
    _wait_all([_worker(config, log, trial_s=0.2)], [log])
    trials = _trials(postgres_url, "capped")
    assert len(trials) == 12 and all(t.state == TS.COMPLETE for t in trials)
    _assert_each_point_complete_once(trials)
    parents, _ = _runs(tmp_path, "capped")
    assert parents[0].info.status == "FINISHED"


def test_a_killed_worker_trial_is_failed_and_requeued_by_the_next_worker(tmp_path, postgres_url):
    config = _config(tmp_path, postgres_url, "kill")
    doomed_log = tmp_path / "killed.log"
    doomed = _worker(config, doomed_log, trial_s=600)  # sure to be mid-trial when killed

    def running():
        trials = [t for t in _trials(postgres_url, "kill") if t.state == TS.RUNNING]
        return trials[0] if trials and "mlflow_run_id" in trials[0].user_attrs else None

    victim = _wait_for(running, "the first worker's trial to run", [(doomed, doomed_log)])
    doomed.send_signal(signal.SIGKILL)  # no cleanup: the trial stays RUNNING, its heartbeat stops
    doomed.wait()
    killed_at = time.time()
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    _wait_all([_worker(config, log, trial_s=0.5) for log in logs], logs)
    trials = _trials(postgres_url, "kill")
    raw = yaml.safe_load(config.read_text())
    # the retry waited for the heartbeat to go stale (its last beat came at most one interval before the kill)
    assert time.time() - killed_at >= raw["grace_period"] - raw["heartbeat_interval"]
    assert trials[victim.number].state == TS.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and retries[0].state == TS.COMPLETE and _point(retries[0]) == _point(victim)
    assert len(trials) == 13 and Counter(t.state for t in trials) == {TS.COMPLETE: 12, TS.FAIL: 1}
    _assert_each_point_complete_once(trials)
    assert any("went stale" in log.read_text() for log in logs)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    dead = client.get_run(victim.user_attrs["mlflow_run_id"])
    assert dead.info.status == "FAILED" and dead.data.tags["optuna.trial_state"] == "FAIL"


def test_a_server_restart_mid_sweep_is_retried_and_the_sweep_finishes(tmp_path, postgres_url, postgres_server):
    config = _config(tmp_path, postgres_url, "restart")
    logs = [tmp_path / f"worker{i}.log" for i in range(4)]
    procs = [_worker(config, log, trial_s=2, barrier=4) for log in logs]

    def mid_sweep():  # some trials done, some running, some waiting: the server goes in the middle of it all
        states = Counter(t.state for t in _trials(postgres_url, "restart"))
        return states[TS.COMPLETE] >= 1 and states[TS.RUNNING] >= 1 and states[TS.WAITING] >= 1

    _wait_for(mid_sweep, "the sweep to be under way", list(zip(procs, logs)))
    postgres_server.restart(down_s=3)  # every open connection is dropped; new ones are refused for ~3 s
    _wait_all(procs, logs)
    text = "\n".join(log.read_text() for log in logs)
    assert "; retry 1 in 0.5 s" in text, "no worker met the restart (nothing was retried)"
    assert "; retry 2 in 1.0 s" in text, "no call waited a doubled backoff through the ~3 s outage"
    trials = _trials(postgres_url, "restart")
    assert len(trials) == 12 and all(t.state == TS.COMPLETE for t in trials), [t.state for t in trials]
    _assert_each_point_complete_once(trials)
    parents, children = _runs(tmp_path, "restart")
    assert parents[0].info.status == "FINISHED" and sorted(children) == list(range(12))
    assert all(r.info.status == "FINISHED" for r in children.values())
