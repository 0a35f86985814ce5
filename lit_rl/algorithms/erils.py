"""The dLLM-ERILS LightningModule (ERILS §IV, Eq. 9-10; SPG surrogate for both sources).

Each training step consumes one rollout batch (``G_on`` on-policy + ``G_ext`` external completions per
prompt, produced by :class:`datamodules.RolloutDataModule` at batch start) and makes ``μ`` optimizer
updates on it (paper: 12), as TRL's ``num_iterations``: ``trainer.global_step`` counts optimizer updates,
so ``max_steps`` is the paper's step count. The parts are injected (LightningCLI builds them from YAML):
the policy, the surrogate (SPG: ELBO for positive, EUBO/mix for negative advantages), the advantage
processor (source-specific / joint / on-policy only / external only) and the optimizer/scheduler factories.

Mask draws: every rollout draws its masks from its own CPU stream, seeded by
``lit_rl.rng.seed_for(seed, Stream.MASKS, rank, global_step, row)``, so micro-batching never changes the
masks (nor, without dropout, the update: tested); DDP ranks draw different masks; a resumed run (or one
resumed on another device) draws the same masks. Dropout (e.g. LoRA dropout 0.05 in the paper configs)
draws from the device's global stream in forward order, so its noise still depends on the split, as in
every framework that accumulates gradients.
A non-finite loss or gradient skips the update (weights unchanged, ``train/skipped_updates`` counts it);
``max_consecutive_skips`` in a row stop the run with an error (:class:`~lit_rl.algorithms.rl_module.RLModule`).
"""

from __future__ import annotations

from typing import Iterable

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl.algorithms.advantages import AdvantageProcessor, SourceSpecific, frac_reward_zero_std
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.algorithms.rl_module import NonFiniteUpdateError, RLModule
from lit_rl.models.policy import DiffusionPolicy
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source

__all__ = ["ERILSModule", "NonFiniteUpdateError"]  # the error is re-exported for existing imports


def _adamw(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1)


