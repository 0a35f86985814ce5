"""A native LLaDA: the official checkpoint's weights on transformers' own Llama pieces, bidirectional.

LLaDA-8B-Instruct (Nie et al., "Large Language Diffusion Models", arXiv:2502.09992) is Llama-shaped — RMSNorm,
RoPE, SwiGLU MLP, untied LM head, no biases — with bidirectional attention. Its official remote code
(``modeling_llada.py``) ignores ``attention_mask``: SDPA runs with ``attn_mask=None``, so left padding is
attended and shifts positions (upstream ML-GSAI/LLaDA issues #89/#90). This module is the same network with
padding handled:

* **weight names are the official ones** (``model.transformer.wte``, ``model.transformer.blocks.N.{attn_norm,
  q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj, up_proj, ff_out}``, ``model.transformer.ln_f``,
  ``model.transformer.ff_out``), so ``from_pretrained`` loads the official sharded safetensors directly and a
  peft adapter trained here loads onto the official code (same module paths, same LoRA target names);
* the layers come from transformers: ``LlamaRMSNorm``, ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb``,
  the attention kernels of ``ALL_ATTENTION_FUNCTIONS`` (SDPA, eager, flash), the bidirectional mask of
  ``masking_utils.create_bidirectional_mask`` and ``GradientCheckpointingLayer`` (so
  ``gradient_checkpointing_enable()``, bitsandbytes 4-bit and ``device_map`` work as for Llama);
* position ids count real tokens only (``position_ids_from_attention_mask``) unless given, so a prompt's
  logits do not depend on how much left padding its batch needed.

The official block computes ``x + attn_out(attn(attn_norm(x)))`` then ``x + ff_out(silu(ff_proj(h)) *
up_proj(h))`` with ``h = ff_norm(x)``; RoPE is applied in float32 (``rope_full_precision``), as here.
Options of the official config this implementation does not cover (ALiBi, sequential blocks, qk layer norm,
tied embeddings, ...) raise :class:`ValueError` naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from lit_rl.generation.diffusion import position_ids_from_attention_mask

#: official ``LLaDAConfig`` defaults (``configuration_llada.py``) of the fields read here: a ``config.json``
#: that omits a field means this value, exactly as when the official code loads it
OFFICIAL_DEFAULTS: dict[str, Any] = {
    "d_model": 768, "n_heads": 12, "n_kv_heads": None, "n_layers": 12, "mlp_ratio": 4, "mlp_hidden_size": None,
    "max_sequence_length": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "include_bias": False,
    "include_qkv_bias": False, "vocab_size": 50257, "embedding_size": 50304, "init_std": 0.02,
    "mask_token_id": 50256, "eos_token_id": 50256, "pad_token_id": 50256,
    # the options below must take a supported value (REQUIRED)
    "block_type": "sequential", "rope": False, "alibi": False, "layer_norm_type": "default",
    "activation_type": "swiglu", "attention_layer_norm": False, "input_emb_norm": False, "scale_logits": False,
    "block_group_size": 1, "weight_tying": True, "multi_query_attention": None, "layer_norm_with_affine": True,
    "bias_for_layer_norm": None, "rope_full_precision": True, "attention_dropout": 0.1, "residual_dropout": 0.1,
    "embedding_dropout": 0.1,
}

#: official options this implementation requires: field -> supported values (LLaDA-8B-Instruct's are first)
REQUIRED: dict[str, tuple[Any, ...]] = {
    "block_type": ("llama",),
    "rope": (True,),
    "alibi": (False,),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "attention_layer_norm": (False,),
    "input_emb_norm": (False,),
    "scale_logits": (False,),
    "block_group_size": (1,),
    "weight_tying": (False,),
    "multi_query_attention": (None, False),
    "layer_norm_with_affine": (True,),
    "bias_for_layer_norm": (False, None),
    "rope_full_precision": (True,),
    "attention_dropout": (0.0,),  # no dropout is implemented
    "residual_dropout": (0.0,),
    "embedding_dropout": (0.0,),
}

#: ``model_type`` values of configs this class reads
MODEL_TYPES = ("llada", "lit_rl_llada")


def config_file(path: str | Path) -> Path:
    """``config.json`` of a local model folder (or the file itself), else of a hub repository (cached)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        return p / "config.json"
    from transformers.utils import cached_file

    try:
        return Path(cached_file(str(path), "config.json"))
    except OSError as err:
        from lit_rl.errors import ConfigError

        raise ConfigError(f"policy.path {str(path)!r}: no local folder and no hub config.json ({err})") from None


