"""The dLLM-ERILS LightningModule (ERILS §IV, Eq. 9-10; SPG surrogate for both sources).

Each training step consumes one rollout batch (``G_on`` on-policy + ``G_ext`` external completions per
prompt, produced by :class:`datamodules.RolloutDataModule` at batch start) and makes ``μ`` optimizer
updates on it (paper: 12), as TRL's ``num_iterations``: ``trainer.global_step`` counts optimizer updates,
so ``max_steps`` is the paper's step count. The parts are injected (LightningCLI builds them from YAML):
the policy, the surrogate (SPG: ELBO for positive, EUBO/mix for negative advantages), the advantage
processor (source-specific / joint / on-policy only / external only) and the optimizer/scheduler factories.
In the shared pipeline (:mod:`lit_rl.algorithms.rl_module`) that is ``processors: [advantages]`` and
``loss_fn: SPGLoss(surrogate)``; :func:`source_metrics` are its per-batch metrics.

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

from typing import Sequence

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl.optim import erils_adamw
from lit_rl.algorithms.advantages import AdvantageProcessor, SourceSpecific
from lit_rl.algorithms.losses import Loss, SPGLoss
from lit_rl.algorithms.processors import Processor
from lit_rl.algorithms.rl_module import NonFiniteUpdateError, RLModule, warn_unused_sugar
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.core.advantages import frac_reward_zero_std
from lit_rl.errors import ConfigError, FieldError
from lit_rl.generation.settings import check_block_multiple
from lit_rl.models.policy import DiffusionPolicy
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.core.sources import metric_groups, rows_where

__all__ = ["ERILSModule", "NonFiniteUpdateError", "source_metrics"]



def source_metrics(ro: RolloutBatch) -> dict[str, float]:
    """Per-source reward/advantage mean and std and completion length of the processed rows; for the
    on-policy rows also the share hitting L_gen, ``frac_reward_zero_std`` and the kept advantages' sign
    balance (a stalled run has almost all on-policy advantages zero); ``train/rollouts_kept``. Double
    rollout's ``CONTINUATION`` rows are counted with the on-policy rows (the policy decoded them)."""
    adv, keep = ro.advantages, ro.keep
    m: dict[str, float] = {}
    for name, decoded in metric_groups():  # on_policy (decoded), external
        sel = rows_where(ro.source, counts_as=name)  # (N,)
        if not sel.any():
            continue
        r, a = ro.rewards[sel], adv[sel]
        m[f"train/{name}/reward_mean"] = float(r.mean())
        m[f"train/{name}/reward_std"] = float(r.std(unbiased=False))
        m[f"train/{name}/advantage_mean"] = float(a.mean())
        m[f"train/{name}/advantage_std"] = float(a.std(unbiased=False))
        m[f"train/{name}/length_mean"] = float(ro.lengths[sel].float().mean())
        if decoded:  # rows the policy decoded
            m[f"train/{name}/hit_limit_frac"] = float(ro.hit_limit[sel].float().mean())
            m[f"train/{name}/frac_reward_zero_std"] = frac_reward_zero_std(r, ro.group[sel])
            a_kept = a[keep[sel]]
            if a_kept.numel():
                m[f"train/{name}/advantage_pos_frac"] = float((a_kept > 0).float().mean())
                m[f"train/{name}/advantage_neg_frac"] = float((a_kept < 0).float().mean())
    m["train/rollouts_kept"] = float(keep.float().sum())
    return m


class ERILSModule(RLModule):
    """dLLM-ERILS: SPG policy optimisation on mixed on-policy and external rollouts.

    The training step (rollouts -> processors -> metrics -> prepare -> μ updates), the NaN guard, clipping,
    schedule and greedy evaluation are :class:`~lit_rl.algorithms.rl_module.RLModule`'s; this class chooses
    the parts: ERILS's advantage processor and the SPG loss.

    Args:
        policy: the masked diffusion LM (``TinyDiffusionLM``, ``NativeLLaDA``, ``PretrainedDiffusionLM``).
        surrogate: the SPG surrogate/loss (its ``mask_id`` is set from the policy); sugar for
            ``loss_fn: SPGLoss(surrogate)``, unused (with a warning) when ``loss_fn`` is set.
        advantages: advantage processor (``SourceSpecific`` = ERILS Eq. 9, ``Joint`` = Eq. 11, ...); sugar for
            ``processors: [advantages]``, unused (with a warning) when ``processors`` is set.
        optimizer: optimizer factory (default AdamW lr 3e-6, betas (0.9, 0.99), wd 0.1).
        scheduler: LR scheduler factory, stepped every optimizer update (default constant).
        updates_per_batch: μ, optimizer updates per rollout batch (paper 12).
        micro_batch_size: rollouts per forward/backward within one update (gradient accumulation);
            ``None`` = the whole rollout batch at once.
        grad_clip: max gradient norm (paper 0.2); ``None`` disables clipping.
        max_consecutive_skips: stop after this many non-finite updates in a row.
        seed: seed of the surrogate's mask draws.
        processors: a whole advantage chain instead of ``advantages`` (:mod:`lit_rl.algorithms.processors`).
        loss_fn: another loss instead of the SPG surrogate's (:mod:`lit_rl.algorithms.losses`).
    """

    def __init__(
        self,
        policy: DiffusionPolicy,
        surrogate: SPGSurrogate | None = None,
        advantages: AdvantageProcessor | None = None,
        optimizer: OptimizerCallable = erils_adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 12,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 0.2,
        max_consecutive_skips: int = 10,
        seed: int = 0,
        processors: Sequence[Processor] | None = None,
        loss_fn: Loss | None = None,
    ) -> None:
        # advantages / surrogate are sugar for the parts: processors [advantages], loss_fn SPGLoss(surrogate)
        warn_unused_sugar("advantages", advantages, "processors", processors)
        warn_unused_sugar("surrogate", surrogate, "loss_fn", loss_fn)
        super().__init__(
            policy, optimizer=optimizer, scheduler=scheduler, updates_per_batch=updates_per_batch,
            micro_batch_size=micro_batch_size, grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips,
            seed=seed, processors=processors if processors is not None else [advantages or SourceSpecific()],
            loss_fn=loss_fn if loss_fn is not None else SPGLoss(surrogate),
        )

    @property
    def surrogate(self) -> SPGSurrogate | None:
        """The SPG surrogate of the loss (``None`` when ``loss_fn`` is not SPG's)."""
        return self.loss_fn.surrogate if isinstance(self.loss_fn, SPGLoss) else None

    def setup(self, stage: str) -> None:
        """Before anything trains: the surrogate's blocks must tile the training decode
        (:func:`~lit_rl.generation.settings.check_block_multiple`, the rule the config preflight applies); then
        the DataModule gets its parts (:meth:`RLModule.setup`)."""
        super().setup(stage)
        gen = getattr(getattr(self.trainer, "datamodule", None), "generation", None)
        if stage == "fit" and isinstance(self.loss_fn, SPGLoss) and isinstance(getattr(gen, "gen_length", None), int):
            try:
                check_block_multiple(gen.gen_length, self.loss_fn.surrogate.block_length, "block_length",
                                     "the surrogate's ")
            except FieldError as e:
                raise ConfigError(f"model.surrogate.{e.field}: {e.problem} (data.generation.gen_length)") from None

    def batch_metrics(self, ro: RolloutBatch, batch: PromptBatch) -> dict[str, float]:
        return source_metrics(ro)
