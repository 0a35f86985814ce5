"""Semi-autoregressive masked-diffusion decoding with low-confidence remasking.

Follows LLaDA's ``generate.py`` (ML-GSAI/LLaDA), as reused by d1 and SPG, and ERILS App. A / §III-B
(spec: docs/decoding.md)::

    x = [prompt | MASK * gen_length]
    for each block b (left to right):
        n_i = masks_in_block // steps_per_block (+1 for the first masks_in_block % steps_per_block steps)
        for i in range(steps_per_block):
            logits = model_fn(x, attention_mask)
            x0 = argmax(logits)                      (T = 0)
               = argmax(logits / T + Gumbel)          (T > 0)
            conf = softmax(logits)[x0]                (untempered)
            reveal the n_i most confident masked positions of block b with x0

Departures from the reference code, each deliberate:

* **Attention mask.** Prompts are left-padded and ``[prompt_mask | 1...]`` is passed to ``model_fn`` at
  every step. The reference passes none, which makes results depend on the batch composition.
  ``model_fn(input_ids, attention_mask)`` is the whole model contract; a model with absolute positions
  (BERT) should derive ``position_ids`` from the mask, see :func:`position_ids_from_attention_mask` and
  :func:`hf_model_fn`.
* **Gumbel form.** The reference samples ``argmax(exp(logits) / (-log U) ** T)`` in float64. We use the
  equivalent ``argmax(logits / T - log(-log U))`` (same argmax for the same ``U``: take the log and divide
  by ``T > 0``) in ``logits_dtype`` (default float64), which cannot overflow ``exp``. ``U`` comes from the
  given ``torch.Generator`` and is drawn only for the still-masked positions of the current block.
  ``sampler="inverse_cdf"`` samples the same distribution with one uniform per position (cheaper on CPU
  for large vocabularies). The confidence ``softmax(logits)[x0]`` is computed in float32 as
  ``exp(logit[x0] - logsumexp(logits))`` (it only ranks positions).
* **No [MASK] predictions.** ``x0`` never equals ``mask_id`` (its logit is excluded from the argmax,
  not from the confidence softmax), so every position holds a real token at the end; the reference can
  "reveal" a [MASK], which then stays masked forever.
* **Vectorised reveal.** One ``topk`` over the batch with ``k = max_b n_i`` then a per-row cut, instead of
  a Python loop over rows; steps where no row reveals anything skip the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from lit_rl import rng

__all__ = [
    "DecodeStats",
    "ModelFn",
    "diffusion_generate",
    "num_transfer_tokens",
    "position_ids_from_attention_mask",
    "hf_model_fn",
]

ModelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``model_fn(input_ids (B, T) long, attention_mask (B, T) long) -> logits (B, T, V)``."""


@dataclass
class DecodeStats:
    """What one decode cost and how sure it was, summed over the calls it is passed to: model passes over rows
    (``row_forwards``), positions run through the layers (``forward_tokens``), loop iterations (``steps``),
    full-sequence refreshes (``refreshes``, rows; cached decoding), rows decoded (``rows``), tokens revealed
    (``revealed``) and the sum of their confidences ``softmax(logits)[x0]`` when revealed (``confidence_sum``).
    :meth:`passes_per_row` and :meth:`confidence_mean` are the per-rollout figures training logs."""

    steps: int = 0
    row_forwards: int = 0
    forward_tokens: int = 0
    refreshes: int = 0
    rows: int = 0
    revealed: int = 0
    confidence_sum: float = 0.0

    def passes_per_row(self) -> float:
        """Model passes per decoded row (a row's forward passes: the fixed schedule's steps, or fewer with a
        threshold)."""
        return self.row_forwards / max(self.rows, 1)

    def confidence_mean(self) -> float:
        """Mean confidence of the revealed tokens when they were revealed (NaN when none)."""
        return self.confidence_sum / self.revealed if self.revealed else float("nan")