class NativeLLaDAConfig(PretrainedConfig):
    """The official ``LLaDAConfig`` fields the network uses (names and defaults of LLaDA-8B-Instruct).

    ``model_type`` differs from the official ``"llada"`` so that both can be registered in one process.
    """

    model_type = "lit_rl_llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        n_layers: int = 32,
        mlp_hidden_size: int | None = 12288,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope_theta: float = 500000.0,
        rms_norm_eps: float = 1e-5,
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        init_std: float = 0.02,
        mask_token_id: int | None = 126336,
        **kwargs: Any,
    ) -> None:
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.n_layers = n_layers
        self.mlp_hidden_size = mlp_hidden_size or mlp_ratio * d_model
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size or vocab_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.include_bias = include_bias
        self.include_qkv_bias = include_qkv_bias
        self.init_std = init_std
        self.mask_token_id = mask_token_id
        # transformers' generic names (device maps, TP plans, logging)
        self.hidden_size = d_model
        self.num_attention_heads = n_heads
        self.num_key_value_heads = self.n_kv_heads
        self.num_hidden_layers = n_layers
        kwargs.setdefault("tie_word_embeddings", False)
        for field, allowed in REQUIRED.items():  # written by save_pretrained, so a saved config reads back
            kwargs.setdefault(field, allowed[0])
        super().__init__(**kwargs)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")

    @classmethod
    def from_llada_json(cls, path: str | Path, **overrides: Any) -> "NativeLLaDAConfig":
        """Read an official LLaDA ``config.json`` (a file, its folder, or a hub name such as
        ``GSAI-ML/LLaDA-8B-Instruct``: downloaded to the hub cache); unsupported options raise."""
        from lit_rl.errors import ConfigError

        file = config_file(path)
        try:
            raw = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"{file}: cannot read the LLaDA config ({err})") from None
        if raw.get("model_type") not in MODEL_TYPES:
            raise ConfigError(
                f"{file}: model_type={raw.get('model_type')!r} is not LLaDA ({MODEL_TYPES}); NativeLLaDA loads LLaDA "
                "checkpoints only (lit_rl.models.PretrainedDiffusionLM runs a checkpoint's own code)"
            )
        values = {k: raw.get(k, v) for k, v in OFFICIAL_DEFAULTS.items()}
        for field, allowed in REQUIRED.items():
            if values[field] not in allowed:
                where = "" if field in raw else " (absent: the official default)"
                raise ConfigError(
                    f"{file}: {field}={values[field]!r}{where} is not supported by the native LLaDA (needs "
                    f"{' or '.join(map(repr, allowed))}); load this checkpoint with "
                    "lit_rl.models.PretrainedDiffusionLM (its remote code) instead"
                )
        kwargs = {k: values[k] for k in OFFICIAL_DEFAULTS if k not in REQUIRED}
        if raw.get("bos_token_id") is not None:
            kwargs["bos_token_id"] = raw["bos_token_id"]
        return cls(**(kwargs | overrides))

    def rope_config(self) -> LlamaConfig:
        """A ``LlamaConfig`` carrying only what ``LlamaRotaryEmbedding`` reads."""
        return LlamaConfig(
            hidden_size=self.d_model,
            num_attention_heads=self.n_heads,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_sequence_length,
        )


