"""d1 and wd1, the dLLM RL baselines of ERILS's tables, as losses of the shared pipeline.

Both score a rollout with a likelihood estimator (:mod:`lit_rl.algorithms.estimators`; ``estimator:`` in YAML),
by default d1's **one-step estimator** (Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion
Large Language Models via Reinforcement Learning", arXiv:2504.12216, §3.2): the whole completion is masked,
each real prompt token is masked w.p. ``p_mask_prompt`` (0.15), and one forward pass gives every completion
token's log-prob ``log p(o_k | x̃)`` (:class:`~lit_rl.algorithms.estimators.OneStep`). A mask draw belongs to
one optimizer update of the batch: update ``k`` of the ``μ`` updates uses the same draw for π_θ, π_old and
π_ref, and different updates draw differently (d1's ``random_masking``, one mask seed per iteration). lit_rl
draws each row's prompt mask from its own seed (``LossContext.mask_seeds`` at the update's ``global_step``)
instead of one seed per iteration for the whole batch, so micro-batching never changes a draw.

* :class:`D1Loss` (diffu-GRPO): :func:`~lit_rl.core.spg.d1_loss`, the token-level PPO clip
  ``[1−ε, 1+ε]`` (ε 0.5) with ``β·k3`` to the reference (β 0.04), a token mean over the batch's completion
  tokens. ``prepare`` computes π_old of every update's draw before the first update (with ``μ = 1``,
  π_old = π_θ detached, as d1 does: the ratio is 1) and π_ref when β > 0, both without gradients.
* :class:`WD1Loss` (Tang et al. 2025, "wd1: Weighted Policy Optimization for Reasoning in Diffusion Language
  Models", arXiv:2507.08838): ``Σ_i (softmax(−A)_i − softmax(A)_i) · S_i`` with ``S_i`` the one-step
  sequence log-likelihood (:func:`~lit_rl.core.spg.wd1_loss`); no π_old, no reference. The softmax runs
  within each prompt group (the wd1 code takes it over the per-device batch, one group in its configs) and
  the per-group losses are averaged over the batch's groups (``group_reduction``; the wd1 code's DDP
  gradient average over devices).

Rows of every source are scored alike (the estimator needs no generation trace), so both also run on
ERILS's mixed groups; the d1 / wd1 papers train on-policy rows only (``conf/d1.yaml``, ``conf/wd1.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rl.algorithms.estimators import Draw, LikelihoodEstimator, OneStep, TokenScores, slice_draw
from lit_rl.algorithms.loss_api import Loss, LossContext, Prepared, kept_rows
from lit_rl.core.entropy import masked_entropy_mean
from lit_rl.core.inpainting import keep_high_entropy_hints
from lit_rl.core.spg import d1_loss, sequence_logprob_sum, wd1_weights
from lit_rl.errors import FieldError
from lit_rl.batch import RolloutBatch

__all__ = ["D1Loss", "WD1Loss"]


@dataclass
class OneStepBatch(Prepared):
    """What an estimator-based loss fixes once per rollout batch (``B'`` rows, ``μ`` updates)."""

    advantages: Tensor | None = None  # (B',)
    draws: list[Draw] | None = None  # μ: update k's masks for the B' rows
    old_logp: Tensor | None = None  # (μ, B', L) π_old's per-token estimate under update k's draw (D1Loss, μ > 1)
    ref_logp: Tensor | None = None  # (μ, B', L) π_ref's, likewise (D1Loss, β > 0)
    weights: Tensor | None = None  # (B',) wd1's softmax(−A) − softmax(A) within groups (WD1Loss)
    loss_masks: Tensor | None = None  # (μ, B', L) update k's scored positions (D1Loss with IGPO's hint filter)
    entropies: list[Tensor] | None = None  # this update's per-micro-batch token entropies (b, L)
    seq_logps: list[Tensor] | None = None  # this update's per-micro-batch sequence log-likelihoods (b,) (WD1Loss)


class _EstimatorLoss(Loss):
    """The shared part: kept rows, one estimator draw per update, micro-batched forward passes."""

    @staticmethod
    def check_args(p_mask_prompt: float | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if p_mask_prompt is not None:
            OneStep.check_args(p_mask_prompt=p_mask_prompt)

    def __init__(self, p_mask_prompt: float | None = None, estimator: LikelihoodEstimator | None = None) -> None:
        _EstimatorLoss.check_args(p_mask_prompt=p_mask_prompt)
        if estimator is not None and p_mask_prompt is not None:
            raise FieldError("p_mask_prompt", "is the one-step estimator's: with estimator set, set it there "
                             "(estimator.init_args.p_mask_prompt for OneStep)")
        one_step = OneStep(0.15 if p_mask_prompt is None else p_mask_prompt)
        self.estimator = estimator if estimator is not None else one_step

    def bind(self, policy: torch.nn.Module) -> None:
        self.estimator.bind(policy)

    def draws(self, ro: RolloutBatch, ctx: LossContext) -> list[Draw]:
        """Every update's draw; update ``k`` is at ``ctx.step + k``."""
        return [self.estimator.draw(ro, ctx.mask_seeds(ro, ctx.step + k)) for k in range(ctx.updates_per_batch)]

    def scores(self, policy, ro: RolloutBatch, draw: Draw, sl: slice) -> TokenScores:
        return self.estimator.score(policy, ro.slice_rows(sl), slice_draw(draw, sl))

    @torch.no_grad()
    def fixed_logprobs(self, policy, ro: RolloutBatch, draws: list[Draw], ctx: LossContext,
                       with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Per-token estimates ``(μ, B', L)`` of every update's draw, in eval mode, without gradients (and the
        token entropies ``(μ, B', L)`` of the same forwards when ``with_entropy``)."""
        was_training = policy.training
        policy.eval()
        logps, ents = [], []
        try:
            for d in draws:
                scores = [self.scores(policy, ro, d, sl) for sl in ctx.slices(len(ro))]
                logps.append(torch.cat([sc.per_token() for sc in scores]))
                if with_entropy:
                    ents.append(torch.cat([sc.per_token_entropy() for sc in scores]))
        finally:
            policy.train(was_training)
        return (torch.stack(logps), torch.stack(ents)) if with_entropy else torch.stack(logps)

    def entropy_of_update(self, p: OneStepBatch, mask: Tensor) -> Tensor:
        ents, p.entropies = p.entropies or [], None
        return masked_entropy_mean(torch.cat(ents), mask)


class D1Loss(_EstimatorLoss):
    """d1 (diffu-GRPO) on a likelihood estimator (module docstring; d1's one-step estimator by default).

    Args:
        epsilon: symmetric clip ``[1−ε, 1+ε]`` (d1 0.5).
        beta: k3 KL coefficient to the reference (d1 0.04; 0: no reference kept).
        p_mask_prompt: the one-step estimator's prompt-token masking probability (d1 0.15; sugar for
            ``estimator: OneStep``, not allowed with ``estimator``).
        reference: the KL reference: ``"auto"`` (LoRA: adapter disabled; else a frozen copy of the policy
            taken when training starts), ``"adapter"``, ``"copy"``. With a LoRA policy the adapter-disabled
            reference is the base model, i.e. the policy from before any warm-up that trained the adapter;
            the copy is the policy RL starts from. Under FSDP2 only ``"adapter"`` (or β 0) is allowed.
        estimator: the likelihood estimator (:mod:`lit_rl.algorithms.estimators`; default ``OneStep``;
            ``Coupled``: DiffuCoder's coupled-GRPO).
        hint_keep_ratio: IGPO's entropy filter on inpainted rows (``RolloutBatch.hint_mask``): per update and
            row, only the ``max(1, floor(ratio · n))`` highest-entropy of the ``n`` scored hint positions stay in
            the loss (IGPO 0.2; :func:`~lit_rl.core.inpainting.keep_high_entropy_hints`), with π_old's entropy
            under that update's draw (a no-gradient pass, also when ``μ = 1``, on every batch while set).
            Positions outside the hints are
            unaffected; ``None`` (default) scores hint positions like any other. The filter acts on d1's
            per-token objective, as the IGPO paper describes it; IGPO's released script trains with a
            sequence-level ratio (GSPO), under which the filter only re-weights rows and masks the KL term.

    Departures from the d1 code (diffu-GRPO on TRL 0.16), none of which changes the objective's form:

    * the token mean runs over the kept rows of the whole rollout batch; d1 takes it per per-device batch
      (one prompt group) and averages those over devices and gradient-accumulation steps, so groups with
      long completions weigh more here;
    * π_old and π_ref are computed with the policy in eval mode (no dropout), d1's in the model's training
      mode (the tiny and LLaDA models have no dropout, so the numbers agree there);
    * prompt padding is never masked (d1's ``forward_process`` draws over every prompt position);
    * a draw is indexed by the row and the update (``global_step + k``), not by d1's per-iteration seed;
    * the reference is never re-synced to the policy (TRL's ``sync_ref_model``, off in d1's configs too).
    """

    stats_prefix = "train/d1"

    @staticmethod
    def check_args(epsilon: float = 0.5, beta: float = 0.04, reference: str = "auto",
                   hint_keep_ratio: float | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        ``p_mask_prompt`` is the base's."""
        if not 0.0 < epsilon < 1.0:
            raise FieldError("epsilon", f"must be in (0, 1), got {epsilon}")
        if hint_keep_ratio is not None and not 0.0 < hint_keep_ratio <= 1.0:
            raise FieldError("hint_keep_ratio", f"must be in (0, 1] or null, got {hint_keep_ratio}")
        if beta < 0:
            raise FieldError("beta", f"must be >= 0, got {beta}")
        if reference not in ("auto", "adapter", "copy"):
            raise FieldError("reference", f"must be 'auto', 'adapter' or 'copy', got {reference!r}")

    def __init__(self, epsilon: float = 0.5, beta: float = 0.04, p_mask_prompt: float | None = None,
                 reference: str = "auto", estimator: LikelihoodEstimator | None = None,
                 hint_keep_ratio: float | None = None) -> None:
        super().__init__(p_mask_prompt, estimator)
        D1Loss.check_args(epsilon=epsilon, beta=beta, reference=reference, hint_keep_ratio=hint_keep_ratio)
        self.epsilon, self.beta, self.reference = epsilon, beta, reference
        self.hint_keep_ratio = hint_keep_ratio

    @property
    def reference_mode(self) -> str | None:  # type: ignore[override]
        return self.reference if self.beta > 0 else None

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> OneStepBatch:
        ro = kept_rows(rollouts)
        draws = self.draws(ro, ctx)
        completion = ro.completion_mask.bool()  # (B', L)
        hints = ro.hint_mask & completion  # (B', L)
        filtering = self.hint_keep_ratio is not None  # every batch, hints or not: ranks run the same passes
        old, masks, metrics = None, None, {}
        if ctx.updates_per_batch > 1 or filtering:
            fixed = self.fixed_logprobs(ctx.policy, ro, draws, ctx, with_entropy=filtering)  # (μ, B', L) each
            old, ent = fixed if filtering else (fixed, None)
            if filtering:  # IGPO's entropy filter, per update under its own draw
                masks = torch.stack([keep_high_entropy_hints(completion, hints, ent[k], self.hint_keep_ratio)
                                     for k in range(len(draws))])  # (μ, B', L)
                metrics = {"train/d1/hint_tokens": hints.sum().float(),
                           "train/d1/hint_tokens_kept": (masks[0] & hints).sum().float()}
            if ctx.updates_per_batch == 1:
                old = None  # μ = 1: π_old is π_θ detached (the ratio is 1), as d1 does
        ref = None
        if self.beta > 0:
            with ctx.reference_policy() as reference:
                ref = self.fixed_logprobs(reference, ro, draws, ctx)
        return OneStepBatch(ro, metrics, advantages=ro.advantages, draws=draws, old_logp=old, ref_logp=ref,
                            loss_masks=masks)

    def micro_batch_loss(self, p: OneStepBatch, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        k = ctx.update % len(p.draws)
        mask = p.rows.completion_mask.bool() if p.loss_masks is None else p.loss_masks[k]  # (B', L)
        scores = self.scores(ctx.policy, p.rows, p.draws[k], sl)
        logp = scores.per_token()  # (b, L)
        old = logp.detach() if p.old_logp is None else p.old_logp[k, sl]
        ref = None if p.ref_logp is None else p.ref_logp[k, sl]
        loss, stats = d1_loss(logp, old, p.advantages[sl], mask[sl], epsilon=self.epsilon, beta=self.beta,
                              ref_logp=ref)
        p.entropies = (p.entropies or []) + [scores.per_token_entropy()]
        return loss * (mask[sl].sum() / mask.sum().clamp(min=1)), stats  # the batch's token mean: this share

    def finish_update(self, p: OneStepBatch, ctx: LossContext) -> dict[str, Tensor]:
        return {"entropy": self.entropy_of_update(p, p.rows.completion_mask.bool())}


class WD1Loss(_EstimatorLoss):
    """wd1's weighted likelihood on a likelihood estimator (module docstring; one-step by default).

    Args:
        p_mask_prompt: the one-step estimator's prompt-token masking probability (wd1 0.15, as d1; sugar for
            ``estimator: OneStep``).
        group_reduction: how the per-group losses ``Σ_{i in g} (w−_i − w+_i) S_i`` combine: ``"mean"``
            (default) divides their sum by the number of groups, which is what the wd1 code's training
            amounts to (one group per device, gradients averaged over devices); ``"sum"`` adds them
            (:func:`~lit_rl.core.spg.wd1_loss`'s value; the gradient is ``#groups`` times larger).
        estimator: the likelihood estimator (default ``OneStep``).
    """

    stats_prefix = "train/wd1"

    @staticmethod
    def check_args(group_reduction: str = "mean") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        ``p_mask_prompt`` is the base's."""
        if group_reduction not in ("mean", "sum"):
            raise FieldError("group_reduction", f"must be 'mean' or 'sum', got {group_reduction!r}")

    def __init__(self, p_mask_prompt: float | None = None, group_reduction: str = "mean",
                 estimator: LikelihoodEstimator | None = None) -> None:
        super().__init__(p_mask_prompt, estimator)
        WD1Loss.check_args(group_reduction=group_reduction)
        self.group_reduction = group_reduction

    def prepare(self, rollouts: RolloutBatch, ctx: LossContext) -> OneStepBatch:
        ro = kept_rows(rollouts)
        w_pos, w_neg = wd1_weights(ro.advantages.float(), ro.group)  # (B',) each, softmax within groups
        weights = w_neg - w_pos
        if self.group_reduction == "mean" and len(ro):
            weights = weights / torch.unique(ro.group).numel()
        return OneStepBatch(ro, advantages=ro.advantages, draws=self.draws(ro, ctx), weights=weights)

    def micro_batch_loss(self, p: OneStepBatch, sl: slice, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        k = ctx.update % len(p.draws)
        mask = p.rows.completion_mask.bool()
        scores = self.scores(ctx.policy, p.rows, p.draws[k], sl)
        s = sequence_logprob_sum(scores.per_token(), mask[sl])  # (b,)
        p.entropies = (p.entropies or []) + [scores.per_token_entropy()]
        p.seq_logps = (p.seq_logps or []) + [s.detach()]
        return (p.weights[sl].to(s.device) * s).sum(), {}  # the micro-batch's terms of Σ (w− − w+) S

    def finish_update(self, p: OneStepBatch, ctx: LossContext) -> dict[str, Tensor]:
        seq, p.seq_logps = torch.cat(p.seq_logps or [torch.zeros(0)]), None
        return {"seq_logp_mean": seq.mean(), "entropy": self.entropy_of_update(p, p.rows.completion_mask.bool())}
