"""Autoregressive generation backends for GRPO and double-rollout GRPO (docs/double_rollout.md).

One interface, :class:`ARBackend`, two jobs:

* ``generate(prompt_ids, prompt_mask, n=G, ...)`` — first stage: G rollouts per (left-padded) prompt;
* ``continue_from(prefixes, n=N, max_new_tokens=budgets)`` — second stage: N continuations of each cut
  prefix ``x ⊕ t_i[:ρT_i]`` with a per-prefix budget ``ceil((1-ρ)T_i) + buffer``.

Both return completion ids ``(R*n, L)``, rows prompt-major (prefix 0's n samples first), EOS-filled after
the first EOS. A row stopped by its own (per-prefix) budget is EOS-filled after the budget too; tell the two
apart with :func:`hit_budget`.

Implementations:

* :class:`HFBackend` — a KV-cached sampling loop over a :class:`~lit_rl.models.ar.CausalPolicy` (CPU or
  GPU). Each prefix is prefilled ONCE (all prefixes in one left-padded batch) and its KV cache is expanded
  n ways (``Cache.batch_repeat_interleave``) before sampling; ``share_prefix=False`` re-encodes every
  prefix n times instead (the baseline of ``benchmarks/double_rollout_cost.py``). Sampling draws the same
  noise in both modes (exponential race: ``argmax(p / E)``, ``E ~ Exp(1)`` from a seeded
  ``torch.Generator``), so both return the same samples up to float round-off.
* :class:`VLLMBackend` — ``vllm.LLM(enable_prefix_caching=True)`` with ``SamplingParams(n=N)``; the
  engine's prefix cache shares the prefill. ``push_weights`` loads the trained weights (LoRA merged) into
  the engine after an optimizer step through vLLM's in-place ``reload_weights``, as TRL's colocate mode does
  (:mod:`lit_rl.generation.vllm_engine`). vLLM is imported lazily: ``pip install 'lit-rl[vllm]'`` on CUDA,
  ``scripts/setup.sh vllm`` on CPU (docs/vllm.md).

:meth:`ARBackend.generate_with_logprobs` also returns each sampled token's log-probability, ``(R, L)``: the
log-softmax of the temperature-scaled logits (what the trainer's ``token_logprobs`` recomputes), 0 after a row's
end. The gap between the two is the sampler/trainer mismatch that importance-sampling corrections address.
"""

from __future__ import annotations

import gc
import inspect
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lit_rl import rng
from lit_rl.errors import FieldError
from lit_rl.generation.vllm_engine import (
    check_weights,
    engine_shapes,
    export_policy,
    import_vllm,
    merged_state_dict,
    on_cpu_platform,
    policy_weights,
    reload_weights,
)

