"""lit_rl/resume.py: which checkpoint ``--ckpt_path last`` resumes from when the newest one cannot be read
(:func:`~lit_rl.resume.resolve_checkpoint` on a copy of a real run). The fits that resume through the CLI (one
checkpoint truth, one MLflow run continued, the guards against another run's checkpoint) are in
tests/robustness/test_resume_truth.py, the real SIGKILL and SIGTERM of a training process in
tests/robustness/test_resume.py."""

from __future__ import annotations

import os

import pytest


from support.resume_runs import copy_run as _copy


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_unreadable_last_ckpt_falls_back_with_one_line(resume_base, tmp_path, caplog, damage):
    run = _copy(resume_base, tmp_path / "run")
    last = run / "checkpoints/last.ckpt"
    data = last.read_bytes()
    last.write_bytes({"truncated": data[: len(data) // 3], "empty": b"", "random": os.urandom(4096)}[damage])
    os.utime(last, (last.stat().st_mtime + 10,) * 2)  # newest, as a torn write would be
    from lit_rl.resume import resolve_checkpoint

    class _Trainer:  # what resolve_checkpoint reads of a trainer: its checkpoint folders
        checkpoint_callbacks, callbacks, default_root_dir = [], [], str(run)

    with caplog.at_level("INFO"):
        path, _ = resolve_checkpoint("last", _Trainer())
    assert path == run / "checkpoints/epoch=0-step=4.ckpt"
    lines = [r.message for r in caplog.records if r.message.startswith("resume:")]
    assert len(lines) == 2 and lines[0].startswith(f"resume: skipped {last}: cannot be read (") and "\n" not in lines[0]
