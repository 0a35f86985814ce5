"""Supervised warm start of an autoregressive policy on scripted traces (next-token cross-entropy).

A randomly initialised tiny causal LM writes nothing parseable, so GRPO would get no signal. A short SFT on
scripted Countdown traces (:func:`lit_rl.tasks.scripted.countdown_completion`: a few search steps
``a op b = c`` in ``<reasoning>...</reasoning>``, then the expression in ``<answer>...</answer>``) teaches
the model to write a reasoning trace, close it with the atomic ``</reasoning>`` token and give an answer.
It is deliberately short, so the warmed-up policy solves only part of the problems and RL has room to
improve (the embedded default of double-rollout GRPO, ``conf/double_rollout.yaml``).

The loss is the standard causal LM loss on completion tokens only (prompt tokens are not trained), the
completion's EOS included so the model learns to stop, averaged over every completion token of the batch::

    loss = - Σ_{i,t} mask_it · log π(y_it | x_i, y_i,<t) / Σ_{i,t} mask_it

Used by :class:`callbacks.ar_warmup.ScriptedSFTWarmup` (on the fly at fit start, cached on disk).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch
from torch import Tensor

from lit_rl.tasks.base import Example, Task

__all__ = ["completion_nll", "scripted_sft", "sft_batch"]


def completion_nll(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Mean negative log-likelihood over valid completion tokens.

    Shape: ``token_logprobs``, ``mask`` ``(B, L)`` → scalar. A batch with no valid token gives 0.
    """
    m = mask.to(token_logprobs.dtype)
    return -(token_logprobs * m).sum() / m.sum().clamp(min=1)


def sft_batch(
    policy: torch.nn.Module,
    task: Task,
    examples: Sequence[Example],
    texts: Sequence[str],
    max_prompt_len: int | None,
    max_completion_len: int,
) -> tuple[Tensor, Tensor, int, Tensor]:
    """Tokenise prompts and target completions in the rollout layout.

    Returns ``input_ids (B, P+L)``, ``attention_mask (B, P+L)``, ``P`` and ``completion_mask (B, L)``
    (True up to and including the EOS; completions longer than ``max_completion_len`` are cut).
    """
    prompt_ids, prompt_mask = policy.encode_prompts([task.messages(e) for e in examples], max_prompt_len)  # (B, P)
    comp, lengths = policy.encode_completions(list(texts), max_completion_len)  # (B, L), (B,)
    input_ids = torch.cat([prompt_ids, comp], 1)  # (B, P+L)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(comp)], 1)  # (B, P+L)
    comp_mask = torch.arange(comp.shape[1])[None, :] < lengths[:, None]  # (B, L)
    return input_ids, attention_mask, prompt_ids.shape[1], comp_mask


def scripted_sft(
    policy: torch.nn.Module,
    task: Task,
    examples: Sequence[Example],
    make_text: Callable[[Example, random.Random], str],
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 32,
    max_prompt_len: int | None = None,
    max_completion_len: int = 128,
    seed: int = 0,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] | None = None,
) -> float:
    """``steps`` AdamW steps of completion-only SFT on ``make_text(example, rng)`` targets.

    Prompts are drawn uniformly with replacement from ``examples`` by a ``random.Random(seed)``, which also
    drives ``make_text``, so the same arguments give the same weights. Gradients are clipped to norm 1.
    Returns the last step's loss.
    """
    rng = random.Random(seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    # linear decay to 10% of lr: the last steps settle the weights instead of bouncing
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.9 * s / max(steps, 1))
    was_training = policy.training
    policy.train()
    loss_val = float("nan")
    try:
        for step in range(steps):
            batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            texts = [make_text(e, rng) for e in batch]
            ids, attn, P, cmask = sft_batch(policy, task, batch, texts, max_prompt_len, max_completion_len)
            logp = policy.token_logprobs(ids.to(device), attn.to(device), P)  # (B, L)
            loss = completion_nll(logp, cmask.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            loss_val = float(loss.detach())
            if log is not None and (step + 1) % 100 == 0:
                log(f"AR SFT warm-up step {step + 1}/{steps}: loss {loss_val:.3f}")
    finally:
        policy.train(was_training)
    return loss_val
