"""Layer-by-layer forward of a bidirectional dLLM with a per-layer key/value cache (Fast-dLLM style).

A masked diffusion LM attends in both directions, so no token's keys and values are final until decoding
ends. Fast-dLLM (Wu et al., "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding", arXiv:2505.22618) observes that they barely change within one block's denoising steps
and reuses them: compute all keys/values once at the start of a block (a **refresh**), then run only a
**window** of positions through the layers at the following steps, its queries attending to the cached
keys/values of every other position and to the window's own fresh ones.

:class:`KVStack` implements the two calls over an :class:`Architecture` adapter that exposes a model's
pieces (embedding, per-layer query/key/value projection, the rest of the layer, the LM head). The adapters
call the model's own submodules, so LoRA (peft) and 4-bit (bitsandbytes) layers run as in the normal
forward, and :func:`kv_stack_for` returns one for the models lit_rl ships:

* ``BertForMaskedLM`` (the embedded :class:`~lit_rl.models.TinyDiffusionLM`, architecture ``bert``);
* :class:`~lit_rl.models.llada.NativeLLaDAModel` (``NativeLLaDA`` and ``TinyDiffusionLM`` ``llada``);
* :class:`~lit_rl.models.dream.NativeDreamModel` (``NativeDream``; logits at ``p - 1`` predict ``p``).

A checkpoint's own remote code (``PretrainedDiffusionLM``) gets none: its forward is opaque. A refresh's
logits equal the model's normal forward to float rounding (tested); the cached keys are stored after RoPE
(a token's position never changes) with the model's key/value head count (GQA stays compact).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Architecture", "KVCache", "KVStack", "kv_stack_for"]


class Architecture(Protocol):
    """A model's pieces in the order a layer uses them. Shapes: ``A`` positions per row, ``d`` the width."""

    #: logits for position ``p`` come from the hidden state at ``p - shift`` (Dream: 1)
    shift: int

    def layers(self) -> Sequence[nn.Module]: ...

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``ids, pos (B, A)`` -> hidden ``(B, A, d)`` and a per-call context (RoPE cos/sin) for :meth:`qkv`."""

    def qkv(self, layer: nn.Module, h: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h (B, A, d)`` -> queries ``(B, H, A, hd)``, keys and values ``(B, H_kv, A, hd)``."""

    def finish(self, layer: nn.Module, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The layer after attention: input ``h (B, A, d)`` and ``att (B, A, H*hd)`` -> ``(B, A, d)``."""

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` -> logits ``(..., V)``."""


@dataclass
class KVCache:
    """Per-layer keys and values of every position of ``batch`` rows, ``(batch, H_kv, T, hd)`` each,
    allocated at the first refresh."""

    batch: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    def store(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v (R, H_kv, T, hd)`` as the cache of ``rows (R,)`` at ``layer``."""
        if layer == len(self.keys):
            self.keys.append(k.new_zeros((self.batch, *k.shape[1:])))
            self.values.append(v.new_zeros((self.batch, *v.shape[1:])))
        self.keys[layer][rows] = k
        self.values[layer][rows] = v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA of ``q (B, H, A, hd)`` over ``k, v (B, H_kv, T, hd)`` with a key mask ``(B, 1, 1, T)`` bool (or
    ``None``: every key real) -> ``(B, A, H*hd)``. Key/value heads repeat as transformers' ``repeat_kv``."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, T, hd)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, A, hd); scale 1/sqrt(hd)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)  # (B, A, H*hd)


class KVStack:
    """Full (refresh) and windowed forwards of an :class:`Architecture` through a :class:`KVCache`.

    ``forward_tokens`` counts the positions run through the layers (what a GPU's compute scales with).
    """

    def __init__(self, arch: Architecture) -> None:
        self.arch = arch
        self.shift = arch.shift
        self.forward_tokens = 0

    @staticmethod
    def _key_mask(key_mask: torch.Tensor) -> torch.Tensor | None:
        return None if bool(key_mask.all()) else key_mask[:, None, None, :]  # (B, 1, 1, T)

    def refresh(
        self, ids: torch.Tensor, pos: torch.Tensor, key_mask: torch.Tensor, cache: KVCache, rows: torch.Tensor
    ) -> torch.Tensor:
        """Forward all ``T`` positions of ``rows``, storing every layer's keys/values in ``cache``.

        Args: ``ids, pos, key_mask (R, T)`` for the cache rows ``rows (R,)``. Returns hidden ``(R, T, d)``.
        """
        mask = self._key_mask(key_mask)
        h, ctx = self.arch.embed(ids, pos)  # (R, T, d)
        for i, layer in enumerate(self.arch.layers()):
            q, k, v = self.arch.qkv(layer, h, ctx)
            cache.store(i, rows, k, v)
            h = self.arch.finish(layer, h, _attend(q, k, v, mask))
        self.forward_tokens += ids.numel()
        return h

    def window(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        index: torch.Tensor,
        key_mask: torch.Tensor,
        cache: KVCache,
        rows: torch.Tensor,
        fresh_from: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward only the positions ``index (R, A)`` of ``rows (R,)``; every other key/value is the cache's.

        Args: ``ids, pos (R, A)`` the window's tokens and positions; ``key_mask (R, T)``; ``fresh_from (R,)``:
        a row's window positions before this one keep their cached keys/values (a window shared by rows at
        different block starts then gives each row exactly what its own window would), ``None``: all fresh.
        The fresh keys/values are written into the cache at their positions: in place when ``rows`` is the
        whole batch in order, else into a copy of the rows' cache. The decoder recomputes a row's fresh
        positions at every step until the row's next refresh, so no later step reads them as cache.
        Returns hidden ``(R, A, d)``.
        """
        mask = self._key_mask(key_mask)
        whole = rows.numel() == cache.batch and bool((rows == torch.arange(cache.batch, device=rows.device)).all())
        keep = None if fresh_from is None else (index < fresh_from[:, None])[:, None, :, None]  # (R, 1, A, 1)
        h, ctx = self.arch.embed(ids, pos)  # (R, A, d)
        for i, layer in enumerate(self.arch.layers()):
            q, k, v = self.arch.qkv(layer, h, ctx)  # k, v (R, H_kv, A, hd)
            at = index[:, None, :, None].expand_as(k)  # (R, H_kv, A, hd)
            k_all = cache.keys[i] if whole else cache.keys[i][rows]  # (R, H_kv, T, hd); indexing copies
            v_all = cache.values[i] if whole else cache.values[i][rows]
            if keep is not None:
                k = torch.where(keep, k_all.gather(2, at), k)
                v = torch.where(keep, v_all.gather(2, at), v)
            k_all, v_all = k_all.scatter_(2, at, k), v_all.scatter_(2, at, v)
            h = self.arch.finish(layer, h, _attend(q, k_all, v_all, mask))
        self.forward_tokens += ids.numel()
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.arch.head(h)


class BertArchitecture:
    """``transformers.BertForMaskedLM`` (absolute positions added at the embedding, post-LN layers)."""

    shift = 0

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def layers(self) -> Sequence[nn.Module]:
        return self.model.bert.encoder.layer

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self.model.bert.embeddings(input_ids=ids, position_ids=pos), None

    def qkv(self, layer: nn.Module, h: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sa = layer.attention.self
        B, A, _ = h.shape
        return tuple(p(h).view(B, A, -1, sa.attention_head_size).transpose(1, 2) for p in (sa.query, sa.key, sa.value))

    def finish(self, layer: nn.Module, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        a = layer.attention.output(att, h)  # dense + residual + LayerNorm
        return layer.output(layer.intermediate(a), a)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.cls(h)


class LLaDAArchitecture:
    """lit_rl's :class:`~lit_rl.models.llada.NativeLLaDAModel` (its blocks' own ``project_qkv`` / ``finish``)."""

    shift = 0

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.t = model.model.transformer

    def layers(self) -> Sequence[nn.Module]:
        return self.t.blocks

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any]:
        h = self.t.wte(ids)
        anchor = torch.empty(0, device=h.device, dtype=torch.float32)  # cos/sin stay float32
        return h, self.model.model.rotary_emb(anchor, pos)

    def qkv(self, layer: nn.Module, h: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return layer.project_qkv(h, ctx)

    def finish(self, layer: nn.Module, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        return layer.finish(h, att)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.t.ff_out(self.t.ln_f(h))


class Qwen2Architecture:
    """lit_rl's :class:`~lit_rl.models.dream.NativeDreamModel` (transformers' Qwen2 layers, bidirectional);
    Dream predicts token ``p`` from the hidden state at ``p - 1``."""

    shift = 1

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def layers(self) -> Sequence[nn.Module]:
        return self.model.model.layers

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, Any]:
        h = self.model.model.embed_tokens(ids)
        return h, self.model.model.rotary_emb(h, pos)

    def qkv(self, layer: nn.Module, h: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        sa = layer.self_attn
        B, A, _ = h.shape
        hn = layer.input_layernorm(h)
        q, k, v = (p(hn).view(B, A, -1, sa.head_dim).transpose(1, 2) for p in (sa.q_proj, sa.k_proj, sa.v_proj))
        q, k = apply_rotary_pos_emb(q, k, *ctx)
        return q, k, v

    def finish(self, layer: nn.Module, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        h = h + layer.self_attn.o_proj(att)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(h))


def kv_stack_for(model: nn.Module) -> KVStack | None:
    """A :class:`KVStack` over ``model`` (a peft wrapper is looked through), or ``None`` for an architecture
    without an adapter (a checkpoint's own remote code) or FSDP2-sharded weights (the adapters call a
    block's submodules, which FSDP2's per-block hooks do not gather)."""
    from torch.distributed.tensor import DTensor
    from transformers import BertForMaskedLM

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if any(isinstance(p, DTensor) for p in base.parameters()):
        return None
    if isinstance(base, BertForMaskedLM):
        return KVStack(BertArchitecture(base))
    # lit_rl's native models name their adapter (a class attribute: generation never imports lit_rl.models)
    arch = {"llada": LLaDAArchitecture, "qwen2": Qwen2Architecture}.get(getattr(type(base), "kv_architecture", None))
    return KVStack(arch(base)) if arch is not None else None
