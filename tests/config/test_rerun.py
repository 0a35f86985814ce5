"""lit_rl/config/rerun.py: a fit into a folder that holds an earlier run's checkpoints is refused in one line unless
it resumes (``--ckpt_path last``) or starts over (``--overwrite true``); reproduce resumes its own jobs."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_rl.cli import main
from lit_rl.config.rerun import check_rerun, checkpoint_folders, clear_run

from support.resume_runs import run_args as _args  # noqa: E402
from support.resume_runs import run_cli as _run  # noqa: E402

CKPT = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": "/x/ck"}}


def test_the_checkpoint_folders_of_a_config():
    assert checkpoint_folders("runs/a", None) == [Path("runs/a/checkpoints")]
    assert checkpoint_folders("runs/a", [{"class_path": "callbacks.RolloutTracker"}]) == [Path("runs/a/checkpoints")]
    assert checkpoint_folders("runs/a", [CKPT, {"class_path": "ModelCheckpoint"}]) == [
        Path("/x/ck"), Path("runs/a/checkpoints")]


def test_a_folder_with_checkpoints_is_refused_unless_resumed_or_overwritten(tmp_path):
    assert check_rerun(tmp_path, None, None, False) is None  # nothing there
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/.last.ckpt.x.partial").write_bytes(b"")  # a temp file is no checkpoint
    assert check_rerun(tmp_path, None, None, False) is None
    torch.save({"global_step": 4}, tmp_path / "checkpoints/last.ckpt")
    torch.save({"global_step": 4}, tmp_path / "checkpoints/epoch=0-step=4.ckpt")
    line = check_rerun(tmp_path, None, None, False)
    assert line.startswith(f"{tmp_path / 'checkpoints'} already holds 2 checkpoint(s) of an earlier run (newest ")
    assert line.endswith("--ckpt_path last resumes it; --overwrite true starts over (removes them first); or choose "
                         "another trainer.default_root_dir")
    assert check_rerun(tmp_path, None, "last", False) is None and check_rerun(tmp_path, None, None, True) is None
    (tmp_path / "mlflow_runs.json").write_text("{}")
    assert sorted(clear_run([tmp_path / "checkpoints"], tmp_path)) == ["epoch=0-step=4.ckpt", "last.ckpt",
                                                                       "mlflow_runs.json"]
    assert check_rerun(tmp_path, None, None, False) is None


def test_rerunning_a_fit_is_refused_then_overwrite_starts_over(tmp_path):
    import mlflow

    run = tmp_path / "run"
    assert main(_args(run, 4)) == 0
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    rc, err = _run(_args(run, 4))  # the same command again
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "already holds 2 checkpoint(s) of an earlier run" in errors[0], err[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing touched
    client = mlflow.tracking.MlflowClient(f"sqlite:///{run}/mlflow.db")
    runs = lambda: [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]  # noqa: E731
    assert len(runs()) == 1
    rc, err = _run([*_args(run, 4), "--overwrite=true"])
    assert rc == 0, err[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # the new run's, the old ones gone
    assert len(runs()) == 2 and sorted(r.info.status for r in runs()) == ["FINISHED", "FINISHED"]


def test_reproduce_fit_jobs_resume_their_own_checkpoints(tmp_path):
    from lit_rl.reproduce.runner import fit_job

    job = fit_job("grpo_s0", [Path("conf/double_rollout.yaml")], 0, 42, 2, tmp_path, "exp", {"group": "grpo"})
    assert "--ckpt_path=last" in job.argv
    same = fit_job("grpo_s0", [Path("conf/double_rollout.yaml")], 0, 42, 2, tmp_path, "exp", {"group": "grpo"})
    same.argv = [a for a in same.argv if a != "--ckpt_path=last"]
    assert same.digest == job.digest  # a study finished before this flag is still done
