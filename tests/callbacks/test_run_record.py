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


def _save(path, step: int) -> None:
    torch.save({"global_step": step, "state_dict": {}}, path)


def test_old_last_versions_fold_into_last_ckpt_the_newest_state_kept(tmp_path):
    """A folder left by an older run: ``last.ckpt`` at step 4, ``last-v1.ckpt`` at 6, ``last-v2.ckpt`` at 2 and a
    torn ``last-v3.ckpt``: step 6 becomes ``last.ckpt``, the others go, one line says so."""
    from callbacks.run_record import fold_versions

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _save(folder / "last.ckpt", 4)
    _save(folder / "last-v1.ckpt", 6)
    _save(folder / "last-v2.ckpt", 2)
    (folder / "last-v3.ckpt").write_bytes(b"PK\x03\x04 torn")
    _save(folder / "epoch=0-step=4.ckpt", 4)  # not a version of last: kept
    assert fold_versions(folder / "last.ckpt") == ["last-v1.ckpt", "last-v2.ckpt", "last-v3.ckpt"]
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    assert torch.load(folder / "last.ckpt")["global_step"] == 6
    # last.ckpt newest already: the versions are removed, last.ckpt untouched
    _save(folder / "last-v1.ckpt", 5)
    assert fold_versions(folder / "last.ckpt") == ["last-v1.ckpt"]
    assert torch.load(folder / "last.ckpt")["global_step"] == 6 and not (folder / "last-v1.ckpt").exists()
    assert fold_versions(folder / "last.ckpt") == []  # nothing to fold


def test_a_fit_starts_by_folding_a_stale_last_v1(tmp_path):
    """What a run folder of an older lit_rl holds after SIGTERM on a periodic step, then a resume: the stale
    ``last-v1.ckpt`` is gone once the next fit starts there."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _save(folder / "last.ckpt", 0)
    _save(folder / "last-v1.ckpt", 0)
    _fit(tmp_path, [RunRecord()], max_steps=2)
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]


def test_the_checkpoint_the_fit_resumed_from_wins_and_other_names_stay(tmp_path):
    from callbacks.run_record import fold_versions

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _save(folder / "last.ckpt", 4)
    _save(folder / "last-v1.ckpt", 8)
    _save(folder / "last-v2-backup.ckpt", 9)  # not a version Lightning writes: the user's
    assert fold_versions(folder / "last.ckpt", resumed=folder / "last.ckpt") == ["last-v1.ckpt"]
    assert torch.load(folder / "last.ckpt")["global_step"] == 4  # the state this fit runs from, not step 8
    assert sorted(p.name for p in folder.iterdir()) == ["last-v2-backup.ckpt", "last.ckpt"]
