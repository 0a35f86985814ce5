"""Diffusion-compatible surrogates S_θ(p, o) and their policy-gradient losses.

Spec: docs/erils.md; ERILS Eq. 5 and Eq. 10 (the surrogate replaces log π(o|p) in the group
policy gradient); SPG (Wang et al. 2025, "Sandwiched Policy Gradient"), following the SPG reference code
(facebookresearch/SPG, ``SPGTrainer._get_per_seq_logps`` and ``compute_loss``) where it is more specific
than the paper text. Per rollout ``i`` with completion length ``L_i`` and ``num_t`` noise draws ``j``::

    ELBO_i = mean_j [ (1/|M_j|) Σ_{t∈M_j} log p(o_t | x̃_j) ]
    t_j    = |M_j| / L_i
    a_t    = mean_j [ 1[t∈M_j] · p(o_t | x̃_j)^β / t_j ]          (mean over all num_t draws)
    EUBO_i = (1/β) · mean_{t: a_t>0} log a_t
    MIX_i  = w · EUBO_i + (1-w) · ELBO_i
    S_i    = ELBO_i if A_i > 0 else (EUBO_i | MIX_i | ELBO_i)
    loss   = Σ_i (-A_i · S_i · L_i) / Σ_i L_i

The math is pure functions over per-token log-probs of the ORIGINAL tokens, ``token_logprobs
(num_t, B, L)``, and the scored positions ``loss_mask (num_t, B, L)`` (see :mod:`lit_rl.algorithms.masks`);
values of ``token_logprobs`` outside ``loss_mask`` are ignored (and receive no gradient), even NaN.
:class:`SPGSurrogate` only orchestrates masks -> forward passes -> these functions.

Baselines (ERILS compares against them): the d1 one-step estimator with d1's token-level PPO-clip loss
and k3 KL (:func:`d1_loss`), and wd1's weighted-likelihood loss (:func:`wd1_loss`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from lit_rl import rng
from lit_rl.algorithms.entropy import masked_entropy_mean, token_entropy
from lit_rl.algorithms.masks import (
    BLOCK_CHOICES,
    BlockChoice,
    DiffusionMasks,
    apply_masks,
    mask_prompt_tokens,
    spg_block_masks,
    uniform_random_masks,
)

__all__ = [
    "token_logprobs_from_logits",
    "elbo",
    "eubo",
    "mix",
    "spg_select",
    "spg_loss",
    "SPGSurrogate",
    "sequence_logprob_sum",
    "d1_loss",
    "wd1_loss",
    "SOURCE_ON_POLICY",
    "SOURCE_EXTERNAL",
]

SOURCE_ON_POLICY = 0
SOURCE_EXTERNAL = 1

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``logits_fn(noisy_ids (N, T), attention_mask (N, T)) -> logits (N, T, V)``."""


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

    Paper vs code: ERILS Eq. 10 writes the group objective as ``1/(G_on+G_ext) Σ_i A_i ∇S_i`` (every rollout
    weighted equally); this follows the reference SPG code (spec §2), where a rollout of length L weighs L.
    With A = [1, 1], L = [10, 100]: Eq. 10 gives ``(∇S_1 + ∇S_2)/2``, this ``(10∇S_1 + 100∇S_2)/110``.
    ``lengths = ones`` gives the paper's equal weighting (``SPGSurrogate(weighting="rollout")``).

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


