"""Sweeps: config parsing, the exit status of ``python -m lit_rl sweep``, two workers sharing one SQLite study, and
resume after a worker is killed mid-trial (:mod:`lit_rl.sweep.runner`, :mod:`lit_rl.sweep.derived` and
:mod:`lit_rl.sweep.pruning` have their own test files: a derived rule that fails its trial and a tiny real sweep
through the LightningCLI with MLflow parent/child runs are in test_runner.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from lit_rl.sweep import ParamSpec, SweepConfig, run_sweep
from lit_rl.sweep import main as sweep_main

from support.sweeps import POOL, ROOT  # noqa: E402
from support.sweeps import sweep_runs as _runs  # noqa: E402
from support.sweeps import tiny_sweep as _cfg  # noqa: E402
TS = optuna.trial.TrialState
optuna.logging.set_verbosity(optuna.logging.WARNING)


# ------------------------------------------------------------------------------------------ pieces


def test_config_validation_names_the_key_and_builds_the_grid(tmp_path):
    with pytest.raises(ValueError, match="space.rho: needs low <= high"):
        ParamSpec("rho", "float", low=1.0, high=0.5)
    with pytest.raises(ValueError, match="space.rho.grid: value 1.5 lies outside"):
        ParamSpec("rho", "float", low=0.5, high=0.99, grid=[1.5])
    with pytest.raises(ValueError, match="n_trials: required unless sampler.name is grid"):
        SweepConfig.from_dict(_cfg(tmp_path, sampler={"name": "tpe"}))
    with pytest.raises(ValueError, match="tracking_uri"):
        SweepConfig.from_dict(_cfg(tmp_path, tracking_uri="runs/mlruns"))
    with pytest.raises(ValueError, match="unknown key 'n_trail' \\(did you mean 'n_trials'\\?\\)"):
        SweepConfig.from_dict(_cfg(tmp_path, n_trail=3))
    cfg = SweepConfig.from_yaml(ROOT / "conf/sweeps/double_rollout_grid.yaml")
    grid = cfg.grid()
    assert len(grid) == cfg.target_trials() == 20  # {0.5, 0.75, 0.9, 0.99} x {1, 2, 4, 8, 16}
    assert {"model.init_args.double_rollout.rho": 0.99, "model.init_args.double_rollout.num_continuations": 16} in grid
    tpe = SweepConfig.from_yaml(ROOT / "conf/sweeps/double_rollout.yaml")
    assert len(SweepConfig.from_dict({**yaml.safe_load((ROOT / "conf/sweeps/double_rollout.yaml").read_text()),
                                      "sampler": {"name": "grid"}}).grid()) == 20
    assert tpe.target_trials() == 20 and tpe.space["model.init_args.double_rollout.rho"].low == 0.5
    gext = SweepConfig.from_yaml(ROOT / "conf/sweeps/erils_gext.yaml")
    points = [gext.trial_values(p) for p in gext.grid()]  # Fig. 8: G = 6, G_ext 1..4, 3 seeds each
    assert sorted((p["data.init_args.g_ext"], p["data.init_args.g_on"], p["seed_everything"], p["data.init_args.seed"],
                   p["model.init_args.seed"]) for p in points) == [
        (e, 6 - e, s, 42 + s, s) for e in (1, 2, 3, 4) for s in (0, 1, 2)]


@pytest.mark.parametrize("path", sorted((ROOT / "conf/sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweeps_parse(path):
    cfg = SweepConfig.from_yaml(path)
    assert cfg.target_trials() >= 1
    cfg.make_sampler(), cfg.make_pruner()


@pytest.mark.parametrize("path", sorted((ROOT / "conf/sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweep_points_parse_with_their_training_config(path, tmp_path, monkeypatch):
    """Every searched/derived key exists in the base config: the first grid point (or the lower bounds)
    parses with the LightningCLI parser, as a trial would pass it."""
    monkeypatch.chdir(ROOT)
    from jsonargparse import ActionConfigFile
    from lightning.pytorch import LightningDataModule, LightningModule, Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    cfg = SweepConfig.from_yaml(path)
    point = {k: (s.grid_values()[0] if s.type == "categorical" or s.grid else s.low) for k, s in cfg.space.items()}
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump(cfg.overrides or {}))
    args = cfg.cli_args(cfg.trial_values(point), tmp_path, overlay, "0" * 32, "t")
    parser = LightningArgumentParser()
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_lightning_class_args(LightningModule, "model", subclass_mode=True)
    parser.add_lightning_class_args(LightningDataModule, "data", subclass_mode=True)
    parser.add_argument("--seed_everything", type=int | bool | None, default=None)
    parser.add_argument("--threads", type=int | None, default=None)
    parser.add_lightning_class_args(Trainer, "trainer")
    from lit_rl.config.edits import expand_list_edits

    parsed = parser.parse_args(expand_list_edits(args))  # a base's callbacks~ edits, as the sweep's trial CLI expands
    for key, value in cfg.trial_values(point).items():
        assert parsed[key] == value


# -------------------------------------------------------------------------------- real tiny sweeps


def test_a_worker_whose_trials_all_fail_exits_1_and_says_so(tmp_path, monkeypatch, capsys, recwarn):
    """Through ``python -m lit_rl sweep``'s entry point: a scheduler must see the worker fail; the trial's
    LightningCLI is not handed the sweep's own command line (Lightning warns about args + sys.argv)."""
    monkeypatch.chdir(ROOT)
    raw = _cfg(tmp_path, study_name="allbad", space={"trainer.max_steps": {"type": "categorical",
                                                                           "choices": ["many", "more"]}},
               derived={})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    # the check against the base config refuses these choices before any trial (tests/sweep/test_validate.py);
    # left out here so that the trials run and fail
    monkeypatch.setattr("lit_rl.sweep.check_against_base", lambda cfg: None)
    monkeypatch.setattr(sys, "argv", ["python -m lit_rl sweep", "--config", str(path)])
    assert sweep_main(["--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error: all 2 trials this worker ran failed (trials [0, 1])" in err
    assert not [w for w in recwarn if "sys.argv" in str(w.message)]
    assert sys.argv == ["python -m lit_rl sweep", "--config", str(path)]  # given back after each trial


def test_exit_status_is_1_only_when_every_trial_the_worker_ran_failed(capsys):
    from lit_rl.sweep import _exit_status

    study = optuna.create_study()
    for state in (TS.FAIL, TS.COMPLETE, TS.PRUNED, TS.FAIL):
        study.tell(study.ask(), 0.5 if state == TS.COMPLETE else None, state=state)
    assert _exit_status(study, []) == 0  # nothing left to run
    assert _exit_status(study, [0, 1]) == 0 and _exit_status(study, [2]) == 0  # one COMPLETE or PRUNED is enough
    assert capsys.readouterr().err == ""
    assert _exit_status(study, [0, 3]) == 1
    assert "all 2 trials this worker ran failed (trials [0, 3])" in capsys.readouterr().err


def _worker_config(tmp_path: Path, study: str) -> Path:
    raw = _cfg(
        tmp_path,
        study_name=study,
        space={
            "data.init_args.g_ext": {"type": "categorical", "choices": [1, 2]},
            "model.init_args.optimizer.init_args.lr": {"type": "categorical", "choices": [0.0001, 0.0002]},
        },
        derived={"data.init_args.g_on": "3 - g_ext"},
        objective={"metric": "train/loss", "direction": "minimize"},
        pruner={"name": "none"},
        prune_monitor=None,
    )
    path = tmp_path / f"{study}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _worker(config: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIT_RL_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen(
        [sys.executable, "-m", "lit_rl.sweep", "--config", str(config), *extra],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_two_workers_share_one_sqlite_study(tmp_path):
    """Two worker processes on one SQLite study. Each is capped at 2 trials (``--max_trials``), so the
    4 grid points need both: without the cap, a worker that starts late on a loaded machine can find the
    other one done with all four (CI saw that once)."""
    config = _worker_config(tmp_path, "shared")
    procs = [_worker(config, tmp_path / f"worker{i}.log", "--max_trials", "2") for i in range(2)]
    for i, p in enumerate(procs):
        assert p.wait(timeout=480) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = study.trials
    assert len(trials) == 4 and all(t.state == TS.COMPLETE for t in trials)
    grid_points = {(t.params["data.init_args.g_ext"], t.params["model.init_args.optimizer.init_args.lr"])
                   for t in trials}
    assert len(grid_points) == 4  # every grid point once: no duplicates, none missing
    workers = [t.user_attrs["worker"] for t in trials]
    assert sorted(workers.count(w) for w in set(workers)) == [2, 2], workers
    workers = set(workers)
    parents, children = _runs(tmp_path, "shared")
    assert len(parents) == 1 and sorted(children) == [0, 1, 2, 3]
    assert {r.data.tags["lit_rl.worker"] for r in children.values()} == workers


@pytest.mark.slow
def test_resume_after_a_worker_is_killed_mid_trial(tmp_path):
    config = _worker_config(tmp_path, "crash")
    proc = _worker(config, tmp_path / "killed.log")
    storage = f"sqlite:///{tmp_path}/optuna.db"
    deadline = time.time() + 240
    while time.time() < deadline:  # wait until trial 0 is running and its MLflow child run exists
        try:
            trials = optuna.load_study(study_name="crash", storage=storage).trials
        except Exception:  # noqa: BLE001 - the study is not there yet
            trials = []
        if trials and trials[0].state == TS.RUNNING and "mlflow_run_id" in trials[0].user_attrs:
            break
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        time.sleep(0.2)
    else:
        pytest.fail("trial 0 never started")
    proc.send_signal(signal.SIGKILL)  # no cleanup: trial 0 stays RUNNING, its heartbeat stops
    proc.wait()
    killed_run = trials[0].user_attrs["mlflow_run_id"]
    killed_params = trials[0].params or trials[0].system_attrs.get("fixed_params")

    # resume in this process, as re-running the command would: the stale trial is failed and retried
    study = run_sweep(SweepConfig.from_dict(yaml.safe_load(config.read_text())))
    trials = sorted(study.trials, key=lambda t: t.number)
    assert trials[0].state == TS.FAIL
    done = [t for t in trials if t.state == TS.COMPLETE]
    assert len(done) == 4 and len(trials) == 5
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retry) == 1 and retry[0].state == TS.COMPLETE and retry[0].params == killed_params
    assert len({tuple(sorted(t.params.items())) for t in done}) == 4
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    dead = client.get_run(killed_run)
    assert dead.info.status == "FAILED" and dead.data.tags["optuna.trial_state"] == "FAIL"
    assert client.get_run(retry[0].user_attrs["mlflow_run_id"]).info.status == "FINISHED"


@pytest.mark.slow
def test_ddp_spawn_trials_complete_and_prune_across_processes(tmp_path):
    """A real 2-process ``ddp_spawn`` (gloo) trial per grid point: the trainer and the pruning callback
    are pickled into the spawned ranks; rank 0 of the children reports and prunes, and ``check_pruned()``
    in the sweep process replays that decision (trial 1's lr is pruned by the threshold pruner)."""
    raw = _cfg(
        tmp_path,
        study_name="ddp",
        overrides={
            # 2 eval batches per rank
            "data": {"init_args": {"pool_path": str(POOL), "eval_size": 8, "eval_batch_size": 2}},
            "trainer": {"strategy": "ddp_spawn", "devices": 2, "accelerator": "cpu"},
        },
        space={"data.init_args.g_ext": {"type": "categorical", "choices": [1, 3]}},
    )
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc = _worker(config, tmp_path / "ddp.log")
    assert proc.wait(timeout=480) == 0, (tmp_path / "ddp.log").read_text()[-3000:]
    study = optuna.load_study(study_name="ddp", storage=f"sqlite:///{tmp_path}/optuna.db")
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state for t in trials] == [TS.COMPLETE, TS.PRUNED], (tmp_path / "ddp.log").read_text()[-3000:]
    assert 0.0 <= trials[0].value <= 1.0  # greedy accuracy pooled over the two ranks
    assert sorted(trials[0].intermediate_values) == [2, 4]  # reported at global_step by the spawned rank 0
    assert list(trials[1].intermediate_values) == [2] and trials[1].intermediate_values[2] > 0.01
    _, children = _runs(tmp_path, "ddp")
    assert [children[n].info.status for n in range(2)] == ["FINISHED", "KILLED"]
    assert "train/on_policy/reward_mean" in children[0].data.metrics  # the children's logger wrote the child run


