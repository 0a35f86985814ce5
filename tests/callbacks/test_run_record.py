"""callbacks/run_record.py: every checkpoint records the run, and a run keeps writing the ``last.ckpt`` it found."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from callbacks.run_record import RunRecord
from lit_rl.resume import RECORD_KEY


def _fit(tmp_path, callbacks, max_steps: int) -> None:
    ckpt = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=2)
    Trainer(max_steps=max_steps, callbacks=[ckpt, *callbacks], default_root_dir=tmp_path, logger=False,
            limit_val_batches=0, accelerator="cpu", devices=1, enable_progress_bar=False).fit(BoringModel())


def test_a_run_overwrites_the_last_ckpt_it_found_instead_of_versioning_it(tmp_path):
    """A ``last.ckpt`` this run did not write (an interrupted run's): Lightning alone writes ``last-v1.ckpt`` and
    leaves ``last.ckpt`` stale; with RunRecord the newest state goes to ``last.ckpt``, the file resumes read."""
    for run, callbacks in (("plain", []), ("recorded", [RunRecord(components={"model": "BoringModel"})])):
        (tmp_path / run / "checkpoints").mkdir(parents=True)
        torch.save({"stale": True}, tmp_path / run / "checkpoints" / "last.ckpt")
        _fit(tmp_path / run, callbacks, max_steps=4)
    assert (tmp_path / "plain/checkpoints/last-v1.ckpt").is_file()  # what RunRecord prevents
    assert torch.load(tmp_path / "plain/checkpoints/last.ckpt") == {"stale": True}
    folder = tmp_path / "recorded/checkpoints"
    assert not (folder / "last-v1.ckpt").exists()
    last = torch.load(folder / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4  # the newest state
    record = last[RECORD_KEY]  # what a resume checks: the run's identity and its components
    assert record["components"] == {"model": "BoringModel"} and "identity" in record and "mlflow" in record
