"""The SPG surrogate's math and the d1 / wd1 baseline losses, as pure functions.

SPG (Wang et al. 2025, "Sandwiched Policy Gradient", arXiv:2510.09541), following its reference code
(facebookresearch/SPG, ``SPGTrainer._get_per_seq_logps`` and ``compute_loss``) where it is more specific
than the paper text; ERILS Eq. 5 and Eq. 10 (the surrogate replaces log π(o|p) in the group policy
gradient). Per rollout ``i`` with completion length ``L_i`` and ``num_t`` noise draws ``j``::

    ELBO_i = mean_j [ (1/|M_j|) Σ_{t∈M_j} log p(o_t | x̃_j) ]
    t_j    = |M_j| / L_i
    a_t    = mean_j [ 1[t∈M_j] · p(o_t | x̃_j)^β / t_j ]          (mean over all num_t draws)
    EUBO_i = (1/β) · mean_{t: a_t>0} log a_t
    MIX_i  = w · EUBO_i + (1-w) · ELBO_i
    S_i    = ELBO_i if A_i > 0 else (EUBO_i | MIX_i | ELBO_i)
    loss   = Σ_i (-A_i · S_i · L_i) / Σ_i L_i

Inputs are per-token log-probs of the ORIGINAL tokens, ``token_logprobs (num_t, B, L)``, and the scored
positions ``loss_mask (num_t, B, L)`` (:mod:`lit_rl.core.masks`); values of ``token_logprobs`` outside
``loss_mask`` are ignored (and receive no gradient), even NaN. The orchestration (masks -> forward passes
-> these functions) is :class:`lit_rl.algorithms.surrogates.SPGSurrogate`.

Baselines: the d1 one-step estimator with d1's token-level PPO-clip loss and k3 KL (:func:`d1_loss`, on
:func:`lit_rl.core.pg.clipped_pg_loss`), and wd1's weighted-likelihood loss (:func:`wd1_loss`).
"""

from __future__ import annotations

import math

import torch

from lit_rl.core.pg import clipped_pg_loss

__all__ = [
    "coupled_coefficients",
    "d1_loss",
    "elbo",
    "eubo",
    "mix",
    "sequence_logprob_sum",
    "spg_loss",
    "spg_select",
    "token_logprobs_from_logits",
    "wd1_loss",
    "wd1_weights",
]


def token_logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[targets]`` in float32 without materialising the log-softmax.

    Shapes: ``logits (..., V)``, ``targets (...)`` -> ``(...)``.
    """
    logits = logits.float()
    picked = logits.gather(-1, targets[..., None]).squeeze(-1)  # (...)
    return picked - torch.logsumexp(logits, dim=-1)


def elbo(token_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """SPG's ELBO estimate: per draw the mean log-prob over its scored positions, then the mean over draws.

    A draw with no scored position contributes 0 (SPG clamps the denominator; it still counts in the mean).

    Shapes: ``token_logprobs (num_t, B, L)``, ``loss_mask (num_t, B, L)`` -> ``(B,)``.
    """
    m = loss_mask.bool()
    summed = torch.where(m, token_logprobs, 0.0).sum(-1)  # (num_t, B)
    count = m.sum(-1).clamp(min=1)  # (num_t, B)
    return (summed / count).mean(0)  # (B,)


def eubo(
    token_logprobs: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, beta: float = 1.0
) -> torch.Tensor:
    """SPG's EUBO estimate (Rényi-style upper bound), computed in log space.

    ``log a_t = logsumexp_j [β·log p_jt − log t_j  over draws j with t ∈ M_j] − log num_t`` with
    ``log t_j = log|M_j| − log L_i``; identical to SPG's ``mean_j(p^β · 1[t∈M_j] / t_j)`` followed by a log,
    without under/overflow of ``p^β``. ``EUBO = mean over positions scored in any draw of log a_t, / β``;
    0 for a row with no scored position.

    Shapes: ``token_logprobs (num_t, B, L)``, ``loss_mask (num_t, B, L)``, ``lengths (B,)`` -> ``(B,)``.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    m = loss_mask.bool()
    num_t = m.shape[0]
    count = m.sum(-1)  # (num_t, B) |M_j|
    log_t = torch.log(count.clamp(min=1).to(token_logprobs.dtype)) - torch.log(
        lengths.clamp(min=1).to(token_logprobs.dtype)
    )  # (num_t, B)
    terms = beta * token_logprobs - log_t[..., None]  # (num_t, B, L)
    terms = torch.where(m, terms, float("-inf"))
    scored = m.any(0)  # (B, L) a_t > 0
    terms = torch.where(scored[None], terms, 0.0)  # keep logsumexp (and its gradient) finite off-support
    log_a = torch.logsumexp(terms, dim=0) - math.log(num_t)  # (B, L)
    n_scored = scored.sum(-1)  # (B,)
    return torch.where(scored, log_a, 0.0).sum(-1) / n_scored.clamp(min=1) / beta  # (B,)