def position_ids_from_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on the first attended token, so left padding does not shift them.

    Shape: ``(B, T) -> (B, T)``; padded positions get 0 (they are masked out of attention anyway).
    """
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)


def hf_model_fn(model: torch.nn.Module, *, pass_position_ids: bool = True) -> ModelFn:
    """Adapt a Hugging Face masked LM (``model(input_ids=..., attention_mask=...).logits``) to a ``ModelFn``.

    ``pass_position_ids=True`` passes :func:`position_ids_from_attention_mask` (needed for absolute-position
    models such as BERT under left padding); turn it off for models whose forward takes no ``position_ids``
    (LLaDA's remote code).
    """

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if pass_position_ids:
            kwargs["position_ids"] = position_ids_from_attention_mask(attention_mask)
        return model(**kwargs).logits

    return fn


def num_transfer_tokens(masks_in_block: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to reveal at each inner step of a block (LLaDA's ``get_num_transfer_tokens``).

    ``masks_in_block // steps`` per step, and the first ``masks_in_block % steps`` steps reveal one more,
    so the row sums equal ``masks_in_block``.

    Shape: ``(B,) -> (B, steps)`` long.
    """
    base = masks_in_block.long() // steps  # (B,)
    rem = masks_in_block.long() % steps  # (B,)
    step_idx = torch.arange(steps, device=masks_in_block.device)
    return base[:, None] + (step_idx[None, :] < rem[:, None]).long()  # (B, steps)


def _check_args(prompt_ids, prompt_mask, gen_length, block_length, steps, temperature, sampler) -> int:
    if prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be (B, P), got shape {tuple(prompt_ids.shape)}")
    if prompt_mask.shape != prompt_ids.shape:
        raise ValueError(
            f"prompt_mask shape {tuple(prompt_mask.shape)} must equal prompt_ids shape {tuple(prompt_ids.shape)}"
        )
    if gen_length <= 0:
        raise ValueError(f"gen_length must be positive, got {gen_length}")
    if block_length <= 0:
        raise ValueError(f"block_length must be positive, got {block_length}")
    if gen_length % block_length != 0:
        raise ValueError(f"gen_length ({gen_length}) must be a multiple of block_length ({block_length})")
    num_blocks = gen_length // block_length
    if steps <= 0 or steps % num_blocks != 0:
        raise ValueError(
            f"steps ({steps}) must be a positive multiple of the number of blocks "
            f"gen_length/block_length = {num_blocks}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if sampler not in ("gumbel", "inverse_cdf"):
        raise ValueError(f"sampler must be 'gumbel' or 'inverse_cdf', got {sampler!r}")
    return num_blocks


def _choose_tokens(
    flat: torch.Tensor, temperature: float, mask_id: int, sampler: str, generator, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x0`` for each row of ``flat (N, V)`` float32 logits and its untempered logit ``flat[x0]``.

    [MASK] (if inside the vocabulary) is never chosen. Shapes: ``(N, V) -> (N,), (N,)``.
    """
    V = flat.shape[-1]
    has_mask = 0 <= mask_id < V
    if temperature == 0:
        top, x0 = flat.max(-1)  # (N,), (N,)
        if has_mask:
            bad = x0 == mask_id
            if bad.any():  # rare: fall back to the best non-[MASK] token
                alt = flat[bad].clone()
                alt[:, mask_id] = float("-inf")
                top[bad], x0[bad] = alt.max(-1)
        return x0, top
    scores = flat.to(dtype) / temperature  # (N, V) new tensor
    if has_mask:
        scores[:, mask_id] = float("-inf")
    if sampler == "gumbel":
        u = rng.uniform(scores.shape, generator=generator, dtype=dtype, device=flat.device)  # (N, V)
        x0 = (scores - torch.log(-torch.log(u))).argmax(-1)  # (N,)
    else:
        cdf = torch.softmax(scores, -1).cumsum(-1)  # (N, V)
        u = rng.uniform((flat.shape[0], 1), generator=generator, dtype=dtype, device=flat.device) * cdf[:, -1:]
        x0 = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=V - 1)  # (N,)
    return x0, flat.gather(-1, x0[:, None]).squeeze(-1)


@torch.no_grad()
def diffusion_generate(
    model_fn: ModelFn,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    temperature: float,
    mask_id: int,
    generator: torch.Generator | None = None,
    logits_dtype: torch.dtype = torch.float64,
    sampler: str = "gumbel",
    init: torch.Tensor | None = None,
    stats: DecodeStats | None = None,
) -> torch.Tensor:
    """Decode ``gen_length`` tokens after left-padded prompts (LLaDA low-confidence remasking, module doc).

    Args:
        model_fn: ``(input_ids (B, T), attention_mask (B, T)) -> logits (B, T, V)``, T = P + gen_length.
        prompt_ids: ``(B, P)`` long, left-padded; never modified.
        prompt_mask: ``(B, P)``, 0 on padding.
        gen_length: completion width; a multiple of ``block_length``.
        block_length: semi-autoregressive block width.
        steps: total denoising steps; a multiple of ``gen_length // block_length``.
        temperature: 0 for greedy (deterministic), > 0 for Gumbel-max sampling at that temperature.
        mask_id: the [MASK] token id.
        generator: source of the Gumbel noise (reproducible runs); unused at temperature 0.
        logits_dtype: dtype of the sampling computation at ``temperature > 0`` (float64 as in the reference).
        sampler: ``"gumbel"`` (reference: Gumbel-max, one noise draw per vocabulary entry) or ``"inverse_cdf"``
            (the same categorical distribution ``softmax(logits / T)`` sampled by inverse CDF with one uniform
            per position: much cheaper for large vocabularies on CPU, different random stream).
        init: ``(B, gen_length)`` starting completion (``None``: all [MASK]); its non-[MASK] tokens are kept
            and only its [MASK] positions are decoded, on the same block schedule: each block reveals its
            remaining masks over its ``steps // num_blocks`` steps, and a block with none left costs no
            forward pass (double-rollout continuations from a cut, :mod:`lit_rl.generation.continuations`).
        stats: filled with what the decode cost and the revealed tokens' confidence, if given.

    Returns:
        ``(B, P + gen_length)`` long: the prompt (unchanged) followed by the completion, with no [MASK] left.
    """
    num_blocks = _check_args(prompt_ids, prompt_mask, gen_length, block_length, steps, temperature, sampler)
    steps_per_block = steps // num_blocks
    B, P = prompt_ids.shape
    device = prompt_ids.device

    if init is None:
        init = torch.full((B, gen_length), mask_id, dtype=torch.long, device=device)
    elif init.shape != (B, gen_length):
        raise ValueError(f"init shape {tuple(init.shape)} must be (B, gen_length) = {(B, gen_length)}")
    x = torch.cat([prompt_ids.long(), init.long().to(device)], dim=1)  # (B, T)
    attention_mask = torch.cat(
        [prompt_mask.long(), torch.ones(B, gen_length, dtype=torch.long, device=device)], dim=1
    )  # (B, T)
    rows = torch.arange(B, device=device)
    revealed_conf = torch.zeros((), device=device)  # () summed without a host sync per step
    revealed = 0

    for b in range(num_blocks):
        start = P + b * block_length
        end = start + block_length
        n_per_step = num_transfer_tokens((x[:, start:end] == mask_id).sum(1), steps_per_block)  # (B, S)
        n_max_per_step = n_per_step.max(0).values.tolist()  # one host sync per block, not per step

        for i in range(steps_per_block):
            k = n_max_per_step[i]
            if k == 0:
                continue  # nothing to reveal in any row: the forward pass would be wasted
            block = x[:, start:end]  # (B, Lb) view into x
            masked = block == mask_id  # (B, Lb)
            logits = model_fn(x, attention_mask)  # (B, T, V)
            flat = logits[:, start:end][masked].float()  # (N, V) still-masked positions of the block only
            x0, top = _choose_tokens(flat, temperature, mask_id, sampler, generator, logits_dtype)  # (N,), (N,)
            # confidence = softmax(untempered logits)[x0], without materialising the softmax
            conf_flat = (top - torch.logsumexp(flat, -1)).exp()  # (N,)

            conf = torch.full(masked.shape, float("-inf"), device=device)  # (B, Lb)
            conf[masked] = conf_flat
            cand = torch.full_like(block, mask_id)  # (B, Lb)
            cand[masked] = x0

            top = conf.topk(k, dim=-1).indices  # (B, k) most confident first
            keep = torch.arange(k, device=device)[None, :] < n_per_step[:, i : i + 1]  # (B, k)
            r_idx = rows[:, None].expand(-1, k)[keep]  # (M,)
            c_idx = top[keep]  # (M,)
            x[r_idx, start + c_idx] = cand[r_idx, c_idx]
            if stats is not None:
                revealed_conf = revealed_conf + conf[r_idx, c_idx].sum()
                revealed += r_idx.numel()
                stats.steps += 1
                stats.row_forwards += B
                stats.forward_tokens += B * x.shape[1]
    if stats is not None:
        stats.rows += B
        stats.revealed += revealed
        stats.confidence_sum += float(revealed_conf)
    return x
