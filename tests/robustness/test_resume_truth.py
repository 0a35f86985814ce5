"""One checkpoint truth, one MLflow run per training run, resume guards.

Tiny ERILS fits in this process through ``lit_rl.cli.main`` (2 updates per rollout batch, a checkpoint every
2 updates, ``last.ckpt``, MLflow in sqlite), a few seconds each:

* SIGTERM, then ``--ckpt_path last``: ``last.ckpt`` is the newest state (no ``last-v1.ckpt``), the run is one
  MLflow run, KILLED after the SIGTERM and FINISHED at the end;
* a run left RUNNING (what ``kill -9`` leaves) is continued by the resume;
* a checkpoint write that fails (ENOSPC) is one line naming the file and the free space, the previous
  ``last.ckpt`` stays, and ``--ckpt_path last`` resumes from the newest readable checkpoint;
* an unreadable ``last.ckpt`` is skipped with one line; another task or architecture is refused with one line.

The real SIGKILL and SIGTERM of a training process are in ``tests/robustness/test_resume.py`` (slow);
:func:`lit_rl.resume.resolve_checkpoint` alone, on a damaged copy of the run, in ``tests/test_resume.py``.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.checkpoint_io import AtomicCheckpointIO
from lit_rl.cli import main

from support.resume_runs import copy_run as _copy  # noqa: E402
from support.resume_runs import run_args as _args  # noqa: E402
from support.tmpfs import mount_tmpfs  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # rel_faults, for the SIGTERM injector's class_path


def _step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def _runs(run: Path) -> list:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _loss_steps(run: Path, run_id: str) -> list[int]:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    return sorted({m.step for m in client.get_metric_history(run_id, "train/loss")})


def _lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


# ---------------------------------------------------------------------------------------------------------
# 1. one checkpoint truth
# ---------------------------------------------------------------------------------------------------------
def test_sigterm_then_resume_keeps_last_ckpt_newest_and_one_mlflow_run(tmp_path, caplog):
    run = tmp_path / "run"
    # SIGTERM before update 2: the rollout batch finishes, last.ckpt at step 2 (before any periodic save)
    kill = {"class_path": "rel_faults.KillAt", "init_args": {"step": 1, "sig": "SIGTERM"}}
    with pytest.raises(SystemExit) as stop:
        main(_args(run, 8, callbacks=(kill,)))
    assert stop.value.code in (None, 0)
    assert _step(run / "checkpoints/last.ckpt") == 2
    (first,) = _runs(run)
    assert first.info.status == "KILLED"  # stopped from outside, resumable: not FAILED, not FINISHED
    caplog.clear()
    assert main(_args(run, 8, "--ckpt_path", "last")) == 0
    assert [r.message for r in caplog.records if r.message.startswith("resume:")][0] == (
        f"resume: from {run / 'checkpoints/last.ckpt'} (step 2)")
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["epoch=0-step=8.ckpt", "last.ckpt"], names  # Lightning alone wrote last-v1.ckpt
    assert _step(run / "checkpoints/last.ckpt") == 8
    (resumed,) = _runs(run)
    assert resumed.info.run_id == first.info.run_id and resumed.info.status == "FINISHED"
    assert _loss_steps(run, first.info.run_id)[-1] == 8  # the curve goes on in the same run


def test_a_run_left_running_by_kill9_is_continued_by_the_resume(resume_base, tmp_path):
    run = _copy(resume_base, tmp_path / "run")
    (first,) = _runs(run)
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    client.update_run(first.info.run_id, status="RUNNING")  # a SIGKILLed process never ends its run
    assert main(_args(run, 8, "--ckpt_path", "last")) == 0
    (after,) = _runs(run)
    assert after.info.run_id == first.info.run_id and after.info.status == "FINISHED"
    assert _loss_steps(run, first.info.run_id) == [2, 4, 6, 8]  # one point per rollout batch
    assert _step(run / "checkpoints/last.ckpt") == 8
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith("last-")]


def _half_then_enospc(real_save, fail_at_step: int):
    def save(obj, f, *a, **k):
        if isinstance(obj, dict) and obj.get("global_step") == fail_at_step:
            buf = io.BytesIO()
            real_save(obj, buf)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *a, **k)

    return save


def test_failed_write_is_one_line_naming_the_file_and_free_space(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1, "w": torch.arange(4.0)}, path)
    monkeypatch.setattr(torch, "save", _half_then_enospc(torch.save, 2))
    with pytest.raises(Exception) as err:
        AtomicCheckpointIO().save_checkpoint({"global_step": 2, "w": torch.zeros(1000)}, path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "No space left on device" in msg and " free on " in msg, msg
    assert "previous last.ckpt is intact" in msg
    monkeypatch.undo()
    assert _step(path) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_full_disk_during_fit_is_one_error_then_resume_from_the_newest_readable(resume_base, tmp_path, monkeypatch,
                                                                                 capsys, caplog):
    run = _copy(resume_base, tmp_path / "run")
    monkeypatch.setattr(torch, "save", _half_then_enospc(torch.save, 8))  # the disk fills at update 8
    assert main(_args(run, 12, "--ckpt_path", "last")) == 2
    errors = _lines(capsys.readouterr().err, "error:")
    assert len(errors) == 1 and "could not write checkpoint" in errors[0] and "epoch=0-step=8.ckpt" in errors[0]
    assert "No space left on device" in errors[0] and " free on " in errors[0]
    monkeypatch.undo()  # space freed
    assert _step(run / "checkpoints/last.ckpt") == 4  # the checkpoint before the failed write, intact
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    (failed,) = _runs(run)
    assert failed.info.status == "FAILED"
    # what the probe found after a full disk: last.ckpt gone, a periodic checkpoint left
    (run / "checkpoints/last.ckpt").unlink()
    caplog.clear()
    assert main(_args(run, 12, "--ckpt_path", "last")) == 0
    assert f"resume: from {run / 'checkpoints/epoch=0-step=4.ckpt'} (step 4)" in caplog.text
    assert _step(run / "checkpoints/last.ckpt") == 12
    (done,) = _runs(run)
    assert done.info.run_id == failed.info.run_id and done.info.status == "FINISHED"


def test_a_real_full_disk_keeps_last_ckpt_and_names_the_free_space(tmp_path):
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "512k"):
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        io_ = AtomicCheckpointIO()
        io_.save_checkpoint({"global_step": 1, "w": torch.zeros(16)}, disk / "last.ckpt")
        with pytest.raises(Exception) as err:
            io_.save_checkpoint({"global_step": 2, "w": torch.zeros(1_000_000)}, disk / "last.ckpt")  # 4 MB
        msg = str(err.value)
        assert "\n" not in msg and str(disk / "last.ckpt") in msg and " free on " in msg, msg
        assert _step(disk / "last.ckpt") == 1 and sorted(p.name for p in disk.iterdir()) == ["last.ckpt"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_unreadable_last_ckpt_through_the_cli_then_an_explicit_one_is_refused(resume_base, tmp_path, capsys, caplog):
    run = _copy(resume_base, tmp_path / "run")
    last = run / "checkpoints/last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    assert main(_args(run, 8, "--ckpt_path", "last")) == 0
    assert f"resume: skipped {last}: cannot be read (" in caplog.text
    assert f"resume: from {run / 'checkpoints/epoch=0-step=4.ckpt'} (step 4)" in caplog.text
    assert _step(last) == 8  # and last.ckpt is the newest state again
    bad = run / "checkpoints/bad.ckpt"
    bad.write_bytes(b"")
    capsys.readouterr()
    assert main(_args(run, 8, "--ckpt_path", str(bad))) == 2
    (line,) = _lines(capsys.readouterr().err, "error:")
    assert line == f"error: checkpoint {bad} cannot be read (empty file); --ckpt_path last resumes from the newest " \
                   "readable checkpoint of the run"


# ---------------------------------------------------------------------------------------------------------
# 3. resume guards
# ---------------------------------------------------------------------------------------------------------
def test_a_checkpoint_of_another_task_is_refused_with_one_line(resume_base, tmp_path, capsys, monkeypatch):
    ckpt = resume_base / "checkpoints/last.ckpt"
    run = tmp_path / "prompts"
    args = _args(run, 8, f"--ckpt_path={ckpt}", config="conf/prompts.yaml")
    assert main(args) == 2
    (line,) = _lines(capsys.readouterr().err, "error:")
    assert line.startswith(f"error: checkpoint {ckpt} is from another run: task is sudoku (lit_rl.tasks.SudokuTask) "
                           "there, prompts (lit_rl.tasks.PromptTask) here"), line
    assert "LIT_RL_ALLOW_RESUME_MISMATCH=1" in line
    assert not (run / "checkpoints").exists()  # nothing trained
    monkeypatch.setenv("LIT_RL_ALLOW_RESUME_MISMATCH", "1")
    assert main(args) == 0  # the explicit override: the weights fit, the run goes on


def test_a_checkpoint_of_another_architecture_is_refused_with_one_line(resume_base, tmp_path, capsys):
    ckpt = resume_base / "checkpoints/last.ckpt"
    assert main(_args(tmp_path / "wide", 8, f"--ckpt_path={ckpt}",
                      "--model.init_args.policy.init_args.hidden_size=48")) == 2
    (line,) = _lines(capsys.readouterr().err, "error:")
    assert line.startswith(f"error: checkpoint {ckpt} does not fit this model (model.init_args.policy): policy."), line
    assert "is [" in line and "] there, [" in line and "48" in line and "start over with --overwrite true" in line


def test_a_checkpoint_of_another_algorithm_config_is_refused_naming_the_key(resume_base, tmp_path, capsys):
    ckpt = resume_base / "checkpoints/last.ckpt"
    assert main(_args(tmp_path / "joint", 8, f"--ckpt_path={ckpt}",
                      "--model.init_args.advantages=lit_rl.algorithms.advantages.Joint")) == 2
    (line,) = _lines(capsys.readouterr().err, "error:")
    assert line.startswith(f"error: checkpoint {ckpt} is from another run: model.init_args.advantages.class_path "
                           "is lit_rl.algorithms.advantages.SourceSpecific there, lit_rl.algorithms.advantages.Joint "
                           f"here; resume with its config ({resume_base / 'config.yaml'})"), line


def _enospc_on(real_save, step: int, name: str):
    """lit_rl.checkpoint_io.atomic_torch_save that fails with ENOSPC for the checkpoint of ``step`` written to
    the file ``name`` (the others are written)."""
    def save(obj, path):
        if isinstance(obj, dict) and obj.get("global_step") == step and Path(path).name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, path)

    return save


def test_the_step_whose_checkpoint_write_failed_keeps_its_metrics(tmp_path, monkeypatch):
    """The disk fills between the periodic checkpoint of update 4 and ``last.ckpt``: the fit stops (one line),
    the resume restarts after update 4 from the periodic file. Update 4's metrics were never logged before
    (the run had train/loss at 2, 6, 8); now every step is in the run once."""
    run = tmp_path / "run"
    import lit_rl.checkpoint_io as cio

    monkeypatch.setattr(cio, "atomic_torch_save", _enospc_on(cio.atomic_torch_save, 4, "last.ckpt"))
    assert main(_args(run, 8)) == 2
    monkeypatch.undo()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["epoch=0-step=4.ckpt"]  # last.ckpt failed
    (failed,) = _runs(run)
    assert _loss_steps(run, failed.info.run_id) == [2, 4]
    assert main(_args(run, 8, "--ckpt_path", "last")) == 0
    (done,) = _runs(run)
    assert done.info.run_id == failed.info.run_id and done.info.status == "FINISHED"
    assert _loss_steps(run, failed.info.run_id) == [2, 4, 6, 8]
