"""Masked-denoising SFT on the external rollouts: the SFT baseline of ERILS (App. C-H) as a LightningModule.

It consumes the same rollout batches as :class:`~lit_rl.algorithms.erils.ERILSModule` (run the
:class:`datamodules.RolloutDataModule` with ``g_on: 0``, so no on-policy generation happens) and trains on
the batch's external rows with LLaDA's SFT objective (:mod:`lit_rl.algorithms.sft`): per row
``t ~ U(eps, 1]``, each token masked w.p. ``t``, cross-entropy on masked tokens weighted by ``1/t`` and
normalised by the row's length. No reward is used: every external completion is a target, as in the
paper's SFT baseline ("masked-denoising SFT on the same external rollouts").

``train_padding`` (default, as LLaDA's SFT): the row's whole own width is trained, EOS padding included, so
the model learns to fill the rest of a generation with EOS; ``False`` trains up to the first EOS only.
Masks come from each row's own seed (``lit_rl.rng.seed_for(seed, MASKS, rank, step, row)``), so
micro-batching never changes the update.
"""

from __future__ import annotations

from typing import Iterable

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl import rng
from lit_rl.algorithms.rl_module import RLModule
from lit_rl.algorithms.sft import denoising_masks, masked_denoising_loss
from lit_rl.models.policy import DiffusionPolicy
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source

__all__ = ["DenoisingSFT"]


def _adamw(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1)


class DenoisingSFT(RLModule):
    """Masked-denoising SFT on each batch's external rollouts (ERILS's SFT baseline).

    Args:
        policy: the masked diffusion LM.
        optimizer: optimizer factory (default AdamW lr 3e-6, betas (0.9, 0.99), wd 0.1, as ERILS).
        scheduler: LR scheduler factory, stepped every optimizer update.
        updates_per_batch: optimizer updates per batch (each with fresh masks).
        micro_batch_size: rows per forward/backward (gradient accumulation; same update).
        grad_clip: max gradient norm; ``None`` disables clipping.
        max_consecutive_skips: stop after this many non-finite updates in a row.
        seed: seed of the mask draws.
        eps: lower bound of the masking ratio ``t``.
        train_padding: train the EOS padding of the row's own width too (LLaDA SFT).
    """

    def __init__(
        self,
        policy: DiffusionPolicy,
        optimizer: OptimizerCallable = _adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 1,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 1.0,
        max_consecutive_skips: int = 10,
        seed: int = 0,
        eps: float = 1e-3,
        train_padding: bool = True,
    ) -> None:
        super().__init__(
            policy, optimizer=optimizer, scheduler=scheduler, updates_per_batch=updates_per_batch,
            micro_batch_size=micro_batch_size, grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips,
            seed=seed,
        )
        if not 0.0 < eps < 1.0:
            raise ValueError(f"model.eps must be in (0, 1), got {eps}")
        self.eps = eps
        self.train_padding = train_padding

    def training_step(self, batch: PromptBatch, batch_idx: int) -> torch.Tensor:
        # 1. rollouts: the DataModule attached the batch's external rollouts (g_on 0: nothing generated)
        ro: RolloutBatch | None = batch.rollouts
        if ro is None:
            raise RuntimeError("training batch has no rollouts: use datamodules.RolloutDataModule")
        ext = ro.source == int(Source.EXTERNAL)
        if not bool(ext.any()):
            raise RuntimeError("DenoisingSFT trains on external rollouts: set data.g_ext >= 1 (and data.g_on: 0)")
        ro = ro.select(ext)
        self.log("train/external/reward_mean", ro.rewards.mean(), on_step=True, batch_size=len(batch.examples) or 1)
        # 2. updates_per_batch optimizer updates, each with its own masks
        loss = torch.zeros((), device=self.device)
        for _ in range(self.updates_per_batch):
            loss = self.optimizer_update(lambda: self.accumulate_gradients(ro), "train/sft")
        self.log_step_axis(batch)
        return loss

    def target_mask(self, ro: RolloutBatch) -> torch.Tensor:
        """Trained positions ``(N, L)``: the row's own width (``train_padding``) or up to its first EOS."""
        if not self.train_padding:
            return ro.completion_mask.bool()
        pos = torch.arange(ro.completion_mask.shape[1], device=ro.completion_mask.device)
        return pos[None, :] < ro.gen_width[:, None]

    def accumulate_gradients(self, ro: RolloutBatch, step: int | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Backward of the SFT loss (mean over rows) over micro-batches; returns the loss and stats."""
        target = self.target_mask(ro)  # (N, L)
        seeds = self.mask_seeds(ro, step)
        ts, masks = zip(*(denoising_masks(target[i : i + 1], rng.cpu_generator(s), self.eps) for i, s in enumerate(seeds)))
        t, masked = torch.cat(ts), torch.cat(masks)  # (N,), (N, L)
        n = len(ro)
        size = self.micro_batch_size or n
        P = ro.prompt_len
        loss_sum = torch.zeros((), device=self.device)
        for s in range(0, n, size):
            sl = slice(s, s + size)
            comp = ro.completion_ids[sl]  # (b, L)
            noisy = torch.where(masked[sl], torch.full_like(comp, self.policy.mask_id), comp)
            ids = torch.cat([ro.input_ids[sl, :P], noisy], 1)  # (b, P + L)
            logits = self.policy(ids, ro.attention_mask[sl])[:, P:]  # (b, L, V)
            loss = masked_denoising_loss(logits, comp, masked[sl], t[sl], target[sl].sum(-1))
            loss = loss * (comp.shape[0] / n)  # a mean over rows: each micro-batch weighs its share
            self.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
        stats = {"masked_frac": (masked.sum() / target.sum().clamp(min=1)).float(), "t_mean": t.mean()}
        return loss_sum, stats