__all__ = ["ARBackend", "HFBackend", "VLLMBackend", "hit_budget", "left_pad", "merged_state_dict", "sample_next"]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to a common width: ``(ids (R, S), mask (R, S))``."""
    if not rows:
        raise ValueError("left_pad: no rows")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r) == 0:
            raise ValueError(f"left_pad: row {i} is empty (a prefix needs at least one token)")
        ids[i, width - len(r):] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


def hit_budget(completion_ids: torch.Tensor, budgets: torch.Tensor | Sequence[int] | int, eos_id: int) -> torch.Tensor:
    """``(R,)`` bool: the row generated no EOS within its first ``budget`` tokens (it was cut)."""
    width = completion_ids.shape[1]
    b = torch.as_tensor(budgets, device=completion_ids.device).expand(completion_ids.shape[0])  # (R,)
    within = torch.arange(width, device=completion_ids.device)[None, :] < b[:, None]  # (R, L)
    return ~((completion_ids == eos_id) & within).any(-1)


def _budgets(max_new_tokens: int | Sequence[int], rows: int) -> list[int]:
    if isinstance(max_new_tokens, int):
        budgets = [max_new_tokens] * rows
    else:
        budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != rows:
            raise ValueError(f"max_new_tokens: {len(budgets)} budgets for {rows} prefixes")
    if any(b < 1 for b in budgets):
        raise ValueError(f"max_new_tokens must be >= 1, got {min(budgets)}")
    return budgets


def _check_sampling(temperature: float, top_p: float, n: int) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")


class ARBackend(ABC):
    """Generation for AR policies: first-stage rollouts and double-rollout continuations."""

    eos_id: int

    @abstractmethod
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> torch.Tensor:
        """``n`` completions of each left-padded prompt ``(B, P)``: ids ``(B*n, max_new_tokens)``,
        prompt-major, EOS-filled after the first EOS."""

    @abstractmethod
    def continue_from(
        self,
        prefix_ids: Sequence[Sequence[int]],
        n: int,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> torch.Tensor:
        """``n`` continuations of each unpadded prefix (prompt ⊕ cut trace): ids ``(R*n, max budget)``,
        prefix-major. ``max_new_tokens`` is one budget or one per prefix; a row is EOS-filled after its
        first EOS or after its budget (see :func:`hit_budget`)."""

    def generate_with_logprobs(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`generate`, plus the sampled tokens' log-probabilities ``(B*n, max_new_tokens)`` float32: log-softmax
        of the logits divided by ``temperature`` (unscaled for greedy), 0 after a row's first EOS. Optional: a
        backend that cannot report them (a user's own) raises ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} does not report sampled log-probabilities")

    def push_weights(self, weights: nn.Module | Mapping[str, torch.Tensor]) -> None:  # noqa: B027
        """Make the backend sample from updated weights (no-op when it shares the policy's modules)."""

    # -- the Engine interface (lit_rl.generation.engine) ------------------------------------------------
    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: Any, *, n: int = 1,
               seed: int, stats: Any = None) -> torch.Tensor:
        """:meth:`generate` with a :class:`~lit_rl.models.ar.SamplingSettings` (``max_new_tokens``,
        ``temperature``, ``top_p``): ``(B*n, max_new_tokens)``, prompt-major. ``stats`` is the dLLM's; unused."""
        return self.generate(prompt_ids, prompt_mask, max_new_tokens=settings.max_new_tokens,
                             temperature=settings.temperature, top_p=settings.top_p, n=n, seed=seed)

    def sync(self, policy: nn.Module) -> None:
        """:meth:`push_weights` of the policy."""
        self.push_weights(policy)


# -- sampling ------------------------------------------------------------------------------------------
def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from ``logits (R, V)``: ``(R,)``.

    ``temperature == 0`` is argmax. Otherwise an exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)``
    (equivalent to sampling from ``p``): the noise has a fixed shape ``(R, V)`` per step, so the same seed
    gives the same draws whatever path produced the logits. ``top_p < 1`` keeps the smallest set of tokens
    whose probability reaches ``top_p`` (nucleus sampling).
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (R, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)  # (R, V)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)  # (R, V)
    noise = rng.exponential(probs.shape, generator=generator, device=probs.device, dtype=probs.dtype)  # (R, V)
    return (probs / noise).argmax(-1)