def test_trial_budget_flags_reach_every_trial(tmp_path, monkeypatch):
    """``--max_steps``, ``--eval_size`` and ``--overlay``: a short sweep without editing the sweep file; the check
    against the base config sees them, and each trial's command line carries them."""
    monkeypatch.chdir(ROOT)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_cfg(tmp_path, study_name="budget")))
    overlay = tmp_path / "short.yaml"
    overlay.write_text("trainer:\n  val_check_interval: 2\n")
    seen = {}

    class Stop(Exception):
        pass

    def capture(cfg):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr("lit_rl.sweep.SweepRunner", capture)
    with pytest.raises(Stop):
        sweep_main(["--config", str(path), "--max_steps", "4", "--eval_size", "2", "--overlay", str(overlay)])
    cfg = seen["cfg"]
    assert cfg.overrides["trainer"]["max_steps"] == 4 and cfg.overrides["data"]["init_args"]["eval_size"] == 2
    assert cfg.base[-1] == str(overlay)
    args = cfg.cli_args({}, tmp_path / "t0", tmp_path / "o.yaml", "rid", "name")
    assert args.index(str(overlay)) < args.index(str(tmp_path / "o.yaml"))  # before the trial's own overlay
    assert sweep_main(["--config", str(path), "--overlay", str(tmp_path / "nope.yaml")]) == 2
