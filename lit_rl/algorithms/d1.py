"""d1 and wd1, the dLLM RL baselines of ERILS's tables, as losses of the shared pipeline.

Both score a rollout with d1's **one-step estimator** (Zhao et al. 2025, "d1: Scaling Reasoning in Diffusion
Large Language Models via Reinforcement Learning", arXiv:2504.12216, §3.2): the whole completion is masked,
each real prompt token is masked w.p. ``p_mask_prompt`` (0.15), and one forward pass gives every completion
token's log-prob ``log p(o_k | x̃)`` (:func:`one_step_logprobs`). A mask draw belongs to one optimizer update
of the batch: update ``k`` of the ``μ`` updates uses the same draw for π_θ, π_old and π_ref, and different
updates draw differently (d1's ``random_masking``, one mask seed per iteration). lit_rl draws each row's
prompt mask from its own seed (``RLModule.mask_seeds`` at the update's ``global_step``) instead of one seed
per iteration for the whole batch, so micro-batching never changes a draw.

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

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.algorithms.losses import Loss, _kept
from lit_rl.core.entropy import masked_entropy_mean, token_entropy
from lit_rl.errors import FieldError
from lit_rl.core.spg import d1_loss, sequence_logprob_sum, token_logprobs_from_logits, wd1_weights
from lit_rl.rollouts.types import RolloutBatch

__all__ = ["D1Loss", "WD1Loss", "one_step_logprobs", "one_step_prompt_masks"]


def one_step_prompt_masks(prompt_mask: Tensor, seeds: list[int], p_mask_prompt: float) -> Tensor:
    """Which prompt tokens the one-step estimator masks: each real prompt token w.p. ``p_mask_prompt``,
    row ``i`` drawing from its own CPU stream ``seeds[i]``. Shapes: ``prompt_mask (B, P)`` -> ``(B, P)`` bool."""
    B, P = prompt_mask.shape
    if len(seeds) != B:
        raise ValueError(f"seeds must hold one seed per row ({B}), got {len(seeds)}")
    u = torch.stack([rng.uniform((P,), generator=rng.cpu_generator(s)) for s in seeds]) if B else torch.zeros(0, P)
    return prompt_mask.bool() & (u.to(prompt_mask.device) < p_mask_prompt)


def one_step_logprobs(
    policy: Any, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, prompt_masked: Tensor
) -> tuple[Tensor, Tensor]:
    """Log-probs of the completion tokens with the completion fully masked and ``prompt_masked`` prompt tokens
    masked (d1 ``forward_process``), and the denoiser's token entropy (detached) from the same logits.

    Shapes: ``input_ids, attention_mask (b, P + L)``, ``prompt_masked (b, P)`` -> ``(b, L)``, ``(b, L)``.
    """
    noisy = input_ids.clone()
    noisy[:, :prompt_len] = torch.where(prompt_masked, policy.mask_id, input_ids[:, :prompt_len])
    noisy[:, prompt_len:] = policy.mask_id
    logits = policy(noisy, attention_mask)[:, prompt_len:]  # (b, L, V)
    return token_logprobs_from_logits(logits, input_ids[:, prompt_len:]), token_entropy(logits.detach())


@dataclass
class OneStepBatch:
    """What a one-step loss fixes once per rollout batch (``B'`` rows, ``μ`` updates)."""

    rollouts: RolloutBatch  # the B' rows
    advantages: Tensor  # (B',)
    prompt_masked: Tensor  # (μ, B', P): update k's prompt mask draw
    old_logp: Tensor | None = None  # (μ, B', L) π_old under update k's draw (D1Loss, μ > 1)
    ref_logp: Tensor | None = None  # (μ, B', L) π_ref under update k's draw (D1Loss, β > 0)
    weights: Tensor | None = None  # (B',) wd1's softmax(−A) − softmax(A) within groups (WD1Loss)
    calls: int = field(default=0)  # updates made so far (which draw the next one uses)


class _OneStepLoss(Loss):
    """The shared part: kept rows, one prompt-mask draw per update, micro-batched forward passes."""

    @staticmethod
    def check_args(p_mask_prompt: float = 0.15) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if not 0.0 <= p_mask_prompt < 1.0:
            raise FieldError("p_mask_prompt", f"must be in [0, 1), got {p_mask_prompt}")

    def __init__(self, p_mask_prompt: float = 0.15) -> None:
        _OneStepLoss.check_args(p_mask_prompt=p_mask_prompt)
        self.p_mask_prompt = p_mask_prompt

    def draws(self, ro: RolloutBatch, module: Any) -> Tensor:
        """Every update's prompt masks ``(μ, B', P)``; update ``k`` is at ``global_step + k``."""
        prompt_mask = ro.attention_mask[:, : ro.prompt_len]
        start = module.global_step
        return torch.stack([
            one_step_prompt_masks(prompt_mask, module.mask_seeds(ro, start + k), self.p_mask_prompt)
            for k in range(module.updates_per_batch)
        ])

    @torch.no_grad()
    def fixed_logprobs(self, policy: Any, ro: RolloutBatch, prompt_masked: Tensor, size: int) -> Tensor:
        """One-step log-probs ``(μ, B', L)`` of every update's draw, in eval mode, without gradients."""
        was_training = policy.training
        policy.eval()
        try:
            out = [
                torch.cat([
                    one_step_logprobs(policy, mb.input_ids, mb.attention_mask, ro.prompt_len, pm)[0]
                    for mb, pm in zip(ro.micro_batches(size), draw.split(size))
                ])
                for draw in prompt_masked
            ]
        finally:
            policy.train(was_training)
        return torch.stack(out)

    def next_draw(self, p: OneStepBatch) -> int:
        k = p.calls % p.prompt_masked.shape[0]
        p.calls += 1
        return k


class D1Loss(_OneStepLoss):
    """d1 (diffu-GRPO) on the one-step estimator (module docstring).

    Args:
        epsilon: symmetric clip ``[1−ε, 1+ε]`` (d1 0.5).
        beta: k3 KL coefficient to the reference (d1 0.04; 0: no reference kept).
        p_mask_prompt: prompt-token masking probability (d1 0.15).
        reference: the KL reference: ``"auto"`` (LoRA: adapter disabled; else a frozen copy of the policy
            taken when training starts), ``"adapter"``, ``"copy"``. With a LoRA policy the adapter-disabled
            reference is the base model, i.e. the policy from before any warm-up that trained the adapter;
            the copy is the policy RL starts from. Under FSDP2 only ``"adapter"`` (or β 0) is allowed.

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
    def check_args(epsilon: float = 0.5, beta: float = 0.04, reference: str = "auto") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        ``p_mask_prompt`` is the base's."""
        if not 0.0 < epsilon < 1.0:
            raise FieldError("epsilon", f"must be in (0, 1), got {epsilon}")
        if beta < 0:
            raise FieldError("beta", f"must be >= 0, got {beta}")
        if reference not in ("auto", "adapter", "copy"):
            raise FieldError("reference", f"must be 'auto', 'adapter' or 'copy', got {reference!r}")

    def __init__(self, epsilon: float = 0.5, beta: float = 0.04, p_mask_prompt: float = 0.15,
                 reference: str = "auto") -> None:
        super().__init__(p_mask_prompt)
        D1Loss.check_args(epsilon=epsilon, beta=beta, reference=reference)
        self.epsilon, self.beta, self.reference = epsilon, beta, reference

    @property
    def reference_mode(self) -> str | None:  # type: ignore[override]
        return self.reference if self.beta > 0 else None

    def prepare(self, rollouts: RolloutBatch, module: Any) -> OneStepBatch:
        ro = _kept(rollouts)
        size = module.micro_batch_size or len(ro)
        draws = self.draws(ro, module)  # (μ, B', P)
        old = self.fixed_logprobs(module.policy, ro, draws, size) if module.updates_per_batch > 1 else None
        ref = None
        if self.beta > 0:
            with module.reference_policy() as reference:
                ref = self.fixed_logprobs(reference, ro, draws, size)
        return OneStepBatch(ro, ro.advantages, draws, old_logp=old, ref_logp=ref)

    def backward(self, p: OneStepBatch, module: Any) -> tuple[Tensor, dict[str, Tensor]]:
        k = self.next_draw(p)
        ro, mask = p.rollouts, p.rollouts.completion_mask.bool()  # (B', L)
        size = module.micro_batch_size or len(ro)
        total = mask.sum().clamp(min=1)
        loss_sum = torch.zeros((), device=module.device)
        stats: dict[str, Tensor] = {}
        ents = []
        for start in range(0, len(ro), size):
            sl = slice(start, start + size)
            logp, ent = one_step_logprobs(module.policy, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len,
                                          p.prompt_masked[k, sl])  # (b, L) each
            old = logp.detach() if p.old_logp is None else p.old_logp[k, sl]
            ref = None if p.ref_logp is None else p.ref_logp[k, sl]
            loss, stats = d1_loss(logp, old, p.advantages[sl], mask[sl], epsilon=self.epsilon, beta=self.beta,
                                  ref_logp=ref)
            loss = loss * (mask[sl].sum() / total)  # token mean over the batch: each micro-batch's share
            module.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
            ents.append(ent)
        stats["entropy"] = masked_entropy_mean(torch.cat(ents), mask)
        return loss_sum, stats


class WD1Loss(_OneStepLoss):
    """wd1's weighted likelihood on the one-step estimator (module docstring).

    Args:
        p_mask_prompt: prompt-token masking probability (wd1 0.15, as d1).
        group_reduction: how the per-group losses ``Σ_{i in g} (w−_i − w+_i) S_i`` combine: ``"mean"``
            (default) divides their sum by the number of groups, which is what the wd1 code's training
            amounts to (one group per device, gradients averaged over devices); ``"sum"`` adds them
            (:func:`~lit_rl.core.spg.wd1_loss`'s value; the gradient is ``#groups`` times larger).
    """

    stats_prefix = "train/wd1"

    @staticmethod
    def check_args(group_reduction: str = "mean") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        ``p_mask_prompt`` is the base's."""
        if group_reduction not in ("mean", "sum"):
            raise FieldError("group_reduction", f"must be 'mean' or 'sum', got {group_reduction!r}")

    def __init__(self, p_mask_prompt: float = 0.15, group_reduction: str = "mean") -> None:
        super().__init__(p_mask_prompt)
        WD1Loss.check_args(group_reduction=group_reduction)
        self.group_reduction = group_reduction

    def prepare(self, rollouts: RolloutBatch, module: Any) -> OneStepBatch:
        ro = _kept(rollouts)
        w_pos, w_neg = wd1_weights(ro.advantages.float(), ro.group)  # (B',) each, softmax within groups
        weights = w_neg - w_pos
        if self.group_reduction == "mean" and len(ro):
            weights = weights / torch.unique(ro.group).numel()
        return OneStepBatch(ro, ro.advantages, self.draws(ro, module), weights=weights)

    def backward(self, p: OneStepBatch, module: Any) -> tuple[Tensor, dict[str, Tensor]]:
        k = self.next_draw(p)
        ro, mask = p.rollouts, p.rollouts.completion_mask.bool()
        size = module.micro_batch_size or len(ro)
        loss_sum = torch.zeros((), device=module.device)
        seq, ents = [], []
        for start in range(0, len(ro), size):
            sl = slice(start, start + size)
            logp, ent = one_step_logprobs(module.policy, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len,
                                          p.prompt_masked[k, sl])
            s = sequence_logprob_sum(logp, mask[sl])  # (b,)
            loss = (p.weights[sl].to(s.device) * s).sum()  # the micro-batch's terms of Σ (w− − w+) S
            module.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
            seq.append(s.detach())
            ents.append(ent)
        stats = {"seq_logp_mean": torch.cat(seq).mean(), "entropy": masked_entropy_mean(torch.cat(ents), mask)}
        return loss_sum, stats
