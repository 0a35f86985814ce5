"""dLLM likelihood estimators: the one thing dLLM RL methods differ in, behind one interface.

A masked diffusion LM has no exact ``log π(o | x)``; each method estimates it from forward passes over noisy
copies of the row. An estimator is two calls, both per row so that micro-batching never changes a draw:

    draw = estimator.draw(rows, seeds)             # the masks of one optimizer update, row i from seeds[i]
    scores = estimator.score(policy, rows, draw)   # TokenScores: (D, b, L) log-probs of D noisy copies

:class:`TokenScores` keeps every copy's log-probs, which positions each copy scores and the coefficient of each
score in the per-token estimate (:meth:`TokenScores.per_token`, ``(b, L)``). A loss reads what it needs: d1's
clipped ratio and wd1's sequence sum take :meth:`~TokenScores.per_token`; SPG's ELBO / EUBO take the copies
(:class:`~lit_rl.algorithms.surrogates.SPGSurrogate` implements ``draw`` / ``score`` with its block and
uniform masks). Estimators here:

* :class:`OneStep`: d1's one-step estimator (arXiv:2504.12216 §3.2): the whole completion masked, each real
  prompt token masked w.p. ``p_mask_prompt``; one copy.
* :class:`Coupled`: DiffuCoder's coupled sampling (Gong et al. 2025, "DiffuCoder: Understanding and Improving
  Masked Diffusion Models for Code Generation", arXiv:2506.20639, §4, coupled-GRPO): a completion mask ``M``
  at ratio ``t`` and its complement ``¬M``, so every completion token is scored exactly once by the pair.
  The pure math is :func:`lit_rl.core.spg.coupled_coefficients`.

A new estimator is one class with ``draw`` and ``score`` (and ``copies``); the losses take it as
``estimator:`` in YAML (``D1Loss``, ``WD1Loss``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.core.entropy import token_entropy
from lit_rl.core.spg import coupled_coefficients, token_logprobs_from_logits
from lit_rl.errors import FieldError
from lit_rl.batch import RolloutBatch

__all__ = ["Coupled", "Draw", "LikelihoodEstimator", "OneStep", "TokenScores"]

Draw = dict[str, Tensor]
"""One update's masks for ``b`` rows: tensors whose first dimension is the row (sliced with the rows)."""


def slice_draw(draw: Draw, sl: slice) -> Draw:
    return {k: v[sl] for k, v in draw.items()}


@dataclass
class TokenScores:
    """What an estimator returns for ``b`` rows: ``D`` noisy copies of each.

    Attributes:
        logp: ``(D, b, L)`` log-prob of each completion token under copy ``d``'s noisy input.
        coef: ``(D, b, L)`` weight of copy ``d``'s score in the per-token estimate (0 where it is not used).
        entropy: ``(D, b, L)`` the denoiser's token entropy (detached, a diagnostic).
    """

    logp: Tensor
    coef: Tensor
    entropy: Tensor

    def per_token(self) -> Tensor:
        """The per-token log-likelihood estimate ``Σ_d coef·logp``: ``(b, L)``."""
        if self.logp.shape[0] == 1:
            return self.logp[0] * self.coef[0]
        return (self.coef * self.logp).sum(0)

    def per_token_entropy(self) -> Tensor:
        """The entropy of the copy that scores each position (the first with a nonzero coefficient): ``(b, L)``."""
        if self.entropy.shape[0] == 1:
            return self.entropy[0]
        first = (self.coef != 0).int().argmax(0, keepdim=True)  # (1, b, L)
        return self.entropy.gather(0, first)[0]


class LikelihoodEstimator:
    """Base of the estimators (module docstring)."""

    def bind(self, policy: torch.nn.Module) -> None:
        """Called once with the policy by the loss that holds the estimator (e.g. the mask token id)."""

    def draw(self, rows: RolloutBatch, seeds: list[int]) -> Draw:
        raise NotImplementedError

    def score(self, policy: torch.nn.Module, rows: RolloutBatch, draw: Draw) -> TokenScores:
        raise NotImplementedError


def _forward(policy, noisy: Tensor, attention_mask: Tensor, targets: Tensor, prompt_len: int) -> tuple[Tensor, Tensor]:
    """Log-probs ``(n, L)`` of ``targets`` under ``noisy (n, P + L)`` and the token entropy ``(n, L)``."""
    logits = policy(noisy, attention_mask)[:, prompt_len:]  # (n, L, V)
    return token_logprobs_from_logits(logits, targets), token_entropy(logits.detach())


