"""callbacks/resume.py: CheckpointOnSigterm's settings and a signal during the first (sanity) evaluation. The
signals in the middle of training, with their checkpoints and MLflow runs, are in tests/robustness/test_signals.py."""

from __future__ import annotations

import os
import signal

import lightning as L
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from callbacks.resume import CheckpointOnSigterm
from lit_rl.errors import ConfigError


def test_signals_outside_the_handled_ones_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^CheckpointOnSigterm.signals: \['SIGKILL'\] not handled"):
        CheckpointOnSigterm(signals=["SIGTERM", "SIGKILL"])
    with pytest.raises(ConfigError, match="CheckpointOnSigterm.signals"):
        CheckpointOnSigterm(signals=[])
    assert CheckpointOnSigterm().signals == ["SIGTERM", "SIGINT"]


class _SignalInSanity(L.Callback):
    def __init__(self, sig: int) -> None:
        self.sig = sig

    def on_validation_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.sanity_checking:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_sanity_evaluation_stops_before_the_first_update(tmp_path, sig, caplog):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stopper = CheckpointOnSigterm()
    trainer = Trainer(max_steps=4, callbacks=[stopper, _SignalInSanity(sig)], default_root_dir=tmp_path,
                      logger=False, enable_checkpointing=False, num_sanity_val_steps=1, limit_val_batches=1,
                      accelerator="cpu", devices=1, enable_progress_bar=False)
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert trainer.global_step == 0 and stopper.requested and not stopper.forced
    label = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert f"{label}: stopped before update 1, nothing new to save" in caplog.text
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # handlers restored
