"""Step-based pruning of sweep trials (:class:`StepPruningCallback`)."""

from __future__ import annotations

import logging
import math
from typing import Any

PRUNED_STEP_KEY = "lit_rl:pruned_step"
INTERMEDIATE_KEY = "lit_rl:intermediate_values"

log = logging.getLogger("lit_rl.sweep")

__all__ = ["INTERMEDIATE_KEY", "PRUNED_STEP_KEY", "StepPruningCallback"]


def _backend(storage):
    """The uncached storage behind Optuna's ``_CachedStorage`` (what another process wrote)."""
    return getattr(storage, "_backend", storage)


try:  # Lightning is a hard dependency of lit_rl; the guard keeps `--help` importable without it
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object  # type: ignore[assignment,misc]


class StepPruningCallback(_Callback):
    """Report ``monitor`` to an Optuna trial at ``global_step`` and stop unpromising trials.

    Every ``every_n_steps`` optimizer steps (checked in ``on_train_batch_end``, after the callbacks that log
    there, e.g. :class:`callbacks.PassAtKEvaluation`) and after every validation, rank 0 reports
    ``trainer.callback_metrics[monitor]`` at step ``global_step`` if it is a new value (a validation metric
    is reported once, at the step it was computed) and asks the pruner. The decision is broadcast so every DDP rank
    stops together (``trainer.should_stop``); nothing is raised inside ``fit`` (the MLflow run ends cleanly and the last
    checkpoint is written). Call :meth:`check_pruned` right after ``fit``: it raises ``TrialPruned``.

    Under DDP rank 0 also writes the reported values and the decision to the trial's system attributes,
    so :meth:`check_pruned` in the launching process (``ddp_spawn``) can replay them; this needs an
    ``RDBStorage`` (like optuna-integration's callback).
    """

    def __init__(self, trial, monitor: str, every_n_steps: int = 1) -> None:
        super().__init__()
        self._trial = trial
        self.monitor = monitor
        self.every_n_steps = every_n_steps
        self.pruned_step: int | None = None
        self.reported: dict[int, float] = {}
        self._last_train_step: int | None = None
        self._last_value: Any = None
        self._is_ddp = False
        self._warned = False

    def on_fit_start(self, trainer, pl_module) -> None:
        self._is_ddp = trainer.world_size > 1
        if self._is_ddp:
            from optuna.storages import RDBStorage

            if not isinstance(_backend(self._trial.storage), RDBStorage):
                raise ValueError("StepPruningCallback under DDP needs an RDBStorage "
                                 "(sqlite:/// or another database URL)")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # The same condition on every rank (global_step agrees), so the broadcast in _report is collective.
        if step == self._last_train_step or step % self.every_n_steps or self.pruned_step is not None:
            return
        self._last_train_step = step
        self._report(trainer, step)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.pruned_step is not None:
            return
        self._report(trainer, trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        """One warning when the monitor never showed up (a typo, or a metric this run does not log): the
        pruner then saw nothing. Not earlier: a validation metric is absent until the first eval, and a
        Pass@k metric until its first ``on_train_batch_end`` eval."""
        if trainer.is_global_zero and not self.reported and not self._warned:
            log.warning("nothing was reported to the pruner up to step %d: monitor %r was never in "
                        "trainer.callback_metrics with a finite value (is it logged under this name?)",
                        trainer.global_step, self.monitor)
            self._warned = True

    def _report(self, trainer, step: int) -> None:
        """Rank 0 reports a *fresh* monitor value (a tensor it has not reported yet: a validation metric is
        reported at the step it was computed, not again at later training steps) and asks the pruner."""
        should_stop = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.monitor)
            if value is not None and value is not self._last_value and step not in self.reported:
                self._last_value = value
                number = float(value)
                if math.isfinite(number):
                    self._trial.report(number, step=step)
                    self.reported[step] = number
                    should_stop = self._trial.should_prune()
                    if self._is_ddp:
                        self._trial.storage.set_trial_system_attr(self._trial._trial_id, INTERMEDIATE_KEY,
                                                                  {str(k): v for k, v in self.reported.items()})
        should_stop = bool(trainer.strategy.broadcast(should_stop))
        if should_stop:
            self.pruned_step = step
            trainer.should_stop = True
            if trainer.is_global_zero:
                self._trial.storage.set_trial_system_attr(self._trial._trial_id, PRUNED_STEP_KEY, step)

    def check_pruned(self) -> None:
        """Raise ``optuna.TrialPruned`` if this trial was pruned (in this process or a DDP child)."""
        import optuna

        if self.pruned_step is None:
            attrs = _backend(self._trial.storage).get_trial_system_attrs(self._trial._trial_id)
            for step, value in sorted((int(k), v) for k, v in (attrs.get(INTERMEDIATE_KEY) or {}).items()):
                if step not in self.reported:  # replay what a spawned rank 0 reported
                    self._trial.report(value, step=step)
                    self.reported[step] = value
            if attrs.get(PRUNED_STEP_KEY) is not None:
                self.pruned_step = int(attrs[PRUNED_STEP_KEY])
        if self.pruned_step is not None:
            raise optuna.TrialPruned(f"pruned at step {self.pruned_step}")