class NativeLLaDABlock(GradientCheckpointingLayer):
    """One LLaDA Llama block with the official module names; attention through transformers' kernels."""

    def __init__(self, config: NativeLLaDAConfig, layer_idx: int) -> None:
        super().__init__()
        d, hd = config.d_model, config.d_model // config.n_heads
        qkv_bias = config.include_bias or config.include_qkv_bias
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = hd
        self.num_key_value_groups = config.n_heads // config.n_kv_heads  # read by the attention kernels
        self.scaling = hd**-0.5
        self.is_causal = False  # bidirectional: read by the SDPA / flash kernels
        self.attn_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=config.include_bias)
        self.ff_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=config.include_bias)  # gate (SiLU)
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=config.include_bias)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=config.include_bias)

    def project_qkv(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``(B, H, T, hd)`` and keys / values ``(B, H_kv, T, hd)`` of ``hidden_states (B, T, d)``, RoPE
        applied in float32 as the official code (``rope_full_precision``). Shared with the KV-cached decoder
        (:mod:`lit_rl.generation.kv_stack`), which attends these queries to cached keys."""
        B, T, _ = hidden_states.shape
        h = self.attn_norm(hidden_states)
        q = self.q_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.v_proj(h).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        cos, sin = position_embeddings
        q32, k32 = apply_rotary_pos_emb(q.float(), k.float(), cos, sin)
        return q32.to(v.dtype), k32.to(v.dtype), v

    def finish(self, hidden_states: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention: ``att (B, T, H*hd)`` -> residual, then the SwiGLU MLP."""
        hidden_states = hidden_states + self.attn_out(att)
        h = self.ff_norm(hidden_states)
        return hidden_states + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))  # (B, T, d)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, T, d)
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin (B, T, hd) float32
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        B, T, _ = hidden_states.shape
        q, k, v = self.project_qkv(hidden_states, position_embeddings)
        impl = self.config._attn_implementation
        if impl in (None, "eager"):
            attend = eager_attention_forward
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            attend = ALL_ATTENTION_FUNCTIONS[impl]
        att, _ = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, is_causal=False)
        return self.finish(hidden_states, att.reshape(B, T, -1))  # att (B, T, H, hd)


class NativeLLaDAInner(nn.Module):
    """The official ``LLaDAModel``'s parameters under ``transformer`` (the names of the checkpoint)."""

    def __init__(self, config: NativeLLaDAConfig) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.embedding_size, config.d_model),
                "blocks": nn.ModuleList(NativeLLaDABlock(config, i) for i in range(config.n_layers)),
                "ln_f": LlamaRMSNorm(config.d_model, eps=config.rms_norm_eps),
                "ff_out": nn.Linear(config.d_model, config.embedding_size, bias=config.include_bias),
            }
        )
        self.rotary_emb = LlamaRotaryEmbedding(config=config.rope_config())


class NativeLLaDAModel(PreTrainedModel):
    """LLaDA with a correct attention mask and position ids under padding (module docstring).

    ``kv_architecture``: the cached-decoding adapter (:func:`lit_rl.generation.kv_stack.kv_stack_for`).

    ``forward(input_ids, attention_mask=None, position_ids=None)`` returns ``MaskedLMOutput(logits (B, T,
    embedding_size))``, the official model's logits when there is no padding.
    """

    kv_architecture = "llada"

    config_class = NativeLLaDAConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NativeLLaDABlock"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = False
    _supports_attention_backend = True

    def __init__(self, config: NativeLLaDAConfig) -> None:
        super().__init__(config)
        self.model = NativeLLaDAInner(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.transformer.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.transformer.wte = value

    def get_output_embeddings(self) -> nn.Module:
        return self.model.transformer.ff_out

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.model.transformer.ff_out = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 on real tokens
        position_ids: torch.Tensor | None = None,  # (B, T)
        inputs_embeds: torch.Tensor | None = None,  # (B, T, d)
        **kwargs: Any,
    ) -> MaskedLMOutput:
        from transformers.masking_utils import create_bidirectional_mask

        unsupported = [k for k in ("past_key_values", "cache", "labels") if kwargs.get(k) is not None]
        if kwargs.get("use_cache"):
            unsupported.append("use_cache")
        if unsupported:
            raise ValueError(f"NativeLLaDAModel.forward: {unsupported} not supported (no KV cache, no loss)")
        t = self.model.transformer
        x = t.wte(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, d)
        B, T = x.shape[:2]
        if position_ids is None:
            if attention_mask is not None:
                position_ids = position_ids_from_attention_mask(attention_mask)  # (B, T)
            else:
                position_ids = torch.arange(T, device=x.device).expand(B, T)
        anchor = torch.empty(0, device=x.device, dtype=torch.float32)  # cos/sin stay float32
        rope = self.model.rotary_emb(anchor, position_ids)  # cos, sin (B, T, hd)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=x, attention_mask=attention_mask)
        for block in t.blocks:
            x = block(x, position_embeddings=rope, attention_mask=mask)
        return MaskedLMOutput(logits=t.ff_out(t.ln_f(x)))  # (B, T, V)


__all__ = ["MODEL_TYPES", "NativeLLaDAModel", "NativeLLaDABlock", "NativeLLaDAConfig", "OFFICIAL_DEFAULTS", "REQUIRED",
           "config_file"]
