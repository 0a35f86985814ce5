"""How far a cached / threshold training decode is from the exact decoder, measured on the policy being trained.

The d1 authors found Fast-dLLM's cache and parallel decoding "not very stable" inside online RL because the
policy's confidence inflates during training (the d1 repository's issue 25). :class:`DecodeAgreement` measures it
where it happens: when training starts and when it ends (and every ``every_n_steps`` updates if set), the first
``num_prompts`` training prompts are decoded twice with the same seed, once with the DataModule's training decode
(``data.generation``: a cache and/or a threshold) and once with its exact counterpart (no cache, the fixed
schedule of ``steps``), and it logs, at the update it ran:

* ``decode_agreement/token``: the share of completion tokens that are equal;
* ``decode_agreement/completion``: the share of completions equal as a whole;
* ``decode_agreement/{train,exact}_passes``: model passes per row of each decode;
* ``decode_agreement/{train,exact}_confidence``: the revealed tokens' mean confidence in each.

Greedy by default (``temperature: 0``), so the comparison isolates the decoders' approximation from sampling
noise. The training loop's own ``train/on_policy/confidence_mean`` and ``forward_passes`` (every batch) come from
:class:`datamodules.sources.DiffusionOnPolicy`.
"""

from __future__ import annotations

import dataclasses

import lightning as L

from lit_rl.errors import FieldError
from lit_rl.generation.diffusion import DecodeStats

__all__ = ["DecodeAgreement"]


class DecodeAgreement(L.Callback):
    """Agreement of the training decode with the exact decoder (module docstring).

    Args:
        num_prompts: training prompts decoded (the first ones of the training set).
        every_n_steps: also every this many optimizer updates (``None``: start and end only).
        temperature: decoding temperature of both decodes (0: greedy; ``None``: the training decode's).
        seed: the decodes' seed (the same for both).
    """

    @staticmethod
    def check_args(num_prompts: int = 64, every_n_steps: int | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if num_prompts < 1:
            raise FieldError("num_prompts", f"must be >= 1, got {num_prompts}")
        if every_n_steps is not None and every_n_steps < 1:
            raise FieldError("every_n_steps", f"must be >= 1 or null, got {every_n_steps}")

    def __init__(self, num_prompts: int = 64, every_n_steps: int | None = None, temperature: float | None = 0.0,
                 seed: int = 1234) -> None:
        DecodeAgreement.check_args(num_prompts=num_prompts, every_n_steps=every_n_steps)
        self.num_prompts, self.every_n_steps = num_prompts, every_n_steps
        self.temperature, self.seed = temperature, seed
        self._last = -1

    def measure(self, policy, dm) -> dict[str, float]:
        """Decode the prompts both ways and compare (no logging)."""
        train = dm.generation
        if self.temperature is not None:
            train = dataclasses.replace(train, temperature=self.temperature)
        exact = dataclasses.replace(train, cache="none", threshold=None, refresh_every=None)
        ids, mask = dm.encode_prompts(policy, dm.train_examples[: self.num_prompts])
        device = next(policy.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        s_train, s_exact = DecodeStats(), DecodeStats()
        a = policy.generate(ids, mask, train, self.seed, stats=s_train)  # (n, L_gen)
        b = policy.generate(ids, mask, exact, self.seed, stats=s_exact)
        same = a == b
        return {
            "decode_agreement/token": float(same.float().mean()),
            "decode_agreement/completion": float(same.all(-1).float().mean()),
            "decode_agreement/train_passes": s_train.passes_per_row(),
            "decode_agreement/exact_passes": s_exact.passes_per_row(),
            "decode_agreement/train_confidence": s_train.confidence_mean(),
            "decode_agreement/exact_confidence": s_exact.confidence_mean(),
        }

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step == self._last:
            return
        self._last = step
        metrics = self.measure(pl_module.policy, trainer.datamodule)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._log(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)
