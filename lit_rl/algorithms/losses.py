"""Losses: the last stage of the pipeline, each an injectable part (the interface: :mod:`lit_rl.algorithms.loss_api`).

A loss gets typed arguments (the rows, a :class:`~lit_rl.algorithms.loss_api.LossContext`), never the module;
the module owns micro-batching, ``manual_backward`` and logging. Losses here:

* :class:`SPGLoss`: ERILS / SPG, the SPG surrogate of :mod:`lit_rl.algorithms.surrogates`;
* :class:`ClippedPGLoss`: GRPO / DAPO / double rollout, the token-level clipped policy gradient of
  :func:`lit_rl.core.pg.clipped_pg_loss` with clip-higher and optional k3 KL;
* :class:`DenoisingSFTLoss`: masked-denoising SFT (ERILS's SFT baseline, :mod:`lit_rl.core.denoising`).

d1 and wd1 live in :mod:`lit_rl.algorithms.d1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.algorithms.loss_api import Loss, LossContext, Prepared, kept_rows
from lit_rl.core.denoising import denoising_masks, masked_denoising_loss
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.core.advantages import STD_OF
from lit_rl.core.entropy import masked_entropy_mean
from lit_rl.core.pg import AGGREGATIONS, truncation_mask
from lit_rl.core.sources import rows_where
from lit_rl.errors import FieldError
from lit_rl.batch import RolloutBatch

__all__ = ["ClippedPGLoss", "DenoisingSFTLoss", "GRPOLossSettings", "Loss", "SPGLoss"]


# ------------------------------------------------------------------------------------------------- SPG
@dataclass
class SPGBatch(Prepared):
    """What :class:`SPGLoss` fixes once per rollout batch: the kept rows and their total weight ``Σw``."""

    total_w: Tensor = field(default_factory=lambda: torch.ones(()))  # () the batch's Σw (>= 1)


class SPGLoss(Loss):
    """ERILS / SPG: ``Σ(−A·S·w)/Σw`` with the SPG surrogate ``S`` (ELBO for positive, EUBO/mix for negative
    advantages) over the kept rows. Each row's masks come from its own seed (``ctx.mask_seeds`` at the
    update's step), so micro-batching never changes them; each micro-batch's loss is rescaled by its share
    of the batch's Σw, so the gradients add up to the whole batch's.

    **Zero-advantage rows** (``skip_zero_advantage``, default on): a row with ``A = 0`` adds ``0 · S · w`` to the
    loss and nothing to the gradient, so it skips the surrogate's forward and backward; ``Σw`` still counts it,
    so the gradient is the whole batch's (up to float rounding: the forwards run on fewer rows; with LoRA
    dropout the dropout draws differ too). Under DDP / FSDP with a ``micro_batch_size`` the skip is off, so that
    every rank runs the same number of forward passes. In ERILS's
    groups of 2 on-policy rows, a group whose two rows score the same has both at ``A = 0`` (38% of the groups
    over the embedded run, 63% near its end). SPG's code (and ERILS's) forwards them. The ``train/spg/*``
    statistics are then over the rows trained; ``train/rows_trained`` counts them. A batch with no row at
    ``A ≠ 0`` trains on all of its rows (a zero gradient, as without the skip).

    Args:
        surrogate: the SPG surrogate (its ``mask_id`` is set from the policy).
        skip_zero_advantage: leave rows with ``A = 0`` out of the forward and backward passes.
    """

    stats_prefix = "train/spg"

    def __init__(self, surrogate: SPGSurrogate | None = None, skip_zero_advantage: bool = True) -> None:
        self.surrogate = surrogate if surrogate is not None else SPGSurrogate()
        self.skip_zero_advantage = skip_zero_advantage

    def bind(self, policy: torch.nn.Module) -> None:
        self.surrogate.mask_id = policy.mask_id

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> SPGBatch:
        ro = kept_rows(rollouts)
        total_w = self.surrogate.loss_weights(ro.lengths).sum().clamp(min=1)  # () over every kept row
        informative = ro.advantages != 0  # (B,)
        # under DDP / FSDP with micro-batches, ranks would run different numbers of forward passes (collectives)
        same_passes = ctx.micro_batch_size is None or not _distributed()
        if self.skip_zero_advantage and same_passes and bool(informative.any()) and not bool(informative.all()):
            ro = ro.select(informative)  # (B',...) the rows with a gradient
        return SPGBatch(ro, {"train/rows_trained": float(len(ro))}, total_w=total_w)

    def micro_batch_loss(self, p: SPGBatch, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        mb = p.rows.slice_rows(sl)
        seeds = torch.tensor(ctx.mask_seeds(mb))  # (b,) on CPU
        loss, stats = self.surrogate(
            ctx.policy, mb.input_ids, mb.attention_mask, mb.prompt_len, mb.completion_mask, mb.source,
            mb.advantages, seeds=seeds, gen_width=mb.gen_width, kept_prefix=mb.kept_prefix,
        )
        return loss * (self.surrogate.loss_weights(mb.lengths).sum().clamp(min=1) / p.total_w), stats


def _distributed() -> bool:
    """Whether this process is one of several ranks."""
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1


# --------------------------------------------------------------------------------- clipped policy gradient
OLD_LOGPROBS = ("first_update", "separate_pass")


@dataclass
class GRPOLossSettings:
    """GRPO advantages and the token-level clipped policy-gradient loss (:mod:`lit_rl.core.pg`).

    :class:`ClippedPGLoss` reads the loss fields (clip range, KL, aggregation, truncation, zero-advantage rows);
    the advantage fields (``scale_std``, ``leave_one_out``, ``std_eps``, ``std_of``) configure the group baseline that
    :class:`~lit_rl.algorithms.double_rollout.DoubleRolloutGRPO` builds from its ``loss`` argument (with a
    ``processors`` list, set them on its ``GroupBaseline``).

    Attributes:
        eps_low: lower clip, ratio >= 1 - eps_low (PPO/DAPO 0.2).
        eps_high: upper clip, ratio <= 1 + eps_high (DAPO clip-higher 0.28; ``null``: eps_low).
        kl_beta: k3 KL coefficient to the reference policy (GRPO 0.04; DAPO / DR 0).
        reference: the KL reference: ``"auto"`` (the policy with its LoRA adapter disabled when it has
            one, else a frozen copy of the policy taken when training starts), ``"adapter"``, ``"copy"``.
        aggregation: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum-norm"``.
        mask_truncated: leave completions that hit the length limit out of the loss (DAPO overlong
            filtering); their rewards still enter the group baseline.
        scale_std: divide advantages by a std of the group's rewards (``std_of``; DeepSeekMath GRPO, NeMo-RL's
            ``normalize_rewards``); ``false``: mean-centring only (Dr. GRPO).
        leave_one_out: RLOO baseline (mean of the group's other rewards; NeMo-RL's ``use_leave_one_out_baseline``).
        std_eps: added to the std before dividing (``scale_std``; TRL's 1e-4, NeMo-RL's 1e-6).
        std_of: which std (``scale_std``): ``"group"`` (the group's sample std, every row divided by it + ``std_eps``;
            TRL) or ``"baseline"`` (NeMo-RL's rule: the sample std of the rewards the row's baseline averages,
            the others under ``leave_one_out``; rows where it is 0 keep the undivided advantage;
            :func:`lit_rl.core.advantages.group_centered`). The DR paper's baseline is NeMo-RL's GRPO
            (``conf/paper/double_rollout_math.yaml``: ``scale_std``, ``leave_one_out``, ``std_of: baseline``,
            ``std_eps: 1e-6``).
        skip_zero_advantage: drop rows with advantage exactly 0 from the loss (only when ``kl_beta = 0``; not
            under DDP / FSDP with a ``micro_batch_size``, where every rank must run the same number of passes).
        old_logprobs: where π_old comes from. ``"first_update"`` (default): the batch's first update's own
            forward pass, detached (its ratio is exactly 1, as TRL's ``GRPOTrainer`` with
            ``num_iterations = 1``, and the kept log-probs serve the batch's later updates); ``"separate_pass"``:
            one more forward pass per batch before the updates, the policy in eval mode (the earlier
            default; PPO's rollout-time log-probs). The two give the same numbers when the policy has no active
            dropout (the embedded models have none; LoRA's ``lora_dropout`` is one): a policy with dropout
            has a train-mode π_old under ``"first_update"``. ``train/entropy`` comes from the same logits.
        objective: the per-batch loss function, a dotted path to a function with
            :func:`lit_rl.core.pg.clipped_pg_loss`'s signature ``(logp, old_logp, advantages, mask, eps_low=,
            eps_high=, ref_logp=, kl_beta=, aggregation=) -> (loss, stats)``: ``lit_rl.core.pg.clipped_pg_loss``
            (default; PPO's clip with DAPO's clip-higher) or ``lit_rl.core.pg.cispo_loss`` (MiniMax-M1's CISPO),
            or one of your own: a GRPO variant is a function and this one line.
        trim_padding: run the loss passes over the completion columns up to the last token any kept row
            scores, not the full generation budget (rows are EOS-filled to ``max_new_tokens``; TRL's
            ``GRPOTrainer`` likewise pads completions only to the batch's longest). Exact for a causal policy,
            whose logits at a position never read a later token, up to float rounding of the shorter
            matmuls; ``false``: the full width (the behaviour before this option). Not applied under
            ``seq-mean-token-sum-norm``, whose normaliser is the full width ``L`` (Dr. GRPO's constant).
    """

    eps_low: float = 0.2
    eps_high: float | None = 0.28
    kl_beta: float = 0.0
    reference: str = "auto"
    aggregation: str = "token-mean"
    mask_truncated: bool = True
    scale_std: bool = False
    leave_one_out: bool = False
    std_eps: float = 1e-4
    std_of: str = "group"
    skip_zero_advantage: bool = True
    old_logprobs: str = "first_update"
    trim_padding: bool = True
    objective: str = "lit_rl.core.pg.clipped_pg_loss"

    def __post_init__(self) -> None:
        objective_function(self.objective)  # a path that does not import is refused here, naming the field
        if self.std_of not in STD_OF:
            raise FieldError("std_of", f"must be one of {STD_OF}, got {self.std_of!r}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise FieldError("old_logprobs", f"must be one of {OLD_LOGPROBS}, got {self.old_logprobs!r}")
        if not 0 <= self.eps_low <= 1:
            raise ValueError(f"model.loss.eps_low must be in [0, 1] (1: no lower bound), got {self.eps_low}")
        if self.eps_high is not None and self.eps_high < 0:
            raise ValueError(f"model.loss.eps_high must be >= 0 or null, got {self.eps_high}")
        if self.kl_beta < 0:
            raise ValueError(f"model.loss.kl_beta must be >= 0, got {self.kl_beta}")
        if self.reference not in ("auto", "adapter", "copy"):
            raise ValueError(f"model.loss.reference must be auto|adapter|copy, got {self.reference!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"model.loss.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")


def objective_function(path: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    """The function a ``loss.objective`` dotted path names (``module.function``); a :class:`FieldError` naming
    ``objective`` when it does not import or is not callable."""
    import importlib

    module, _, name = str(path).rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as e:
        raise FieldError("objective", f"{path!r} cannot be imported ({e}); give module.function, e.g. "
                         "lit_rl.core.pg.cispo_loss") from None
    if not callable(fn):
        raise FieldError("objective", f"{path!r} is not a function; give module.function with "
                         "lit_rl.core.pg.clipped_pg_loss's signature")
    return fn


@dataclass
class PreparedPG(Prepared):
    """What :class:`ClippedPGLoss` fixes once per rollout batch (``B'`` rows trained)."""

    advantages: Tensor | None = None  # (B',)
    mask: Tensor | None = None  # (B', L) tokens in the loss
    old_logp: Tensor | None = None  # (B', L) π_old; None until the first update fills it (``first_update``)
    ref_logp: Tensor | None = None  # (B', L) π_ref (kl_beta > 0)
    pending: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # the first update's (log-probs, entropy)


class ClippedPGLoss(Loss):
    """GRPO / DAPO / double-rollout loss: token-level clipped policy gradient over the kept rows.

    ``prepare``: loss mask = completion tokens, truncated completions out (``mask_truncated``, DAPO);
    rows with advantage exactly 0 out when ``skip_zero_advantage`` and ``kl_beta = 0`` (a batch with no
    informative row still makes its μ zero-gradient updates, counted in ``train/uninformative_batches``, so
    ``max_steps`` always ends the run); π_old (and π_ref) log-probs of the rows under the policy before any
    update, taken from the first update's own forward (``old_logprobs: first_update``) or from a pass of
    their own in eval mode (``separate_pass``), with ``train/entropy`` (π_old's mean token entropy over the
    mask) from the same logits. ``micro_batch_loss``: each micro-batch's loss weighted by its share of the
    aggregation's denominator, so the accumulated gradient equals the full batch's for every aggregation.

    Rows of other sources (an ``ExternalPool`` in the DataModule's sources, ``conf/grpo_external.yaml``) are
    scored like sampled rows: a pool holds text, not its model's log-probs, so π_old of an external row is
    the current policy's before the batch's first update, computed here. Its ratio starts at 1 and the clip
    bounds how far the batch's μ updates move it; there is no importance weight to the external model (the
    off-policy correction is left out, as ERILS's SPG loss leaves it out for its external rows).

    Args:
        settings: clip range, KL, aggregation, truncation and zero-advantage rules (:class:`GRPOLossSettings`).
    """

    stats_prefix = "train/grpo"

    def __init__(self, settings: GRPOLossSettings | None = None) -> None:
        self.settings = settings if settings is not None else GRPOLossSettings()
        self.objective = objective_function(self.settings.objective)  # clipped_pg_loss unless configured
        self.uninformative_batches = 0

    @property
    def reference_mode(self) -> str | None:  # type: ignore[override]
        return self.settings.reference if self.settings.kl_beta > 0 else None

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> PreparedPG:
        s = self.settings
        ro = kept_rows(rollouts)
        adv = ro.advantages
        mask = truncation_mask(ro.completion_ids, ro.completion_mask, ctx.policy.eos_id, s.mask_truncated)
        keep = mask.any(dim=1)  # (B,)
        # under DDP / FSDP with micro-batches, ranks would run different numbers of passes (each a collective)
        if s.skip_zero_advantage and s.kl_beta == 0 and (ctx.micro_batch_size is None or not _distributed()):
            informative = keep & (adv != 0)
            if bool(informative.any()):
                keep = informative
            else:
                # nothing to learn from: still make the μ (zero-gradient) updates, so that
                # trainer.global_step advances and max_steps ends the run
                self.uninformative_batches += 1
        if not bool(keep.any()):
            keep = torch.ones_like(keep)  # every row truncated: the mask zeroes the loss anyway
        # logged every batch (not only when it grows): an on_step value logged once is re-emitted by Lightning
        # at later steps of that process only, so a resumed run's metric stream would differ
        metrics = {"train/uninformative_batches": float(self.uninformative_batches),
                   "train/rows_trained": keep.float().sum()}
        ro, adv, mask = ro.select(keep), adv[keep], mask[keep]  # (B',...)
        # causal: columns after the last scored token change nothing, except the constant width normaliser of
        # seq-mean-token-sum-norm (B * L, with L the generation budget), so that aggregation keeps the full width
        if s.trim_padding and s.aggregation != "seq-mean-token-sum-norm" and bool(mask.any()):
            width = int(mask.any(0).nonzero().max()) + 1
            ro, mask = ro.trim_completion(width), mask[:, :width]  # (B', P + w), (B', w)
        separate = s.old_logprobs == "separate_pass"
        old_logp, ref_logp, entropy = self._fixed_logprobs(ro, ctx, with_old=separate)
        if separate:
            metrics["train/entropy"] = masked_entropy_mean(entropy, mask)
        return PreparedPG(ro, metrics, advantages=adv, mask=mask, old_logp=old_logp, ref_logp=ref_logp)

    @torch.no_grad()
    def _fixed_logprobs(
        self, ro: RolloutBatch, ctx: LossContext, with_old: bool
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """π_old log-probs ``(B, L)`` and π_old's token entropy ``(B, L)`` when ``with_old`` (the policy in
        eval mode), and π_ref log-probs when ``kl_beta > 0``, in micro-batches."""
        policy = ctx.policy
        was_training = policy.training
        policy.eval()
        olds, refs, ents = [], [], []
        try:
            for sl in ctx.slices(len(ro)):
                mb = ro.slice_rows(sl)
                if with_old:
                    logp, ent = policy.completion_scores(mb.input_ids, mb.attention_mask, mb.prompt_len)  # (b, L)
                    olds.append(logp)
                    ents.append(ent)
                if self.settings.kl_beta > 0:
                    with ctx.reference_policy() as ref:
                        refs.append(ref.token_logprobs(mb.input_ids, mb.attention_mask, mb.prompt_len))
        finally:
            policy.train(was_training)
        cat = lambda xs: torch.cat(xs) if xs else None  # noqa: E731
        return cat(olds), cat(refs), cat(ents)

    def _mb_weight(self, mask: Tensor, mb_mask: Tensor) -> float:
        """Share of the batch's aggregation denominator held by one micro-batch (so the micro-batch losses
        sum to the full-batch loss)."""
        agg = self.settings.aggregation
        if agg == "token-mean":
            return float(mb_mask.sum()) / max(float(mask.sum()), 1.0)
        if agg == "seq-mean-token-mean":
            return float(mb_mask.any(1).sum()) / max(float(mask.any(1).sum()), 1.0)
        return mb_mask.shape[0] / max(mask.shape[0], 1)

    def micro_batch_loss(self, p: PreparedPG, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        s = self.settings
        ro, adv, mask = p.rows, p.advantages, p.mask
        first = p.old_logp is None  # the batch's first update supplies π_old (``old_logprobs: first_update``)
        logp, ent = ctx.policy.completion_scores(ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len,
                                                 entropy=first)  # (b, L) each, as policy.token_logprobs
        if first:
            p.pending.append((logp.detach(), ent))
        loss, stats = self.objective(
            logp, p.pending[-1][0] if first else p.old_logp[sl], adv[sl], mask[sl], eps_low=s.eps_low,
            eps_high=s.eps_high, ref_logp=None if p.ref_logp is None else p.ref_logp[sl], kl_beta=s.kl_beta,
            aggregation=s.aggregation,
        )
        return loss * self._mb_weight(mask, mask[sl]), stats

    def finish_update(self, p: PreparedPG, ctx: LossContext) -> dict[str, Tensor]:
        if p.old_logp is None and p.pending:  # the first update: its log-probs are π_old for the later ones
            olds, ents = zip(*p.pending)
            p.old_logp, p.pending = torch.cat(olds), []  # (B', L)
            p.metrics["train/entropy"] = masked_entropy_mean(torch.cat(ents), p.mask)
        return {}


# --------------------------------------------------------------------------------------------------- SFT
@dataclass
class SFTBatch(Prepared):
    """The external rows :class:`DenoisingSFTLoss` trains on, and the current update's mask draws."""

    draws: tuple[Tensor, Tensor, Tensor] | None = None  # t (N,), masked (N, L), target (N, L)
    update_step: int = -1  # the step ``draws`` belong to


class DenoisingSFTLoss(Loss):
    """Masked-denoising SFT (LLaDA's SFT objective, :mod:`lit_rl.core.denoising`) on the batch's external rows:
    per row ``t ~ U(eps, 1]``, each token masked w.p. ``t``, cross-entropy on masked tokens weighted by
    ``1/t`` and normalised by the row's length; a mean over rows. No reward is used.

    Args:
        eps: lower bound of the masking ratio ``t``.
        train_padding: train the EOS padding of the row's own width too (LLaDA SFT); ``False``: up to the
            first EOS only.
    """

    stats_prefix = "train/sft"

    @staticmethod
    def check_args(eps: float = 1e-3) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`),
        and :class:`~lit_rl.algorithms.denoising_sft.DenoisingSFT`'s ``eps``."""
        if not 0.0 < eps < 1.0:
            raise FieldError("eps", f"must be in (0, 1), got {eps}")

    def __init__(self, eps: float = 1e-3, train_padding: bool = True) -> None:
        DenoisingSFTLoss.check_args(eps=eps)
        self.eps, self.train_padding = eps, train_padding

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> SFTBatch:
        ext = rows_where(rollouts.source, decoded=False)  # rows the policy did not decode (the pool's)
        if not bool(ext.any()):
            raise RuntimeError("DenoisingSFT trains on external rollouts: set data.g_ext >= 1 (and data.g_on: 0)")
        return SFTBatch(rollouts.select(ext))

    def target_mask(self, ro: RolloutBatch) -> Tensor:
        """Trained positions ``(N, L)``: the row's own width (``train_padding``) or up to its first EOS."""
        if not self.train_padding:
            return ro.completion_mask.bool()
        pos = torch.arange(ro.completion_mask.shape[1], device=ro.completion_mask.device)
        return pos[None, :] < ro.gen_width[:, None]

    def _draws(self, p: SFTBatch, ctx: LossContext) -> tuple[Tensor, Tensor, Tensor]:
        """This update's ``t (N,)``, masked positions ``(N, L)`` and targets ``(N, L)``, drawn once per update
        (every row from its own seed at the update's step)."""
        if p.update_step != ctx.step or p.draws is None:
            target = self.target_mask(p.rows)  # (N, L)
            seeds = ctx.mask_seeds(p.rows)
            ts, masks = zip(*(denoising_masks(target[i : i + 1], rng.cpu_generator(s), self.eps)
                              for i, s in enumerate(seeds)))
            p.draws, p.update_step = (torch.cat(ts), torch.cat(masks), target), ctx.step  # (N,), (N, L), (N, L)
        return p.draws

    def micro_batch_loss(self, p: SFTBatch, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        ro, policy = p.rows, ctx.policy
        t, masked, target = self._draws(p, ctx)
        P = ro.prompt_len
        comp = ro.completion_ids[sl]  # (b, L)
        noisy = torch.where(masked[sl], torch.full_like(comp, policy.mask_id), comp)
        ids = torch.cat([ro.input_ids[sl, :P], noisy], 1)  # (b, P + L)
        logits = policy(ids, ro.attention_mask[sl])[:, P:]  # (b, L, V)
        loss = masked_denoising_loss(logits, comp, masked[sl], t[sl], target[sl].sum(-1))
        return loss * (comp.shape[0] / len(ro)), {}  # a mean over rows: each micro-batch weighs its share

    def finish_update(self, p: SFTBatch, ctx: LossContext) -> dict[str, Tensor]:
        t, masked, target = self._draws(p, ctx)
        return {"masked_frac": (masked.sum() / target.sum().clamp(min=1)).float(), "t_mean": t.mean()}