class SPGSurrogate:
    """SPG surrogate + loss for a mixed batch of on-policy (``source == 0``) and external (``source == 1``)
    rollouts (ERILS §IV-B, Eq. 10).

    On-policy rollouts get SPG's block masks (:func:`~lit_rl.algorithms.masks.spg_block_masks`, block
    choice pluggable); external rollouts get uniformly random masks
    (:func:`~lit_rl.algorithms.masks.uniform_random_masks`) because their generation confidences do not
    exist. Prompt tokens are masked w.p. ``p_mask_prompt`` in every draw; clean completion tokens before the
    chosen block w.p. ``p_mask_clean`` (on-policy only, as SPG's block code). All ``num_t`` draws run as one
    ``(num_t·B, T)`` forward, or in micro-batches of ``micro_batch_size`` rows.

    Args:
        beta: EUBO exponent β. SPG's scripts: mix mode Sudoku 1.0, Countdown 1.5, math 1.5; EUBO-only mode
            Sudoku 1.0, Countdown 2.0, math 1.5 (facebookresearch/SPG ``slurm_scripts/spg_{mix,eubo}``).
        num_t: Monte-Carlo noise draws per rollout.
        mode: surrogate for ``A <= 0``: ``"mix"`` | ``"eubo"`` | ``"elbo"``.
        w: EUBO weight in ``"mix"``.
        block_length: SPG masking block (the decoding block, 32 in ERILS).
        block_choice: ``"spg"`` | ``"uniform"`` | callable, see :mod:`lit_rl.algorithms.masks`.
        p_mask_prompt: prompt-token masking probability (d1/SPG ``train.yaml``: 0.15).
        p_mask_clean: clean-completion masking probability for block masks (SPG uses ``p_mask_prompt``).
        external_rule: ``"count"`` (SPG ``random``) | ``"bernoulli"`` (ERILS App. A) for external rollouts.
        mask_id: the [MASK] id (LLaDA: 126336).
        micro_batch_size: rows per forward; ``None`` = all ``num_t·B`` at once.
        weighting: how :func:`spg_loss` weighs the rollouts: ``"length"`` (default; the SPG reference code,
            a rollout weighs its completion length) or ``"rollout"`` (ERILS Eq. 10, every rollout equally).
    """

    def __init__(
        self,
        beta: float = 1.0,
        num_t: int = 2,
        mode: str = "mix",
        w: float = 0.5,
        block_length: int = 32,
        block_choice: BlockChoice | str = "spg",
        p_mask_prompt: float = 0.15,
        p_mask_clean: float = 0.15,
        external_rule: str = "count",
        mask_id: int = 126336,
        micro_batch_size: int | None = None,
        weighting: str = "length",
    ) -> None:
        if mode not in ("mix", "eubo", "elbo"):
            raise ValueError(f"mode must be 'mix', 'eubo' or 'elbo', got {mode!r}")
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if num_t < 1:
            raise ValueError(f"num_t must be >= 1, got {num_t}")
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"w must be in [0, 1], got {w}")
        if isinstance(block_choice, str) and block_choice not in BLOCK_CHOICES:
            raise ValueError(f"block_choice must be one of {sorted(BLOCK_CHOICES)} or a callable, got {block_choice!r}")
        if external_rule not in ("count", "bernoulli"):
            raise ValueError(f"external_rule must be 'count' or 'bernoulli', got {external_rule!r}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {micro_batch_size}")
        if weighting not in ("length", "rollout"):
            raise ValueError(f"weighting must be 'length' or 'rollout', got {weighting!r}")
        self.weighting = weighting
        self.beta = beta
        self.num_t = num_t
        self.mode = mode
        self.w = w
        self.block_length = block_length
        self.block_choice = block_choice
        self.p_mask_prompt = p_mask_prompt
        self.p_mask_clean = p_mask_clean
        self.external_rule = external_rule
        self.mask_id = mask_id
        self.micro_batch_size = micro_batch_size

    def loss_weights(self, lengths: torch.Tensor) -> torch.Tensor:
        """Per-rollout weights of :func:`spg_loss` under ``weighting``: ``(B,)`` lengths -> ``(B,)``."""
        return lengths if self.weighting == "length" else torch.ones_like(lengths)

    def build_masks(
        self,
        completion_mask: torch.Tensor,
        prompt_mask: torch.Tensor,
        source: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        seeds: Sequence[int] | torch.Tensor | None = None,
        gen_width: torch.Tensor | None = None,
    ) -> DiffusionMasks:
        """Block masks for on-policy rows, uniform masks for external rows, then prompt masking.

        ``seeds (B,)``: one seed per rollout; each row then draws all its masks from its own CPU stream
        (:func:`lit_rl.rng.cpu_generator`), so a row's masks do not depend on which rows share its batch
        or micro-batch (micro-batching changes memory, never the update). Without ``seeds`` the rows draw
        from ``generator`` in turn (grouped by source and width). ``gen_width (B,)``: each row's own
        generation width (``None``: ``L``), see :func:`~lit_rl.algorithms.masks.spg_block_masks`.

        Shapes: ``completion_mask (B, L)``, ``prompt_mask (B, P)``, ``source (B,)`` -> masks ``(num_t, B, ·)``.
        """
        completion_mask = completion_mask.bool()
        B, L = completion_mask.shape
        bad = (source != SOURCE_ON_POLICY) & (source != SOURCE_EXTERNAL)
        if bad.any():
            raise ValueError(f"source must hold 0 (on-policy) or 1 (external), got {source[bad].unique().tolist()}")
        if seeds is not None and len(seeds) != B:
            raise ValueError(f"seeds must hold one seed per row ({B}), got {len(seeds)}")
        widths = [L] * B if gen_width is None else [int(w) for w in gen_width.tolist()]
        sources = source.tolist()
        if seeds is None:  # rows of one (source, width) draw together from the shared generator
            keys = sorted(set(zip(sources, widths)))
            groups = [([i for i in range(B) if (sources[i], widths[i]) == k], *k, generator) for k in keys]
        else:
            seed_list = seeds.tolist() if isinstance(seeds, torch.Tensor) else list(seeds)
            groups = [([i], sources[i], widths[i], rng.cpu_generator(seed_list[i])) for i in range(B)]
        device = completion_mask.device
        comp = torch.zeros(self.num_t, B, L, dtype=torch.bool, device=device)
        loss = torch.zeros_like(comp)
        prompt = torch.zeros(self.num_t, *prompt_mask.shape, dtype=torch.bool, device=device)
        for rows, src, width, g in groups:
            idx = torch.tensor(rows, device=device)
            if src == SOURCE_ON_POLICY:
                m = spg_block_masks(
                    completion_mask[idx], self.block_length, self.num_t, g,
                    block_choice=self.block_choice, p_mask_clean=self.p_mask_clean, gen_width=width,
                )
            else:
                m = uniform_random_masks(completion_mask[idx], self.num_t, g, rule=self.external_rule)
            m = mask_prompt_tokens(m, prompt_mask[idx], self.p_mask_prompt, g)
            comp[:, idx], loss[:, idx], prompt[:, idx] = m.completion, m.loss, m.prompt
        return DiffusionMasks(comp, loss, prompt)

    def token_logprobs(
        self,
        logits_fn: LogitsFn,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        masks: DiffusionMasks,
    ) -> torch.Tensor:
        """Log-probs of the original completion tokens under each noisy input.

        Shapes: ``input_ids (B, T)`` -> ``(num_t, B, L)`` float32.
        """
        return self.logprobs_and_entropy(logits_fn, input_ids, attention_mask, prompt_len, masks)[0]

    def logprobs_and_entropy(
        self,
        logits_fn: LogitsFn,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        masks: DiffusionMasks,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`token_logprobs` and, from the same logits, the denoiser's entropy at every completion
        position (detached, a diagnostic). Shapes: both ``(num_t, B, L)`` float32."""
        num_t, B, L = masks.completion.shape
        T = input_ids.shape[1]
        noisy = apply_masks(input_ids, masks, prompt_len, self.mask_id).reshape(num_t * B, T)  # (N, T)
        attn = attention_mask[None].expand(num_t, -1, -1).reshape(num_t * B, T)  # (N, T)
        targets = input_ids[None, :, prompt_len:].expand(num_t, -1, -1).reshape(num_t * B, L)  # (N, L)
        mb = self.micro_batch_size or num_t * B
        out, ent = [], []
        for s in range(0, num_t * B, mb):
            logits = logits_fn(noisy[s : s + mb], attn[s : s + mb])  # (n, T, V)
            out.append(token_logprobs_from_logits(logits[:, prompt_len:], targets[s : s + mb]))  # (n, L)
            ent.append(token_entropy(logits[:, prompt_len:].detach()))  # (n, L), a diagnostic
        return torch.cat(out, 0).reshape(num_t, B, L), torch.cat(ent, 0).reshape(num_t, B, L)

    def surrogate(
        self, token_logprobs: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, advantages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(S, ELBO, negative-branch value)``, each ``(B,)``."""
        lo = elbo(token_logprobs, loss_mask)
        if self.mode == "elbo":
            neg = lo
        else:
            up = eubo(token_logprobs, loss_mask, lengths, self.beta)
            neg = up if self.mode == "eubo" else mix(lo, up, self.w)
        return spg_select(lo, neg, advantages), lo, neg

    def __call__(
        self,
        logits_fn: LogitsFn,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        completion_mask: torch.Tensor,
        source: torch.Tensor,
        advantages: torch.Tensor,
        generator: torch.Generator | None = None,
        *,
        seeds: Sequence[int] | torch.Tensor | None = None,
        gen_width: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss ``Σ(−A·S·w)/Σw`` for one rollout batch (``w`` = :meth:`loss_weights`) and detached stats.

        Shapes: ``input_ids (B, T)``, ``attention_mask (B, T)``, ``completion_mask (B, L = T − prompt_len)``,
        ``source (B,)`` long, ``advantages (B,)``; ``seeds (B,)`` and ``gen_width (B,)`` as in
        :meth:`build_masks`.
        """
        B, T = input_ids.shape
        if completion_mask.shape != (B, T - prompt_len):
            raise ValueError(
                f"completion_mask shape {tuple(completion_mask.shape)} must be (B, T - prompt_len) = {(B, T - prompt_len)}"
            )
        masks = self.build_masks(
            completion_mask, attention_mask[:, :prompt_len], source, generator, seeds=seeds, gen_width=gen_width
        )
        logp, entropy = self.logprobs_and_entropy(logits_fn, input_ids, attention_mask, prompt_len, masks)  # (num_t, B, L)
        lengths = completion_mask.sum(-1)  # (B,)
        s, lo, neg = self.surrogate(logp, masks.loss, lengths, advantages)
        loss, stats = spg_loss(advantages, s, self.loss_weights(lengths))
        stats["completion_length_mean"] = lengths.float().mean().detach()
        stats["elbo_mean"] = lo.detach().mean()
        for src, name in ((SOURCE_ON_POLICY, "on_policy"), (SOURCE_EXTERNAL, "external")):
            sel = source == src  # (B,) per-source ELBO: does the policy learn the external rows? (#16)
            if bool(sel.any()):
                stats[f"elbo_{name}"] = lo.detach()[sel].mean()
        stats[f"{self.mode}_mean"] = neg.detach().mean()
        stats["masked_frac"] = (
            masks.loss.sum((0, 2)).float() / (lengths.clamp(min=1) * self.num_t)
        ).mean().detach()
        # the denoiser's entropy at the positions the loss scores (masked completion tokens, every draw)
        stats["entropy"] = masked_entropy_mean(entropy, masks.loss.bool())
        return loss, stats


# --------------------------------------------------------------------------------------------- baselines


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
    (:func:`~lit_rl.algorithms.masks.full_completion_masks`: completion fully masked, prompt masked w.p.
    0.15): token-level PPO clip ``−min(ρA, clip(ρ, 1−ε, 1+ε)A)`` plus ``β·k3``, with
    ``k3 = exp(ref − logp) − (ref − logp) − 1``, averaged over all completion tokens of the batch
    (d1 ``compute_loss``).

    Shapes: ``logp, old_logp, ref_logp, completion_mask (B, L)``, ``advantages (B,)`` -> scalar.
    """
    m = completion_mask.bool()
    ratio = torch.exp(torch.where(m, logp - old_logp, 0.0))  # (B, L)
    adv = advantages[:, None].to(logp.dtype)  # (B, 1)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon) * adv)  # (B, L)
    stats: dict[str, torch.Tensor] = {}
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when beta != 0")
        d = torch.where(m, ref_logp - logp, 0.0)
        kl = torch.exp(d) - d - 1  # (B, L)
        per_token = per_token + beta * kl
        stats["kl"] = (kl.detach() * m).sum() / m.sum().clamp(min=1)
    n = m.sum().clamp(min=1)
    loss = torch.where(m, per_token, 0.0).sum() / n
    clipped = ((ratio < 1 - epsilon) | (ratio > 1 + epsilon)) & m
    stats.update(loss=loss.detach(), clip_frac=clipped.sum() / n, ratio_mean=(ratio.detach() * m).sum() / n)
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
    adv = advantages.to(seq_logp.dtype)
    if adv.numel() == 0:  # an empty batch: a zero still connected to the graph
        loss = seq_logp.sum() * 0.0
        return loss, {"loss": loss.detach(), "seq_logp_mean": loss.detach()}
    if group is None:
        group = torch.zeros_like(advantages, dtype=torch.long)
    _, g = torch.unique(group, return_inverse=True)  # (B,) dense group ids
    onehot = g[None, :] == torch.arange(int(g.max()) + 1, device=g.device)[:, None]  # (G, B)

    def group_softmax(x: torch.Tensor) -> torch.Tensor:
        z = torch.where(onehot, x[None, :], float("-inf"))  # (G, B)
        return torch.softmax(z, dim=-1).nan_to_num(0.0).sum(0)  # (B,)

    w_pos, w_neg = group_softmax(adv), group_softmax(-adv)
    loss = -(w_pos * seq_logp).sum() + (w_neg * seq_logp).sum()
    return loss, {"loss": loss.detach(), "seq_logp_mean": seq_logp.detach().mean()}
