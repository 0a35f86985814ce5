"""The dLLM-ERILS LightningModule (ERILS §IV, Eq. 9-10; SPG surrogate for both sources).

Each training step consumes one rollout batch (``G_on`` on-policy + ``G_ext`` external completions per
prompt, produced by :class:`datamodules.RolloutDataModule` at batch start) and makes ``μ`` optimizer
updates on it (paper: 12), as TRL's ``num_iterations``: ``trainer.global_step`` counts optimizer updates,
so ``max_steps`` is the paper's step count. The parts are injected (LightningCLI builds them from YAML):
the policy, the surrogate (SPG: ELBO for positive, EUBO/mix for negative advantages), the advantage
processor (source-specific / joint / on-policy only / external only) and the optimizer/scheduler factories.

Mask draws are seeded by ``(seed, global_step)`` so a resumed run draws the same masks.
A non-finite loss or gradient skips the update (weights unchanged, ``train/skipped_updates`` counts it);
``max_consecutive_skips`` in a row stop the run with an error.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl.algorithms.advantages import AdvantageProcessor, SourceSpecific
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.models.policy import DiffusionPolicy
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source


def _adamw(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-6, betas=(0.9, 0.99), weight_decay=0.1)


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive optimizer updates were skipped for NaN/inf."""


class ERILSModule(L.LightningModule):
    """dLLM-ERILS: SPG policy optimisation on mixed on-policy and external rollouts.

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
        super().__init__()
        if updates_per_batch < 1:
            raise ValueError(f"model.updates_per_batch must be >= 1, got {updates_per_batch}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"model.micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        self.automatic_optimization = False
        self.policy = policy
        self.surrogate = surrogate if surrogate is not None else SPGSurrogate()
        self.surrogate.mask_id = policy.mask_id
        self.advantages = advantages if advantages is not None else SourceSpecific()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.updates_per_batch = updates_per_batch
        self.micro_batch_size = micro_batch_size
        self.grad_clip = grad_clip
        self.max_consecutive_skips = max_consecutive_skips
        self.seed = seed
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self._val_correct = 0.0
        self._val_total = 0.0
        self._val_len: list[torch.Tensor] = []

    # -- optimisation setup --------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model.policy has no trainable parameters (LoRA targets matched nothing?)")
        opt = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}

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
        return loss

    def _update(self, ro: RolloutBatch, adv: torch.Tensor) -> torch.Tensor:
        """One optimizer update: SPG loss over micro-batches, NaN guard, clip, step, schedule."""
        opt = self.optimizers()
        sched = self.lr_schedulers()
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + self.global_step)
        opt.zero_grad(set_to_none=True)
        total_len = ro.lengths.sum().clamp(min=1)
        size = self.micro_batch_size or len(ro)
        loss_sum = torch.zeros((), device=self.device)
        stats: dict[str, torch.Tensor] = {}
        for mb, mb_adv in zip(ro.micro_batches(size), adv.split(size)):
            loss, stats = self.surrogate(
                self.policy, mb.input_ids, mb.attention_mask, mb.prompt_len, mb.completion_mask, mb.source, mb_adv, gen
            )
            # spg_loss normalises by the micro-batch's ΣL; rescale so the sum is Σ(−A·S·L)/ΣL_total
            loss = loss * (mb.lengths.sum().clamp(min=1) / total_len)
            self.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        grads_finite = all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
        if not (torch.isfinite(loss_sum) and grads_finite):
            opt.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            self.log("train/skipped_updates", float(self.skipped_updates), on_step=True)
            if self.consecutive_skips >= self.max_consecutive_skips:
                raise NonFiniteUpdateError(
                    f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                    f"(model.max_consecutive_skips = {self.max_consecutive_skips}); last loss {loss_sum.item()}"
                )
            return loss_sum
        self.consecutive_skips = 0
        if self.grad_clip is not None:
            self.clip_gradients(opt, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
        opt.step()
        if sched is not None:
            sched.step()
        self.log("train/loss", loss_sum, on_step=True, prog_bar=True)
        self.log("train/lr", opt.param_groups[0]["lr"], on_step=True)
        for k, v in stats.items():
            self.log(f"train/spg/{k}", v.float(), on_step=True)
        return loss_sum

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
        dm = getattr(self.trainer, "datamodule", None)
        for k, v in (getattr(dm, "last_stats", None) or {}).items():
            self.log(k, float(v), on_step=True, batch_size=bs)
        self.log("train/rollouts_kept", keep.float().sum(), on_step=True, batch_size=bs)

    # -- periodic greedy evaluation ------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_correct, self._val_total, self._val_len = 0.0, 0.0, []

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        ro = batch.rollouts
        self._val_correct += float(ro.rewards.sum())
        self._val_total += float(ro.eval_total.sum())
        self._val_len.append(ro.lengths.float())

    def on_validation_epoch_end(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        task = getattr(getattr(dm, "task", None), "name", "task")
        correct = torch.tensor([self._val_correct, self._val_total], device=self.device)
        correct = self.trainer.strategy.reduce(correct, reduce_op="sum") if self.trainer.world_size > 1 else correct
        acc = (correct[0] / correct[1].clamp(min=1)).item()
        metrics = {f"val/{task}/greedy/accuracy": acc}
        if self._val_len:
            metrics[f"val/{task}/greedy/length_mean"] = torch.cat(self._val_len).mean().item()
        if self.trainer.sanity_checking:
            # Lightning drops metrics logged during the sanity check; the starting policy's score is the
            # first point of the learning curve, so write it to the loggers directly (step 0).
            if self.trainer.is_global_zero and self.trainer.global_step == 0:
                for logger in self.trainer.loggers:
                    logger.log_metrics(metrics, step=0)
            return
        for k, v in metrics.items():
            self.log(k, v, prog_bar=k.endswith("accuracy"), rank_zero_only=True)

    test_step = validation_step
    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end
