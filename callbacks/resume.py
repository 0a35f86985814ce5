"""Callbacks that make a run resumable exactly: RNG/counter state, a prompt ledger, checkpoint on a signal.

* :class:`ExactResume` puts into every checkpoint what Lightning leaves out: the python/numpy/torch/CUDA
  global RNG states (restored right before the first resumed training batch) and the module's plain
  counters (``skipped_updates``, ``consecutive_skips``; double rollout: ``uninformative_batches``). It also skips the
  sanity-check evaluation on resume: that evaluation is the starting policy's score (the curve's first point), already
  logged.
* :class:`PromptLedger` appends the prompt ids of every consumed rollout batch to
  ``<run dir>/consumed_prompts.jsonl`` (one JSON line per batch). The number of lines is checkpointed and a
  resumed run first cuts the file back to it, so the ledger always lists exactly the prompts the weights have
  seen, each batch once: a kill between two checkpoints leaves no duplicate lines behind.
* :class:`CheckpointOnSigterm` turns SIGTERM (a scheduler's preemption notice) and Ctrl-C into: finish the
  current rollout batch, write ``last.ckpt``, let a validation due at this batch finish, exit cleanly; resume
  with ``--ckpt_path last``. A second signal exits at once. Under DDP all ranks stop at the same batch.

Add them under ``trainer.callbacks`` (``callbacks.ExactResume`` ...), with ``ModelCheckpoint(save_last=True,
every_n_train_steps=μ)`` and ``trainer.plugins: [lit_rl.checkpoint_io.AtomicCheckpointIO]``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Sequence

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_rl.atomic import atomic_write_text
from lit_rl.checkpoint_io import capture_rng_state, restore_rng_state
from lit_rl.runs import run_dir

__all__ = ["CheckpointOnSigterm", "ExactResume", "PromptLedger"]


class ExactResume(L.Callback):
    """Checkpoint the global RNG states and the module's counters; no sanity check on resume.

    Args:
        module_attrs: plain attributes of the LightningModule to checkpoint (missing ones are ignored).
        skip_sanity_on_resume: set ``num_sanity_val_steps = 0`` when fitting from a checkpoint.
    """

    def __init__(
        self,
        module_attrs: Sequence[str] = ("skipped_updates", "consecutive_skips", "uninformative_batches"),
        skip_sanity_on_resume: bool = True,
    ) -> None:
        self.module_attrs = tuple(module_attrs)
        self.skip_sanity_on_resume = skip_sanity_on_resume
        self._pending_rng: dict[str, Any] | None = None
        self._pending_attrs: dict[str, Any] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.ckpt_path and self.skip_sanity_on_resume:
            trainer.num_sanity_val_steps = 0

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rl_exact_resume"] = {
            "rng": capture_rng_state(),
            "module": {a: getattr(pl_module, a) for a in self.module_attrs if hasattr(pl_module, a)},
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lit_rl_exact_resume")
        if not state:
            rank_zero_warn("ExactResume: the checkpoint has no RNG/counter state (written without this callback)")
            return
        self._pending_rng = state.get("rng")
        self._pending_attrs = dict(state.get("module") or {})
        for a, v in self._pending_attrs.items():
            setattr(pl_module, a, v)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the sanity check and any setup-time randomness: the stream continues where it was saved
        for a, v in self._pending_attrs.items():
            setattr(pl_module, a, v)
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None


def _run_dir(trainer: L.Trainer, output_dir: str | None) -> Path:
    return run_dir(trainer, output_dir)


class PromptLedger(L.Callback):
    """Record the prompt ids of every consumed rollout batch, exactly once, across resumes.

    Each line: ``{"step": <stream batch>, "global_step": <optimizer updates after it>, "prompt_ids": [...]}``.

    Args:
        output_dir: folder of ``consumed_prompts.jsonl`` (default: the run folder). Rank ``r > 0`` writes
            ``consumed_prompts.rank<r>.jsonl``.
    """

    FILE = "consumed_prompts.jsonl"

    def __init__(self, output_dir: str | None = None) -> None:
        self.output_dir = output_dir
        self.batches = 0
        self._resumed = False

    def path(self, trainer: L.Trainer) -> Path:
        name = (self.FILE if trainer.global_rank == 0
                else self.FILE.replace(".jsonl", f".rank{trainer.global_rank}.jsonl"))
        return _run_dir(trainer, self.output_dir) / name

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = int(state_dict.get("batches", 0))
        self._resumed = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        p = self.path(trainer)
        if not self._resumed:
            if p.exists() and trainer.global_step == 0:
                p.unlink()  # a fresh run in an old folder starts a fresh ledger
            return
        lines = p.read_text(encoding="utf-8").splitlines(keepends=True) if p.exists() else []
        if len(lines) < self.batches:
            rank_zero_warn(f"PromptLedger: {p} has {len(lines)} lines but the checkpoint consumed "
                           f"{self.batches} batches")
            return
        if len(lines) > self.batches:
            atomic_write_text(p, "".join(lines[: self.batches]))
            rank_zero_info(f"PromptLedger: dropped {len(lines) - self.batches} batch(es) recorded after the checkpoint")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        examples = getattr(batch, "examples", None)
        if examples is None:
            return
        p = self.path(trainer)
        p.parent.mkdir(parents=True, exist_ok=True)
        rec = {"step": int(getattr(batch, "step", batch_idx)), "global_step": int(trainer.global_step),
               "prompt_ids": [e.id for e in examples]}
        with p.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        self.batches += 1


class CheckpointOnSigterm(L.Callback):
    """On SIGTERM or Ctrl-C: finish the rollout batch, save ``last.ckpt``, exit cleanly (resume with
    ``--ckpt_path last``).

    The signal only sets a flag (Ctrl-C also prints one line saying so); the checkpoint is written at the end
    of the current training batch (a rollout-batch boundary: all μ updates done), into the first
    ``ModelCheckpoint``'s folder as ``last.ckpt`` (``<default_root_dir>/checkpoints`` without one), then
    Lightning's own SIGTERM exit runs once any validation due at this batch has finished. The process exits
    with status 0 and :func:`lit_rl.resume.mark_stopped` marks the MLflow run KILLED.

    * A signal during the first (sanity) evaluation stops the fit before its first update: nothing new to save.
    * A second signal stops at once without saving: Ctrl-C raises ``KeyboardInterrupt`` (exit status 1, the run
      marked KILLED by the CLI), SIGTERM takes its default action. ``--ckpt_path last`` resumes from the last
      checkpoint, or from step 0 in the same MLflow run (:mod:`lit_rl.run_owner`).
    * The handlers are installed once Lightning has installed its own (at the sanity check, else the first
      batch) and replace them: Lightning's would stop a validation half-way and skip the checkpoint. Before
      that (model loading, setup), Ctrl-C is Python's ``KeyboardInterrupt``.
    * ``ModelCheckpoint(save_last=True)`` is told that ``last.ckpt`` is its own file, so a periodic save at the
      same step overwrites it instead of writing ``last-v1.ckpt`` beside it.

    Args:
        filename: checkpoint file name (default ``last.ckpt``, what ``--ckpt_path last`` finds).
        signals: the signals handled (default SIGTERM and SIGINT, which Ctrl-C sends).
    """

    HANDLED = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP")

    def __init__(self, filename: str = "last.ckpt", signals: Sequence[str] = ("SIGTERM", "SIGINT")) -> None:
        from lit_rl.errors import ConfigError

        bad = [s for s in signals if s not in self.HANDLED]
        if bad or not signals:
            raise ConfigError(f"CheckpointOnSigterm.signals: {bad or '[]'} not handled; choose from "
                              f"{', '.join(self.HANDLED)}")
        self.filename = filename
        self.signals = list(dict.fromkeys(signals))
        self.requested = False
        self.signal_name: str | None = None  # the first signal received
        self.forced = False  # a second signal stopped the fit at once
        self.saved_path: str | None = None
        self._previous: dict[int, Any] = {}
        self._exit_after_validation = False

    @property
    def label(self) -> str:
        """``Ctrl-C`` or the signal's name, as the lines and the MLflow tag say it."""
        return "Ctrl-C" if self.signal_name == "SIGINT" else (self.signal_name or "SIGTERM")

    # -- signal handling --------------------------------------------------------------------------
    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:  # second signal: stop now
            self.forced = True
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if signum == signal.SIGINT:  # os.write: print() from a handler can re-enter a stream mid-write
            os.write(2, b"\nCtrl-C: finishing this rollout batch, then saving last.ckpt (Ctrl-C again stops at "
                        b"once, without saving)\n")

    def _install(self) -> None:
        if self._previous:
            return
        try:
            for name in self.signals:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handler)
        except ValueError:  # not the main thread
            rank_zero_warn("CheckpointOnSigterm: cannot install a signal handler outside the main thread")

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # replaces Lightning's handler (installed just before; it would abort a validation mid-way and skip
        # the checkpoint): ours only sets a flag. Lightning restores the original handler at teardown.
        self._install()
        stop = (trainer.strategy.reduce_boolean_decision(self.requested, all=False) if trainer.world_size > 1
                else self.requested)  # every rank stops, or none (one rank alone would hang the others)
        if stop:  # during the sanity evaluation: stop before the first update
            self.requested = True
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            rank_zero_info(f"{self.label}: stopped before update {trainer.global_step + 1}, nothing new to save; "
                           "resume with --ckpt_path last")
            raise SIGTERMException

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            try:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except ValueError:
                pass
        self._previous = {}

    # -- save and stop ----------------------------------------------------------------------------
    def checkpoint_path(self, trainer: L.Trainer) -> Path:
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath:
                return Path(cb.dirpath) / self.filename
        return Path(trainer.default_root_dir) / "checkpoints" / self.filename

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        stop = (trainer.strategy.reduce_boolean_decision(self.requested, all=False) if trainer.world_size > 1
                else self.requested)
        if not stop or self.saved_path is not None:
            return
        self.requested = True
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(str(path))
        self.saved_path = str(path)
        for cb in trainer.checkpoint_callbacks:  # a periodic save at this step overwrites it, no last-v1.ckpt
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb.dirpath:
                if Path(cb.format_checkpoint_name({}, cb.CHECKPOINT_NAME_LAST)) == path:
                    cb.last_model_path = str(path)
        rank_zero_info(f"{self.label}: saved {path} at step {trainer.global_step}; resume with --ckpt_path last")
        if self._validation_due(trainer):
            self._exit_after_validation = True  # let the scheduled evaluation finish first
        else:
            self._lightning_exit(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._exit_after_validation:
            self._exit_after_validation = False
            self._lightning_exit(trainer)

    @staticmethod
    def _validation_due(trainer: L.Trainer) -> bool:
        loop = trainer.fit_loop.epoch_loop
        try:
            return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))
        except Exception:  # noqa: BLE001 - private API moved: exit without waiting
            return False

    @staticmethod
    def _lightning_exit(trainer: L.Trainer) -> None:
        # Lightning raises its SIGTERMException (a clean SystemExit) at the end of this batch
        trainer._signal_connector.received_sigterm = True