def mix(elbo_value: torch.Tensor, eubo_value: torch.Tensor, w: float = 0.5) -> torch.Tensor:
    """SPG's mixture ``w · EUBO + (1 − w) · ELBO``. Shapes: ``(B,), (B,) -> (B,)``."""
    return w * eubo_value + (1.0 - w) * elbo_value


def spg_select(elbo_value: torch.Tensor, negative_value: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Sandwich: the lower bound (ELBO) for ``A > 0``, the upper bound / mix otherwise.

    ``A == 0`` takes the negative branch, as SPG's code (``reward_mask = advantages > 0``); its loss term is
    ``0 · S`` either way. Shapes: ``(B,), (B,), (B,) -> (B,)``.
    """
    return torch.where(advantages > 0, elbo_value, negative_value)


def spg_loss(
    advantages: torch.Tensor, surrogate: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Length-weighted policy-gradient loss ``Σ_i(−A_i·S_i·L_i) / Σ_i L_i`` (SPG ``compute_loss``).

    Each rollout's term is weighted by its completion length, so the gradient matches SPG's token-sum
    normalisation; ``Σ L`` is clamped to 1 for an all-empty batch.

    Eq. 10 (one reading, the same in docs/erils.md and ``SPGSurrogate(weighting=)``; for ``A ≤ 0`` rows S is the
    EUBO / mix, scaled by ``L_i`` the same way; B is the per-device batch: under DDP each rank divides by its own
    ``Σ L``): ERILS Eq. 10 is
    ``(1/B) Σ_i A_i ∇S_i`` with ``S_i`` App. A's sum-form ELBO (Eq. 14: ``(1/t) Σ_{k∈M} log π``, ``t = |M|/L_i``),
    which equals ``L_i · s_i`` for ``s_i`` the per-token mean ``surrogate`` here. So this loss is Eq. 10 times
    ``B / Σ_i L_i`` (Eq. 10 divided by the batch's mean completion length: one factor for the whole batch, the
    rollouts' relative weights are Eq. 10's). ``lengths = ones`` (``SPGSurrogate(weighting="rollout")``) gives
    ``(1/B) Σ_i A_i s_i``: Eq. 10's form with the per-token mean in place of the sum-form ELBO, where a rollout of
    length L weighs 1/L of its Eq. 10 weight relative to the others. With A = [1, 1], L = [10, 100]: Eq. 10 gives
    ``(10∇s_1 + 100∇s_2)/2``, this ``(10∇s_1 + 100∇s_2)/110`` (= Eq. 10 × 2/110), ``rollout`` ``(∇s_1 + ∇s_2)/2``.

    Shapes: ``advantages (B,)``, ``surrogate (B,)``, ``lengths (B,)`` -> scalar loss; stats are detached
    scalars.
    """
    L = lengths.to(surrogate.dtype)
    adv = advantages.to(surrogate.dtype)
    loss = (-adv * surrogate * L).sum() / L.sum().clamp(min=1)
    stats = {
        "loss": loss.detach(),
        "surrogate_mean": surrogate.detach().mean(),
        "advantage_mean": adv.detach().mean(),
        "frac_positive_advantage": (adv.detach() > 0).float().mean(),
        "completion_length_mean": L.detach().mean(),
    }
    return loss, stats


def sequence_logprob_sum(token_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Σ of token log-probs over scored positions (wd1's sequence score under the d1 estimator).

    Shapes: ``(..., L), (..., L) -> (...)``.
    """
    return torch.where(loss_mask.bool(), token_logprobs, 0.0).sum(-1)


def d1_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    epsilon: float = 0.5,
    beta: float = 0.04,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """d1 (diffu-GRPO) loss over one-step-estimator token log-probs
    (:func:`~lit_rl.core.masks.full_completion_masks`: completion fully masked, prompt masked w.p. 0.15):
    :func:`~lit_rl.core.pg.clipped_pg_loss` with d1's symmetric clip ``[1−ε, 1+ε]``, ``β·k3`` to the
    reference and the token mean over all completion tokens of the batch (d1 ``compute_loss``).

    Shapes: ``logp, old_logp, ref_logp, completion_mask (B, L)``, ``advantages (B,)`` -> scalar. Stats:
    ``loss``, ``clip_frac`` (tokens whose clipped term is the one used, so their gradient is zero: ``A > 0``
    and ``r > 1+ε``, or ``A < 0`` and ``r < 1−ε``), ``ratio_mean`` and, with ``β ≠ 0``, ``kl``. d1's code logs
    TRL 0.16's ``clip_ratio`` instead, ``coef_1·A < coef_2·A``: the tokens outside the range on the other side
    (the unclipped term kept), so the two numbers are not comparable.
    """
    loss, pg = clipped_pg_loss(
        logp, old_logp, advantages, completion_mask, eps_low=epsilon, eps_high=epsilon,
        ref_logp=ref_logp if beta != 0.0 else None, kl_beta=beta, aggregation="token-mean",
    )
    stats = {"loss": loss.detach(), "clip_frac": pg["clip_frac"], "ratio_mean": pg["ratio_mean"]}
    if beta != 0.0:
        stats["kl"] = pg["kl_mean"]
    return loss, stats


def wd1_loss(
    seq_logp: torch.Tensor, advantages: torch.Tensor, group: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """wd1 (Tang et al. 2025) weighted-likelihood loss ``−Σ softmax(A)_i S_i + Σ softmax(−A)_i S_i``.

    ``S_i`` is :func:`sequence_logprob_sum` under the d1 estimator (wd1 code). The reference takes the
    softmax over the per-device batch, which is one prompt group in its configs; ``group (B,)`` makes that
    explicit (softmax within each group, summed over groups); ``None`` = the whole batch is one group.

    Shapes: ``seq_logp (B,)``, ``advantages (B,)``, ``group (B,)`` -> scalar.
    """
    w_pos, w_neg = wd1_weights(advantages.to(seq_logp.dtype), group)
    if w_pos.numel() == 0:  # an empty batch: a zero still connected to the graph
        loss = seq_logp.sum() * 0.0
        return loss, {"loss": loss.detach(), "seq_logp_mean": loss.detach()}
    loss = -(w_pos * seq_logp).sum() + (w_neg * seq_logp).sum()
    return loss, {"loss": loss.detach(), "seq_logp_mean": seq_logp.detach().mean()}


def wd1_weights(advantages: torch.Tensor, group: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """wd1's row weights ``(softmax(A), softmax(−A))``, each softmax within a group (``None``: one group).

    They depend on the advantages only, so a batch can fix them once and split its rows into micro-batches:
    the wd1 loss is ``Σ_i (w−_i − w+_i) · S_i``. Shapes: ``(B,), (B,) -> (B,), (B,)``.
    """
    if advantages.numel() == 0:
        return advantages.clone(), advantages.clone()
    if group is None:
        group = torch.zeros_like(advantages, dtype=torch.long)
    _, g = torch.unique(group, return_inverse=True)  # (B,) dense group ids
    onehot = g[None, :] == torch.arange(int(g.max()) + 1, device=g.device)[:, None]  # (G, B)

    def group_softmax(x: torch.Tensor) -> torch.Tensor:
        z = torch.where(onehot, x[None, :], float("-inf"))  # (G, B)
        return torch.softmax(z, dim=-1).nan_to_num(0.0).sum(0)  # (B,)

    return group_softmax(advantages), group_softmax(-advantages)


def coupled_coefficients(masked_a: torch.Tensor, t: torch.Tensor, full_mask_copy: bool = True) -> torch.Tensor:
    """DiffuCoder's coupled estimate (arXiv:2506.20639 §4) as coefficients of its noisy copies' log-probs.

    Copy ``a`` masks the completion positions ``masked_a`` (drawn at ratio ``t``), copy ``b`` the complement;
    a token's estimate is ``w·log p`` from the copy that masks it, ``w = 1/t`` (``a``) or ``1/(1 − t)`` (``b``).
    With ``full_mask_copy`` (the reference code) a fully masked copy comes first and the estimate is
    ``(log p_full + w·log p_masked) / 2``, so the coefficients are ``[1/2, w_a/2, w_b/2]``; without it
    ``[w_a, w_b]``. The per-token estimate is ``Σ_d coef_d · logp_d``.

    Shapes: ``masked_a (B, L)`` bool, ``t (B,)`` -> ``(D, B, L)`` float, ``D`` = 3 or 2.
    """
    a = masked_a.float()
    t = t.float()[:, None]  # (B, 1)
    w_a, w_b = a / t, (1.0 - a) / (1.0 - t)  # (B, L) each
    if not full_mask_copy:
        return torch.stack([w_a, w_b])
    return torch.stack([torch.full_like(a, 0.5), w_a / 2, w_b / 2])
