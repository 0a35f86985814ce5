"""lit_rl/runs.py: where a run's local files go, without Lightning's rank-0 broadcast."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lightning.pytorch.loggers import CSVLogger

from lit_rl.runs import run_dir


class _RemoteLogger:  # not a TensorBoard / CSV logger: its save_dir, not a log_dir, is the folder
    log_dir = "/wrong/log_dir"
    save_dir = "/runs/mlruns"


def test_run_dir_prefers_output_dir_then_the_first_loggers_folder_then_the_root(tmp_path):
    csv = CSVLogger(save_dir=str(tmp_path), name="exp", version=3)
    trainer = SimpleNamespace(loggers=[csv, _RemoteLogger()], default_root_dir="/root")
    assert run_dir(trainer, output_dir="/out") == Path("/out")
    assert run_dir(trainer) == tmp_path / "exp" / "version_3"
    assert run_dir(SimpleNamespace(loggers=[_RemoteLogger(), csv], default_root_dir="/root")) == Path("/runs/mlruns")
    assert run_dir(SimpleNamespace(loggers=[], default_root_dir="/root")) == Path("/root")
    assert run_dir(SimpleNamespace(loggers=[SimpleNamespace(save_dir=None)], default_root_dir="/root")) == Path("/root")