class ERILSModule(RLModule):
    """dLLM-ERILS: SPG policy optimisation on mixed on-policy and external rollouts.

    The optimisation skeleton (μ updates, NaN guard, clipping, schedule, greedy evaluation) is
    :class:`~lit_rl.algorithms.rl_module.RLModule`'s; this class adds the advantage processing and the
    SPG surrogate.

    Args:
        policy: the masked diffusion LM (``TinyDiffusionLM``, ``PretrainedDiffusionLM``).
        surrogate: the SPG surrogate/loss (its ``mask_id`` is set from the policy).
        advantages: advantage processor (``SourceSpecific`` = ERILS Eq. 9, ``Joint`` = Eq. 11, ...).
        optimizer: optimizer factory (default AdamW lr 3e-6, betas (0.9, 0.99), wd 0.1).
        scheduler: LR scheduler factory, stepped every optimizer update (default constant).
        updates_per_batch: μ, optimizer updates per rollout batch (paper 12).
        micro_batch_size: rollouts per forward/backward within one update (gradient accumulation);
            ``None`` = the whole rollout batch at once.
        grad_clip: max gradient norm (paper 0.2); ``None`` disables clipping.
        max_consecutive_skips: stop after this many non-finite updates in a row.
        seed: seed of the surrogate's mask draws.
    """

    def __init__(
        self,
        policy: DiffusionPolicy,
        surrogate: SPGSurrogate | None = None,
        advantages: AdvantageProcessor | None = None,
        optimizer: OptimizerCallable = _adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 12,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 0.2,
        max_consecutive_skips: int = 10,
        seed: int = 0,
    ) -> None:
        super().__init__(
            policy, optimizer=optimizer, scheduler=scheduler, updates_per_batch=updates_per_batch,
            micro_batch_size=micro_batch_size, grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips,
            seed=seed,
        )
        self.surrogate = surrogate if surrogate is not None else SPGSurrogate()
        self.surrogate.mask_id = policy.mask_id
        self.advantages = advantages if advantages is not None else SourceSpecific()

    # -- training ------------------------------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> torch.Tensor:
        # 1. rollouts: produced by the DataModule at the start of this batch (on-policy + external)
        ro: RolloutBatch = batch.rollouts
        if ro is None:
            raise RuntimeError("training batch has no rollouts: use datamodules.RolloutDataModule (it generates them)")
        # 2. advantages per source (Eq. 9 / Eq. 11 / single-source variants)
        adv, keep = self.advantages(ro.rewards, ro.source, ro.group)  # (N,), (N,)
        self.last_advantages, self.last_advantages_keep = adv.detach(), keep  # read by RolloutTracker
        self._log_rollout_stats(ro, adv, keep)
        ro, adv = ro.select(keep), adv[keep]
        # 3. μ optimizer updates on this rollout batch
        loss = torch.zeros((), device=self.device)
        for _ in range(self.updates_per_batch):
            loss = self._update(ro, adv)
        self.log_step_axis(batch)
        return loss

    def _update(self, ro: RolloutBatch, adv: torch.Tensor) -> torch.Tensor:
        """One optimizer update of the SPG loss (micro-batched; guard/clip/step in ``optimizer_update``)."""
        return self.optimizer_update(lambda: self.accumulate_gradients(ro, adv), "train/spg")

    def accumulate_gradients(
        self, ro: RolloutBatch, adv: torch.Tensor, step: int | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Backward of the SPG loss over micro-batches of ``micro_batch_size`` rows: each micro-batch's loss
        (normalised by its own Σw) is rescaled by its share of the batch's Σw, so the gradients add up to the
        whole batch's ``Σ(−A·S·w)/Σw``. Each row's masks come from its own seed (:meth:`mask_seeds`), so the
        split does not change them. Returns the loss and the last micro-batch's stats."""
        total_w = self.surrogate.loss_weights(ro.lengths).sum().clamp(min=1)
        size = self.micro_batch_size or len(ro)
        loss_sum = torch.zeros((), device=self.device)
        stats: dict[str, torch.Tensor] = {}
        seeds = torch.tensor(self.mask_seeds(ro, step))  # (N,) on CPU, split with the rows
        for mb, mb_adv, mb_seeds in zip(ro.micro_batches(size), adv.split(size), seeds.split(size)):
            loss, stats = self.surrogate(
                self.policy, mb.input_ids, mb.attention_mask, mb.prompt_len, mb.completion_mask, mb.source, mb_adv,
                seeds=mb_seeds, gen_width=mb.gen_width,
            )
            loss = loss * (self.surrogate.loss_weights(mb.lengths).sum().clamp(min=1) / total_w)
            self.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
        return loss_sum, stats

    def _log_rollout_stats(self, ro: RolloutBatch, adv: torch.Tensor, keep: torch.Tensor) -> None:
        """Per-source reward/advantage mean and std, on-policy completion length (once per batch)."""
        bs = int(ro.group.max().item()) + 1
        for src in (Source.ON_POLICY, Source.EXTERNAL):
            sel = ro.source == int(src)
            if not sel.any():
                continue
            r, a = ro.rewards[sel], adv[sel]
            name = src.label
            self.log(f"train/{name}/reward_mean", r.mean(), on_step=True, batch_size=bs, prog_bar=src == Source.ON_POLICY)
            self.log(f"train/{name}/reward_std", r.std(unbiased=False), on_step=True, batch_size=bs)
            self.log(f"train/{name}/advantage_mean", a.mean(), on_step=True, batch_size=bs)
            self.log(f"train/{name}/advantage_std", a.std(unbiased=False), on_step=True, batch_size=bs)
            self.log(f"train/{name}/length_mean", ro.lengths[sel].float().mean(), on_step=True, batch_size=bs)
            if src == Source.ON_POLICY:
                self.log(f"train/{name}/hit_limit_frac", ro.hit_limit[sel].float().mean(), on_step=True, batch_size=bs)
                # the advantages' sign balance: a stalled run has (almost) all on-policy advantages zero
                # TRL's frac_reward_zero_std over the on-policy rows of each group (no signal in those groups)
                self.log(f"train/{name}/frac_reward_zero_std", frac_reward_zero_std(r, ro.group[sel]), on_step=True, batch_size=bs)
                a_kept = a[keep[sel]]
                if a_kept.numel():
                    self.log(f"train/{name}/advantage_pos_frac", (a_kept > 0).float().mean(), on_step=True, batch_size=bs)
                    self.log(f"train/{name}/advantage_neg_frac", (a_kept < 0).float().mean(), on_step=True, batch_size=bs)
        dm = getattr(self.trainer, "datamodule", None)
        for k, v in (getattr(dm, "last_stats", None) or {}).items():
            self.log(k, float(v), on_step=True, batch_size=bs)
        self.log("train/rollouts_kept", keep.float().sum(), on_step=True, batch_size=bs)