class OneStep(LikelihoodEstimator):
    """d1's one-step estimator: the completion fully masked, real prompt tokens masked w.p. ``p_mask_prompt``
    (d1's ``forward_process``), one forward pass; the estimate of a token is its log-prob there.

    Args:
        p_mask_prompt: prompt-token masking probability (d1 0.15).
    """

    @staticmethod
    def check_args(p_mask_prompt: float = 0.15) -> None:
        if not 0.0 <= p_mask_prompt < 1.0:
            raise FieldError("p_mask_prompt", f"must be in [0, 1), got {p_mask_prompt}")

    def __init__(self, p_mask_prompt: float = 0.15) -> None:
        OneStep.check_args(p_mask_prompt=p_mask_prompt)
        self.p_mask_prompt = p_mask_prompt

    def draw(self, rows: RolloutBatch, seeds: list[int]) -> Draw:
        """``prompt_masked (b, P)``: each real prompt token w.p. ``p_mask_prompt``, row ``i`` from ``seeds[i]``."""
        prompt_mask = rows.attention_mask[:, : rows.prompt_len]
        B, P = prompt_mask.shape
        if len(seeds) != B:
            raise ValueError(f"seeds must hold one seed per row ({B}), got {len(seeds)}")
        u = torch.stack([rng.uniform((P,), generator=rng.cpu_generator(s)) for s in seeds]) if B else torch.zeros(0, P)
        return {"prompt_masked": prompt_mask.bool() & (u.to(prompt_mask.device) < self.p_mask_prompt)}

    def score(self, policy, rows: RolloutBatch, draw: Draw) -> TokenScores:
        P, ids = rows.prompt_len, rows.input_ids
        noisy = ids.clone()
        noisy[:, :P] = torch.where(draw["prompt_masked"], policy.mask_id, ids[:, :P])
        noisy[:, P:] = policy.mask_id
        logp, ent = _forward(policy, noisy, rows.attention_mask, ids[:, P:], P)  # (b, L) each
        return TokenScores(logp[None], torch.ones_like(logp)[None], ent[None])


class Coupled(LikelihoodEstimator):
    """DiffuCoder's coupled sampling (module docstring; arXiv:2506.20639 §4, the ``coupled_grpo.py`` trainer).

    Per row: ``t ~ U(t_min, t_max)`` and ``u ~ U(0, 1)^L``; copy ``a`` masks the completion tokens with
    ``u < t``, copy ``b`` the others (the complement), so each completion token is masked in exactly one of the
    two and scored there with the weight ``1/t`` (copy ``a``) or ``1/(1 − t)`` (copy ``b``). With
    ``full_mask_copy`` (the reference code, default) a third copy masks the whole completion (d1's one-step
    pass) and the estimate is the mean of the two: ``(log p_full + w·log p_masked) / 2``; without it the
    estimate is ``w·log p_masked`` alone (the coupled pair of the paper's text). Prompts are never masked
    (the reference code's ``forward_process``).

    Departures from the reference code:

    * ``t`` and ``u`` are drawn per row from the row's own seed (the code draws one ``t`` per update for the
      whole per-device batch with Python's ``random``, and with ``num_iterations > 1`` reuses one random
      matrix across gradient-accumulation chunks), so micro-batching and the batch's other rows never change a
      draw;
    * copy ``b`` masks ``u >= t`` (the code: ``u > t``; they differ only on an exact tie, where the code masks
      the token in neither copy);
    * the copies get the rows' attention mask (the code passes none) and run in the module's precision (the
      code: bf16 autocast), as one ``(3b, T)`` forward;
    * ``entropy`` (a diagnostic) is the fully masked copy's when it is there.

    Args:
        t_min, t_max: the range of the masking ratio ``t`` (reference code: 0.2, 0.8).
        full_mask_copy: add the fully masked copy and average (reference code: yes).
    """

    @staticmethod
    def check_args(t_min: float = 0.2, t_max: float = 0.8) -> None:
        if not 0.0 < t_min < 1.0:
            raise FieldError("t_min", f"must be in (0, 1), got {t_min}")
        if not t_min <= t_max < 1.0:
            raise FieldError("t_max", f"must be in [t_min, 1) = [{t_min}, 1), got {t_max}")

    def __init__(self, t_min: float = 0.2, t_max: float = 0.8, full_mask_copy: bool = True) -> None:
        Coupled.check_args(t_min=t_min, t_max=t_max)
        self.t_min, self.t_max, self.full_mask_copy = t_min, t_max, full_mask_copy

    def draw(self, rows: RolloutBatch, seeds: list[int]) -> Draw:
        """``t (b,)`` and ``masked_a (b, L)`` (copy ``a``'s masked completion positions), row ``i`` from
        ``seeds[i]``."""
        B, L = rows.completion_mask.shape
        if len(seeds) != B:
            raise ValueError(f"seeds must hold one seed per row ({B}), got {len(seeds)}")
        t, u = torch.empty(B), torch.empty(B, L)
        for i, s in enumerate(seeds):
            g = rng.cpu_generator(s)
            t[i] = self.t_min + (self.t_max - self.t_min) * rng.uniform((1,), generator=g)[0]
            u[i] = rng.uniform((L,), generator=g)
        device = rows.input_ids.device
        return {"t": t.to(device), "masked_a": (u < t[:, None]).to(device)}

    def score(self, policy, rows: RolloutBatch, draw: Draw) -> TokenScores:
        P, ids, attn = rows.prompt_len, rows.input_ids, rows.attention_mask
        comp = ids[:, P:]  # (b, L)
        a = draw["masked_a"]
        copies = [torch.where(a, policy.mask_id, comp), torch.where(~a, policy.mask_id, comp)]
        if self.full_mask_copy:
            copies.insert(0, torch.full_like(comp, policy.mask_id))
        n = len(copies)
        noisy = torch.cat([torch.cat([ids[:, :P], c], 1) for c in copies])  # (n·b, P + L)
        logp, ent = _forward(policy, noisy, attn.repeat(n, 1), comp.repeat(n, 1), P)  # (n·b, L) each
        logp, ent = logp.reshape(n, *comp.shape), ent.reshape(n, *comp.shape)
        coef = coupled_coefficients(a, draw["t"], full_mask_copy=self.full_mask_copy).to(logp)  # (n, b, L)
        return TokenScores(logp, coef, ent)
