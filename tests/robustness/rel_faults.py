"""Test-only fault injection for the resume tests (imported by ``python -m lit_rl fit`` subprocesses
through ``PYTHONPATH=tests/robustness``): a real SIGKILL/SIGTERM to the training process at a chosen
point, and a SIGKILL in the middle of writing a checkpoint."""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L


class KillAt(L.Callback):
    """Send ``sig`` to this process right before optimizer update ``step + 1`` (``global_step == step``).

    ``step`` need not be a multiple of updates_per_batch: the kill can land between two of the μ updates of
    one rollout batch.
    """

    def __init__(self, step: int, sig: str = "SIGKILL", times: int = 1) -> None:
        self.step, self.sig, self.times, self.sent = step, sig, times, False

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.sent and trainer.global_step == self.step:
            self.sent = True
            with open(os.path.join(trainer.default_root_dir, "fault.txt"), "w") as fh:
                fh.write(f"{self.sig} x{self.times} at global_step {trainer.global_step}\n")
            for _ in range(self.times):  # a second one lands while the first one's stop is pending
                os.kill(os.getpid(), getattr(signal, self.sig))


class _DieWhilePickled:
    """Pickling this object SIGKILLs the process: torch.save is then half-way through the checkpoint."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        return (int, (0,))


class KillDuringSave(L.Callback):
    """SIGKILL this process while it writes the checkpoint of ``global_step == step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.global_step == self.step:
            with open(os.path.join(trainer.default_root_dir, "fault.txt"), "w") as fh:
                fh.write(f"SIGKILL while saving global_step {trainer.global_step}\n")
            # a large tensor first, so the kill lands after real bytes of the new file were written
            import torch

            checkpoint["zz_padding"] = torch.zeros(2_000_000)
            checkpoint["zz_die"] = _DieWhilePickled()


class FillDiskAt(L.Callback):
    """Fill the file system holding ``path`` right before update ``step + 1``: a filler file written until the
    disk refuses (ENOSPC), as another process filling a shared disk would."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path, self.done = step, path, False

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self.done or trainer.global_step < self.step:
            return
        self.done = True
        for name, chunk in (("filler.bin", 1 << 16), ("filler-small.bin", 512)):
            try:
                with open(os.path.join(self.path, name), "wb") as fh:
                    while True:
                        fh.write(b"\0" * chunk)
                        fh.flush()
            except OSError:
                pass
