"""Unit checks of the atomic checkpoint writer and the RNG-state helpers (fast; the subprocess kills are in
test_resume.py)."""

from __future__ import annotations

import io
import random
import re

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rl.checkpoint_io import AtomicCheckpointIO, atomic_torch_save, capture_rng_state, restore_rng_state


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io_ = AtomicCheckpointIO()
    io_.save_checkpoint({"step": 1, "w": torch.arange(4.0)}, path)
    real_save = torch.save

    def half_then_crash(obj, f, *a, **k):
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(OSError):
        io_.save_checkpoint({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the temp file is gone


def test_stale_partial_files_are_never_taken_for_last_and_are_cleaned(tmp_path):
    stale = tmp_path / ".last.ckpt.abc123.partial"  # what a SIGKILLed writer leaves
    stale.write_bytes(b"torn")
    pattern = rf"^{ModelCheckpoint.CHECKPOINT_NAME_LAST}(-(\d+))?"
    assert not (stale.suffix == ModelCheckpoint.FILE_EXTENSION and re.match(pattern, stale.stem))
    atomic_torch_save({"step": 3}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"step": 3}


def test_rng_state_roundtrip_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = capture_rng_state()
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    atomic_torch_save({"rng": state}, tmp_path / "s.ckpt")
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(torch.load(tmp_path / "s.ckpt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect
