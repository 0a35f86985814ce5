"""The SPG surrogate as an injectable loss part: masks -> forward passes -> the pure math of
:mod:`lit_rl.core.spg` (spec: docs/erils.md; the formulas are in that module's docstring).

:class:`SPGSurrogate` draws each rollout's noise masks (:mod:`lit_rl.core.masks`, block-wise for on-policy
rows and uniformly random for external rows, as the SPG reference code), scores the original tokens under
each noisy input and returns ``(loss, stats)``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from lit_rl import rng
from lit_rl.algorithms.estimators import Draw, LikelihoodEstimator, TokenScores
from lit_rl.errors import FieldError
from lit_rl.core.entropy import masked_entropy_mean, token_entropy
from lit_rl.core.masks import (
    BLOCK_CHOICES,
    BlockChoice,
    DiffusionMasks,
    apply_masks,
    mask_prompt_tokens,
    spg_block_masks,
    uniform_random_masks,
)
from lit_rl.core.sources import Source, describe, known, rows_where
from lit_rl.batch import RolloutBatch
from lit_rl.core.spg import (
    elbo,
    eubo,
    mix,
    spg_loss,
    spg_select,
    token_logprobs_from_logits,
)

__all__ = ["SPGSurrogate", "LogitsFn"]

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``logits_fn(noisy_ids (N, T), attention_mask (N, T)) -> logits (N, T, V)``."""


class SPGSurrogate(LikelihoodEstimator):
    """SPG surrogate + loss for a mixed batch of on-policy (``source == 0``) and external (``source == 1``)
    rollouts (ERILS §IV-B, Eq. 10; the factor between Eq. 10 and this loss: ``weighting`` below).

    On-policy rollouts get SPG's block masks (:func:`~lit_rl.core.masks.spg_block_masks`, block
    choice pluggable); external rollouts get uniformly random masks
    (:func:`~lit_rl.core.masks.uniform_random_masks`) because their generation confidences do not
    exist. Prompt tokens are masked w.p. ``p_mask_prompt`` in every draw; clean completion tokens before the
    chosen block w.p. ``p_mask_clean`` (on-policy only, as SPG's block code). All ``num_t`` draws of the rows
    it is given run as one ``(num_t·B, T)`` forward; the module's ``micro_batch_size`` bounds ``B``.

    Args:
        beta: EUBO exponent β. SPG's scripts: mix mode Sudoku 1.0, Countdown 1.5, math 1.5; EUBO-only mode
            Sudoku 1.0, Countdown 2.0, math 1.5 (facebookresearch/SPG ``slurm_scripts/spg_{mix,eubo}``).
        num_t: Monte-Carlo noise draws per rollout.
        mode: surrogate for ``A <= 0``: ``"mix"`` | ``"eubo"`` | ``"elbo"``.
        w: EUBO weight in ``"mix"``.
        block_length: SPG masking block (the decoding block, 32 in ERILS).
        block_choice: ``"spg"`` | ``"uniform"`` | callable, see :mod:`lit_rl.core.masks`.
        p_mask_prompt: prompt-token masking probability (d1/SPG ``train.yaml``: 0.15).
        p_mask_clean: clean-completion masking probability for block masks (SPG uses ``p_mask_prompt``).
        external_rule: ``"count"`` (SPG ``random``) | ``"bernoulli"`` (ERILS App. A) for external rollouts.
        mask_id: the [MASK] id (LLaDA: 126336).
        micro_batch_size: removed (must stay ``None``): the module's ``micro_batch_size`` is the one setting.
        weighting: how :func:`spg_loss` weighs the rollouts: ``"length"`` (default; the SPG reference code,
            a rollout weighs its completion length: ERILS Eq. 10 with App. A's sum-form ELBO, times ``B / Σ L``,
            one factor per batch) or ``"rollout"`` (every rollout's per-token mean equally: Eq. 10's form with
            the per-token mean in place of the sum-form ELBO). The full reading: :func:`~lit_rl.core.spg.spg_loss`.
        continuation_masks: masks of double rollout's replaced rows (``Source.CONTINUATION``, a cut trace
            ``t[:cut]`` from the first stage and a tail re-decoded from the cut, both by the current policy
            on the same block schedule): ``"whole"`` (default) draws on-policy block masks over the whole
            row, as for any on-policy decode, so the row's ELBO bounds ``log π(o | p)`` of the completion it
            stands for; ``"tail"`` draws the same masks, then leaves the kept ``t[:cut]`` clean and unscored
            (the ELBO of the tail given the cut: only what the second stage decoded gets the credit). The
            row's completion length (``weighting: length``) still counts the kept prefix in both modes.
    """

    @staticmethod
    def check_args(
        beta: float = 1.0,
        num_t: int = 2,
        mode: str = "mix",
        w: float = 0.5,
        block_length: int = 32,
        block_choice: BlockChoice | str = "spg",
        external_rule: str = "count",
        micro_batch_size: int | None = None,
        weighting: str = "length",
        continuation_masks: str = "whole",
    ) -> None:
        """The constructor's argument rules, one :class:`~lit_rl.errors.FieldError` each (the config preflight
        calls this too, :mod:`lit_rl.config.classes`)."""
        if mode not in ("mix", "eubo", "elbo"):
            raise FieldError("mode", f"must be 'mix', 'eubo' or 'elbo', got {mode!r}")
        if not beta > 0:
            raise FieldError("beta", f"must be > 0, got {beta}")
        if num_t < 1:
            raise FieldError("num_t", f"must be >= 1, got {num_t}")
        if not 0.0 <= w <= 1.0:
            raise FieldError("w", f"must be in [0, 1], got {w}")
        if block_length < 1:
            raise FieldError("block_length", f"must be >= 1, got {block_length}")
        # a dotted string is a callable's import path (jsonargparse imports it)
        if isinstance(block_choice, str) and block_choice not in BLOCK_CHOICES and "." not in block_choice:
            raise FieldError("block_choice",
                             f"must be one of {sorted(BLOCK_CHOICES)} or a callable, got {block_choice!r}")
        if external_rule not in ("count", "bernoulli"):
            raise FieldError("external_rule", f"must be 'count' or 'bernoulli', got {external_rule!r}")
        if micro_batch_size is not None:
            raise FieldError("micro_batch_size", f"got {micro_batch_size}: the surrogate no longer splits its forward; "
                             "set the module's micro_batch_size (model.init_args.micro_batch_size, rows per forward "
                             "and backward; a forward holds num_t x that many rows)")
        if weighting not in ("length", "rollout"):
            raise FieldError("weighting", f"must be 'length' or 'rollout', got {weighting!r}")
        if continuation_masks not in ("whole", "tail"):
            raise FieldError("continuation_masks", f"must be 'whole' or 'tail', got {continuation_masks!r}")

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
        continuation_masks: str = "whole",
    ) -> None:
        SPGSurrogate.check_args(beta=beta, num_t=num_t, mode=mode, w=w, block_length=block_length,
                                block_choice=block_choice, external_rule=external_rule,
                                micro_batch_size=micro_batch_size, weighting=weighting,
                                continuation_masks=continuation_masks)
        self.weighting = weighting
        self.continuation_masks = continuation_masks
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
        kept_prefix: torch.Tensor | None = None,
    ) -> DiffusionMasks:
        """Block masks for on-policy rows, uniform masks for external rows, then prompt masking; continuation
        rows (double rollout) get on-policy block masks, their kept prefix ``kept_prefix (B,)`` left clean and
        unscored under ``continuation_masks: tail``.

        ``seeds (B,)``: one seed per rollout; each row then draws all its masks from its own CPU stream
        (:func:`lit_rl.rng.cpu_generator`), so a row's masks do not depend on which rows share its batch
        or micro-batch (micro-batching changes memory, never the update). Without ``seeds`` the rows draw
        from ``generator`` in turn (grouped by source and width). ``gen_width (B,)``: each row's own
        generation width (``None``: ``L``), see :func:`~lit_rl.core.masks.spg_block_masks`.

        Shapes: ``completion_mask (B, L)``, ``prompt_mask (B, P)``, ``source (B,)`` -> masks ``(num_t, B, ·)``.
        """
        completion_mask = completion_mask.bool()
        B, L = completion_mask.shape
        ok = known(source)
        if not ok.all():
            raise ValueError(f"source must hold a row kind ({describe()}), got {source[~ok].unique().tolist()}")
        decoded = rows_where(source, decoded=True)  # (B,) the policy decoded it: block masks; else uniform
        source = torch.where(decoded, 0, 1)  # the draw's key: 0 block masks, 1 uniform masks
        if seeds is not None and len(seeds) != B:
            raise ValueError(f"seeds must hold one seed per row ({B}), got {len(seeds)}")
        widths = [L] * B if gen_width is None else [int(w) for w in gen_width.tolist()]
        sources = source.tolist()
        keys = sorted(set(zip(sources, widths)))
        members = [[i for i in range(B) if (sources[i], widths[i]) == k] for k in keys]
        if seeds is None:  # rows of one (source, width) draw together from the shared generator
            groups = [(rows, *k, generator) for rows, k in zip(members, keys)]
        else:  # rows of one (source, width) together, each from its own stream (bitwise the one-row draws)
            seed_list = seeds.tolist() if isinstance(seeds, torch.Tensor) else list(seeds)
            bc = self.block_choice  # a name, or one of the built-in functions (compared by identity: a user's
            if isinstance(bc, str) or any(bc is f for f in BLOCK_CHOICES.values()):  # callable may not hash)
                groups = [(rows, *k, rng.RowStreams.from_seeds([seed_list[i] for i in rows]))
                          for rows, k in zip(members, keys)]
            else:  # a user's block choice draws with a torch.Generator: one row at a time
                groups = [([i], sources[i], widths[i], rng.cpu_generator(seed_list[i])) for i in range(B)]
        device = completion_mask.device
        comp = torch.zeros(self.num_t, B, L, dtype=torch.bool, device=device)
        loss = torch.zeros_like(comp)
        prompt = torch.zeros(self.num_t, *prompt_mask.shape, dtype=torch.bool, device=device)
        for rows, src, width, g in groups:
            idx = torch.tensor(rows, device=device)
            if src == 0:  # a decoded row
                m = spg_block_masks(
                    completion_mask[idx], self.block_length, self.num_t, g,
                    block_choice=self.block_choice, p_mask_clean=self.p_mask_clean, gen_width=width,
                )
            else:
                m = uniform_random_masks(completion_mask[idx], self.num_t, g, rule=self.external_rule)
            m = mask_prompt_tokens(m, prompt_mask[idx], self.p_mask_prompt, g)
            comp[:, idx], loss[:, idx], prompt[:, idx] = m.completion, m.loss, m.prompt
        if self.continuation_masks == "tail" and kept_prefix is not None and bool((kept_prefix > 0).any()):
            # rows that kept a prefix (double rollout's CONTINUATION rows: the cut trace): clean context, not scored
            kept = torch.arange(L, device=device)[None, :] < kept_prefix.to(device)[:, None]  # (B, L)
            comp, loss = comp & ~kept[None], loss & ~kept[None]
        return DiffusionMasks(comp, loss, prompt)

    # -- the likelihood-estimator interface (lit_rl.algorithms.estimators): SPG's masks for any loss ---------
    # draw / score wrap build_masks / logprobs_and_entropy, the calls __call__ (SPGLoss) makes: one mask path.
    # per_token() is the ELBO's; EUBO and mix are functions of the copies (TokenScores.logp), as in surrogate().
    def bind(self, policy) -> None:
        self.mask_id = policy.mask_id

    def draw(self, rows: RolloutBatch, seeds: list[int]) -> Draw:
        """:meth:`build_masks` of the rows (row ``i`` from ``seeds[i]``), rows first: ``completion``, ``loss``
        ``(B, num_t, L)`` and ``prompt`` ``(B, num_t, P)``."""
        m = self.build_masks(rows.completion_mask, rows.attention_mask[:, : rows.prompt_len], rows.source,
                             seeds=seeds, gen_width=rows.gen_width, kept_prefix=rows.kept_prefix)
        return {"completion": m.completion.transpose(0, 1), "loss": m.loss.transpose(0, 1),
                "prompt": m.prompt.transpose(0, 1)}

    def score(self, policy, rows: RolloutBatch, draw: Draw) -> TokenScores:
        """The ``num_t`` noisy copies' log-probs; the coefficients make :meth:`TokenScores.per_token` sum to
        SPG's ELBO over a row (:func:`~lit_rl.core.spg.elbo`: per draw the mean over its scored positions,
        then the mean over draws)."""
        masks = DiffusionMasks(*(draw[k].transpose(0, 1) for k in ("completion", "loss", "prompt")))
        logp, ent = self.logprobs_and_entropy(policy, rows.input_ids, rows.attention_mask, rows.prompt_len, masks)
        m = masks.loss.float()  # (num_t, B, L)
        coef = m / (m.sum(-1, keepdim=True).clamp(min=1) * self.num_t)
        return TokenScores(logp, coef, ent)

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
        logits = logits_fn(noisy, attn)[:, prompt_len:]  # (N, L, V)
        logp = token_logprobs_from_logits(logits, targets)  # (N, L)
        ent = token_entropy(logits.detach())  # (N, L), a diagnostic
        return logp.reshape(num_t, B, L), ent.reshape(num_t, B, L)

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
        kept_prefix: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss ``Σ(−A·S·w)/Σw`` for one rollout batch (``w`` = :meth:`loss_weights`) and detached stats.

        Shapes: ``input_ids (B, T)``, ``attention_mask (B, T)``, ``completion_mask (B, L = T − prompt_len)``,
        ``source (B,)`` long, ``advantages (B,)``; ``seeds (B,)`` and ``gen_width (B,)`` as in
        :meth:`build_masks`.
        """
        B, T = input_ids.shape
        if completion_mask.shape != (B, T - prompt_len):
            raise ValueError(
                f"completion_mask shape {tuple(completion_mask.shape)} must be (B, T - prompt_len) = "
                f"{(B, T - prompt_len)}"
            )
        masks = self.build_masks(
            completion_mask, attention_mask[:, :prompt_len], source, generator, seeds=seeds, gen_width=gen_width,
            kept_prefix=kept_prefix,
        )
        # (num_t, B, L)
        logp, entropy = self.logprobs_and_entropy(logits_fn, input_ids, attention_mask, prompt_len, masks)
        lengths = completion_mask.sum(-1)  # (B,)
        s, lo, neg = self.surrogate(logp, masks.loss, lengths, advantages)
        loss, stats = spg_loss(advantages, s, self.loss_weights(lengths))
        stats["completion_length_mean"] = lengths.float().mean().detach()
        stats["elbo_mean"] = lo.detach().mean()
        for kind in (Source.ON_POLICY, Source.EXTERNAL):  # does the policy learn the external rows?
            sel = source == int(kind)  # (B,) rows of exactly this kind (continuation rows are in neither)
            if bool(sel.any()):
                stats[f"elbo_{kind.label}"] = lo.detach()[sel].mean()
        stats[f"{self.mode}_mean"] = neg.detach().mean()
        stats["masked_frac"] = (
            masks.loss.sum((0, 2)).float() / (lengths.clamp(min=1) * self.num_t)
        ).mean().detach()
        # the denoiser's entropy at the positions the loss scores (masked completion tokens, every draw)
        stats["entropy"] = masked_entropy_mean(entropy, masks.loss.bool())
        return loss, stats
