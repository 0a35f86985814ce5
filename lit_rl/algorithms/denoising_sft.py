"""Masked-denoising SFT on the external rollouts: the SFT baseline of ERILS (App. C-H) as a LightningModule.

It consumes the same rollout batches as :class:`~lit_rl.algorithms.erils.ERILSModule` (run the
:class:`datamodules.RolloutDataModule` with ``g_on: 0``, so no on-policy generation happens) and trains on
the batch's external rows with LLaDA's SFT objective (:mod:`lit_rl.core.denoising`): per row
``t ~ U(eps, 1]``, each token masked w.p. ``t``, cross-entropy on masked tokens weighted by ``1/t`` and
normalised by the row's length. No reward is used: every external completion is a target, as in the
paper's SFT baseline ("masked-denoising SFT on the same external rollouts").

``train_padding`` (default, as LLaDA's SFT): the row's whole own width is trained, EOS padding included, so
the model learns to fill the rest of a generation with EOS; ``False`` trains up to the first EOS only.
Masks come from each row's own seed (``lit_rl.rng.seed_for(seed, MASKS, rank, step, row)``), so
micro-batching never changes the update.
"""

from __future__ import annotations


from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl.optim import erils_adamw
from lit_rl.algorithms.losses import DenoisingSFTLoss
from lit_rl.algorithms.rl_module import RLModule
from lit_rl.models.policy import DiffusionPolicy
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.core.sources import rows_where

__all__ = ["DenoisingSFT"]



class DenoisingSFT(RLModule):
    """Masked-denoising SFT on each batch's external rollouts (ERILS's SFT baseline): no processors (no reward
    is used), the :class:`~lit_rl.algorithms.losses.DenoisingSFTLoss` on the external rows.

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

    @staticmethod
    def check_args(eps: float = 1e-3) -> None:
        """The loss's rules (:meth:`DenoisingSFTLoss.check_args`), for the config preflight; the constructor's
        :class:`DenoisingSFTLoss` applies them."""
        DenoisingSFTLoss.check_args(eps=eps)

    def __init__(
        self,
        policy: DiffusionPolicy,
        optimizer: OptimizerCallable = erils_adamw,
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
            seed=seed, processors=[], loss_fn=DenoisingSFTLoss(eps=eps, train_padding=train_padding),
        )
        self.eps, self.train_padding = eps, train_padding

    def batch_metrics(self, ro: RolloutBatch, batch: PromptBatch) -> dict[str, float]:
        ext = rows_where(ro.source, decoded=False)
        return {"train/external/reward_mean": float(ro.rewards[ext].mean())} if bool(ext.any()) else {}