class HFBackend(ARBackend):
    """KV-cached sampling with a transformers causal LM; continuations of a prefix share its prefill.

    Args:
        policy: a :class:`~lit_rl.models.ar.CausalPolicy` (its ``model``, ``eos_id``, ``pad_id`` are used;
            the backend shares the policy's modules, so trained weights are used at once).
        share_prefix: prefill each prefix once and expand its KV cache ``n`` ways (default). ``False``
            re-encodes the prefix for every sample (same samples, more compute; for benchmarks).
        max_rows: at most this many sampled rows per forward pass (prefixes are processed in chunks of
            ``max_rows // n``); ``None`` does everything in one batch.
        prune_finished: when at least this fraction of the batch has ended (EOS or budget), drop the
            ended rows from the batch and the KV cache (``Cache.batch_select_indices``); ``0`` never
            prunes. The samples depend on it (the noise is drawn for the active rows only), so keep it
            fixed across runs that must match.
    """

    @staticmethod
    def check_args(prune_finished: float = 0.25) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if not 0 <= prune_finished <= 1:
            raise FieldError("prune_finished", f"must be in [0, 1], got {prune_finished}")

    def __init__(
        self, policy: nn.Module, share_prefix: bool = True, max_rows: int | None = None, prune_finished: float = 0.25
    ) -> None:
        HFBackend.check_args(prune_finished=prune_finished)
        self.policy = policy
        self.share_prefix = share_prefix
        self.max_rows = max_rows
        self.prune_finished = prune_finished
        self.eos_id = int(policy.eos_id)
        self.pad_id = int(policy.pad_id)
        self._kwargs: tuple[str, dict[str, int]] | None = None  # resolved on first use

    # -- public API --------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> torch.Tensor:
        _check_sampling(temperature, top_p, n)
        budgets = _budgets(max_new_tokens, prompt_ids.shape[0])
        return self._run(prompt_ids, prompt_mask, n, budgets, temperature, top_p, seed)[0]

    def generate_with_logprobs(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sampling(temperature, top_p, n)
        budgets = _budgets(max_new_tokens, prompt_ids.shape[0])
        ids, lps = self._run(prompt_ids, prompt_mask, n, budgets, temperature, top_p, seed, logprobs=True)
        assert lps is not None
        return ids, lps

    def continue_from(
        self,
        prefix_ids: Sequence[Sequence[int]],
        n: int,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> torch.Tensor:
        _check_sampling(temperature, top_p, n)
        budgets = _budgets(max_new_tokens, len(prefix_ids))
        ids, mask = left_pad(prefix_ids, self.pad_id)  # (R, S)
        return self._run(ids, mask, n, budgets, temperature, top_p, seed)[0]

    # -- internals ---------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        return self.policy.model

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward_kwargs(self) -> tuple[str, dict[str, int]]:
        """Keyword names of this transformers version, read from the model's ``forward`` signature.

        The KV cache is ``cache`` from transformers 5.2x (``past_key_values`` before, still accepted as
        a deprecated alias); last-position-only logits are ``logits_to_keep`` (>= 4.50) or
        ``num_logits_to_keep`` (4.45-4.49), so the prefill never materialises ``(R, S, V)`` logits.
        """
        if self._kwargs is None:
            base = self.model
            get_base = getattr(base, "get_base_model", None)  # peft
            if callable(get_base):
                base = get_base()
            params = inspect.signature(type(base).forward).parameters
            cache_kw = "cache" if "cache" in params else "past_key_values"
            keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
            self._kwargs = (cache_kw, {keep: 1} if keep else {})
        return self._kwargs

    def _step(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """One forward that appends to ``cache`` (a ``DynamicCache``, updated in place): last logits ``(R, V)``."""
        cache_kw, keep = self._forward_kwargs()
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_kw: cache},
            **keep,
        )
        return out.logits[:, -1]

    @torch.no_grad()
    def _run(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        n: int,
        budgets: list[int],
        temperature: float,
        top_p: float,
        seed: int,
        logprobs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self._device()
        generator = rng.device_generator(seed, device)  # (R, V) noise per step: drawn where it is used
        width = max(budgets)
        per_chunk = len(budgets) if self.max_rows is None else max(1, self.max_rows // n)
        was_training = self.model.training
        self.model.eval()  # no dropout; gradient checkpointing would turn the cache off in train mode
        try:
            chunks = []
            for s in range(0, len(budgets), per_chunk):
                c_ids, c_mask = ids[s : s + per_chunk], mask[s : s + per_chunk]  # (r, S)
                start = int((c_mask.sum(0) > 0).long().argmax())  # drop padding columns no row needs
                chunks.append(self._sample_chunk(
                    c_ids[:, start:].to(device), c_mask[:, start:].to(device), n,
                    budgets[s : s + per_chunk], width, temperature, top_p, generator, logprobs,
                ))
        finally:
            self.model.train(was_training)
        ids = torch.cat([c[0] for c in chunks]).cpu()  # (R*n, width)
        lps = torch.cat([c[1] for c in chunks]).cpu() if logprobs else None  # (R*n, width)
        return ids, lps

    def _sample_chunk(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        n: int,
        budgets: list[int],
        width: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator,
        logprobs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        from transformers import DynamicCache

        device = ids.device
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (R, S)
        if self.share_prefix:
            # prefill each prefix once, then give each of its n samples a view of that KV cache
            cache = DynamicCache()
            logits = self._step(ids, mask, positions, cache)  # (R, V)
            cache.batch_repeat_interleave(n)  # every layer's K/V: (R, ...) -> (R*n, ...)
            logits = logits.repeat_interleave(n, 0)  # (R*n, V)
            mask = mask.repeat_interleave(n, 0)  # (R*n, S)
            positions = positions.repeat_interleave(n, 0)  # (R*n, S)
        else:
            ids, mask, positions = (t.repeat_interleave(n, 0) for t in (ids, mask, positions))  # (R*n, S)
            cache = DynamicCache()
            logits = self._step(ids, mask, positions, cache)  # (R*n, V)
        rows = logits.shape[0]
        budget = torch.tensor(budgets, device=device).repeat_interleave(n)  # (A,) A = active rows, R*n at first
        next_pos = positions[:, -1] + 1  # (A,)
        out = torch.full((rows, width), self.eos_id, dtype=torch.long, device=device)
        lps = torch.zeros((rows, width), dtype=torch.float32, device=device) if logprobs else None
        active = torch.arange(rows, device=device)  # (A,) row of `out` of each active row
        done = torch.zeros(rows, dtype=torch.bool, device=device)  # (A,)
        for t in range(width):
            token = sample_next(logits, temperature, top_p, generator)  # (A,)
            token = token.masked_fill(done, self.eos_id)
            out[active, t] = token
            if lps is not None:  # the sampled token under the temperature-scaled softmax (the trainer's value)
                scaled = logits.float() / temperature if temperature > 0 else logits.float()  # (A, V)
                picked = torch.log_softmax(scaled, -1).gather(-1, token[:, None]).squeeze(-1)  # (A,)
                lps[active, t] = picked.masked_fill(done, 0.0)
            done |= (token == self.eos_id) | (budget <= t + 1)
            if bool(done.all()):
                break
            if self.prune_finished and float(done.float().mean()) >= self.prune_finished:
                # drop finished rows from the batch: one copy of the cache, then cheaper steps
                keep = (~done).nonzero().squeeze(-1)  # (A',)
                cache.batch_select_indices(keep)
                active, token, mask, next_pos, budget, done = (
                    x[keep] for x in (active, token, mask, next_pos, budget, done)
                )
            ones = torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=device)
            mask = torch.cat([mask, ones], dim=1)  # (A, S + t + 1)
            logits = self._step(token[:, None], mask, next_pos[:, None], cache)  # (A, V)
            next_pos = next_pos + 1
        return out, lps  # (R*n, width) each


# -- vLLM ----------------------------------------------------------------------------------------------
class VLLMBackend(ARBackend):
    """vLLM generation with prefix caching; weights pushed from the trained policy (colocate mode, docs/vllm.md).

    The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before it starts), so
    :meth:`push_weights` hands it the trained tensors by reference through vLLM's in-place ``reload_weights``.

    Args:
        model_path: the checkpoint the engine starts from (same architecture as the policy: a local directory or a
            hub name), or the policy itself. In YAML, leaving ``model_path`` out makes the DataModule call the
            backend with its policy: a ``PretrainedCausalLM`` starts the engine from its ``path``; any other policy
            (the tiny in-code models) is first written to ``export_dir`` as a safetensors checkpoint. Such an engine
            gets token ids only (``skip_tokenizer_init``) and stops on the policy's EOS.
        eos_id: EOS id used to stop and to fill finished rows; ``None`` reads the policy's, else the engine
            tokenizer's ``eos_token_id``.
        dtype: engine weight dtype.
        gpu_memory_utilization: fraction of GPU memory vLLM may take (the trainer shares the GPU). On vLLM's CPU
            backend it is a fraction of *CPU* memory, and the KV cache gets that share minus the whole process's
            resident memory (the trainer's included): 0.9 refuses to start on a 24 GB machine, and a second engine
            in one process can find nothing left. Prefer ``kv_cache_memory_bytes`` there.
        kv_cache_memory_bytes: an explicit KV cache size, which replaces ``gpu_memory_utilization``'s sizing
            (``None``: vLLM sizes it). On CPU 256 MiB holds ~65k tokens of the chain-sum model.
        max_model_len: longest prompt + completion; ``None`` uses the policy's ``max_positions`` or the model's.
        enable_prefix_caching: reuse KV blocks of shared prefixes (the n samples of a request, and a
            prefix's continuations); keep it on.
        block_size: KV cache block, in tokens (``None``: vLLM's, 16 on GPU, 128 on CPU). Only whole blocks are
            cached, so on CPU a prefix shorter than 128 tokens is never reused: the tiny configs set 32 (the CPU
            attention takes multiples of 32 only).
        tensor_parallel_size: GPUs per engine.
        enable_sleep_mode: passed to vLLM (CUDA only). lit_rl does not call ``sleep`` / ``wake_up`` between
            rollouts and updates yet, so it frees nothing on its own today.
        enforce_eager: skip vLLM's torch.compile / graph capture: an engine starts in ~5 s instead of ~60 s on CPU
            (measured on the chain-sum model, docs/vllm.md), at some cost per token on large models.
        ignore_eos: rows run to their budget whatever they sample (vLLM's ``ignore_eos``; for benchmarks that need the
            same token count on every side, not for training).
        seed: engine seed (each request also carries its own).
        export_dir: where a policy without a checkpoint is written (``None``: a temporary directory removed when the
            backend is garbage-collected or the process exits).
        llm_kwargs: any other ``vllm.LLM`` arguments.

    Log-probabilities (:meth:`generate_with_logprobs`) use ``logprobs_mode="processed_logprobs"``: log-softmax of
    the temperature-scaled logits, as the trainer recomputes them; with ``top_p < 1`` vLLM renormalises over the
    nucleus, the trainer does not.
    """

    def __init__(
        self,
        model_path: str | nn.Module,
        *,
        eos_id: int | None = None,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = False,
        ignore_eos: bool = False,
        seed: int = 0,
        export_dir: str | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.vllm = import_vllm()
        self.ignore_eos = ignore_eos
        # colocate: run the engine in this process so push_weights can hand it tensors
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs: dict[str, Any] = {
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": enable_prefix_caching,
            "tensor_parallel_size": tensor_parallel_size,
            "enable_sleep_mode": enable_sleep_mode,
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
        }
        if enforce_eager:
            kwargs["enforce_eager"] = True
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if block_size is not None:
            kwargs["block_size"] = int(block_size)
        if on_cpu_platform(self.vllm):  # every request here is seeded: see on_cpu_platform
            kwargs["enable_chunked_prefill"] = False
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        # pushed tensors are cast to the engine's dtype here (vLLM would cast too, warning once per tensor)
        named = getattr(torch, dtype, None)  # "auto" (or another engine word) names no torch dtype: no cast
        self._dtype: torch.dtype | None = named if isinstance(named, torch.dtype) else None
        if isinstance(model_path, nn.Module):
            policy = model_path
            path = getattr(policy, "path", None)  # a PretrainedCausalLM's checkpoint (local or on the hub)
            if not (isinstance(path, str) and path):
                if export_dir is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="lit_rl_vllm_")
                    export_dir = self._tmp.name
                path = str(export_policy(policy, export_dir, dtype=self._dtype))
                kwargs["skip_tokenizer_init"] = True  # the in-code tokenizers are not HF files: ids in, ids out
            if eos_id is None:
                eos_id = int(policy.eos_id)
            if max_model_len is None and getattr(policy, "max_positions", None):
                max_model_len = int(policy.max_positions)
            model_path = path  # a prepared model's folder (PretrainedCausalLM resolves smollm2-135m-instruct)
        kwargs["model"] = model_path
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs or {})
        self.model_path = str(model_path)
        self.llm: Any = self.vllm.LLM(**kwargs)
        self.eos_id = int(eos_id if eos_id is not None else self.llm.get_tokenizer().eos_token_id)
        self._expected, self._tied = engine_shapes(self.model_path)

    def sampling_params(
        self, *, n: int, temperature: float, top_p: float, max_tokens: int, seed: int, logprobs: bool = False
    ) -> Any:
        if self.ignore_eos:  # rows run to their budget (benchmarks: the same token count on every side)
            return self.vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                            seed=seed, ignore_eos=True, logprobs=0 if logprobs else None)
        return self.vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
            stop_token_ids=[self.eos_id], logprobs=0 if logprobs else None,
        )

    def _engine(self) -> Any:
        if self.llm is None:
            raise RuntimeError("VLLMBackend: the engine was closed (close()); build a new backend")
        return self.llm

    def _requests(
        self, prompts: list[list[int]], n: int, budgets: list[int], temperature: float, top_p: float, seed: int,
        logprobs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # one seed per request, n apart: vLLM V1 gives the j-th of n samples seed + j, and two samples
        # with the same seed would draw the same noise stream
        params = [
            self.sampling_params(n=n, temperature=temperature, top_p=top_p, max_tokens=b, seed=seed + i * n,
                                 logprobs=logprobs)
            for i, b in enumerate(budgets)
        ]
        outputs = self._engine().generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        width = max(budgets)
        out = torch.full((len(prompts) * n, width), self.eos_id, dtype=torch.long)
        lps = torch.zeros((len(prompts) * n, width), dtype=torch.float32) if logprobs else None
        for i, request in enumerate(outputs):
            samples = sorted(request.outputs, key=lambda o: getattr(o, "index", 0))
            if len(samples) != n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for request {i}, expected {n}")
            for j, sample in enumerate(samples):
                out[i * n + j], rewritten = self._row(sample, width)
                if lps is not None:
                    lps[i * n + j] = self._row_logprobs(sample, width, rewritten)
        return out, lps

    @staticmethod
    def _row_logprobs(sample: Any, width: int, rewritten: int | None = None) -> torch.Tensor:
        """The sampled tokens' log-probabilities of one ``CompletionOutput`` as a row ``(width,)`` (``logprobs=0``:
        each step's dict holds the sampled token), 0 after the row's end. At ``rewritten`` (where :meth:`_row` put
        our EOS in place of another stop, or after a stop string) the engine never scored EOS: NaN there, so a
        comparison with the trainer's value of EOS cannot pass silently."""
        values = [float(step[tok].logprob) for tok, step in zip(sample.token_ids, sample.logprobs or [])]
        row = torch.zeros(width, dtype=torch.float32)
        values = values[:width]
        if values:
            row[: len(values)] = torch.tensor(values, dtype=torch.float32)
        if rewritten is not None and rewritten < width:
            row[rewritten] = float("nan")
        return row

    def _row(self, sample: Any, width: int) -> tuple[torch.Tensor, int | None]:
        """One vLLM ``CompletionOutput`` as an EOS-filled row ``(width,)``, and the position where our EOS replaced
        or followed what the engine returned (``None`` when it returned our EOS itself or no stop).

        A stop on another stop token id (``stop_reason`` an int, e.g. ``<|endoftext|>`` next to
        ``<|im_end|>``) or on a stop string (``stop_reason`` a str) is rewritten as our EOS, so every
        finished row ends the same way.
        """
        tokens = [int(t) for t in sample.token_ids]
        stop_reason = getattr(sample, "stop_reason", None)
        rewritten = None
        if getattr(sample, "finish_reason", None) == "stop":
            if isinstance(stop_reason, int) and tokens and tokens[-1] == stop_reason and stop_reason != self.eos_id:
                tokens[-1] = self.eos_id
                rewritten = len(tokens) - 1
            elif not tokens or tokens[-1] != self.eos_id:
                tokens.append(self.eos_id)
                rewritten = len(tokens) - 1
        row = torch.full((width,), self.eos_id, dtype=torch.long)
        tokens = tokens[:width]
        if tokens:
            row[: len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return row, rewritten

    @staticmethod
    def _prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
        return [row[m.bool()].tolist() for row, m in zip(prompt_ids.cpu(), prompt_mask.cpu())]  # strip padding

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> torch.Tensor:
        _check_sampling(temperature, top_p, n)
        prompts = self._prompts(prompt_ids, prompt_mask)
        return self._requests(prompts, n, _budgets(max_new_tokens, len(prompts)), temperature, top_p, seed)[0]

    def generate_with_logprobs(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sampling(temperature, top_p, n)
        prompts = self._prompts(prompt_ids, prompt_mask)
        ids, lps = self._requests(prompts, n, _budgets(max_new_tokens, len(prompts)), temperature, top_p, seed,
                                  logprobs=True)
        assert lps is not None
        return ids, lps

    def continue_from(
        self,
        prefix_ids: Sequence[Sequence[int]],
        n: int,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> torch.Tensor:
        _check_sampling(temperature, top_p, n)
        prompts = [list(map(int, p)) for p in prefix_ids]
        return self._requests(prompts, n, _budgets(max_new_tokens, len(prompts)), temperature, top_p, seed)[0]

    def push_weights(self, weights: nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Load updated weights into the engine (LoRA merged) and drop its now stale prefix cache.

        ``weights``: the policy (a :class:`~lit_rl.models.ar.CausalPolicy`), its HF model (plain or peft) or a
        state dict with HF parameter names. When the engine started from a local checkpoint, the names and shapes
        are checked against it first (:func:`~lit_rl.generation.check_weights`): a mismatch is one
        :class:`~lit_rl.generation.vllm_engine.WeightSyncError` and the engine keeps its weights.
        """
        state = policy_weights(weights)
        if self._expected is not None:
            check_weights(state, self._expected, where=self.model_path, tied=self._tied)
        # a generator: one cast tensor at a time, no second copy of the model in memory
        reload_weights(self._engine(), ((k, v if self._dtype is None else v.to(self._dtype)) for k, v in state.items()))

    def prefix_cache_counts(self) -> tuple[int, int] | None:
        """``(queried, hit)`` prompt tokens of the engine's prefix cache so far; ``None`` unless the engine keeps
        stats (``llm_kwargs: {disable_log_stats: false}``)."""
        counts = {m.name: int(m.value) for m in self._engine().get_metrics()
                  if m.name.startswith("vllm:prefix_cache_")}
        if "vllm:prefix_cache_queries" not in counts:
            return None
        return counts["vllm:prefix_cache_queries"], counts.get("vllm:prefix_cache_hits", 0)

    def close(self) -> None:
        """Shut the engine down (dropping the last reference runs vLLM's own shutdown finaliser, which frees the KV
        cache) and remove a temporary export. Idempotent; the backend cannot generate afterwards.

        Keep one live engine per process: that shutdown also tears down vLLM's process-wide parallel state, so
        another engine of the same process stops working ("pipeline model parallel group is not initialized";
        measured with two engines in one test process)."""
        self.llm = None
        gc.collect()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
