"""A native Dream: transformers' own Qwen2 with bidirectional attention and a real padding mask.

Dream-v0-Instruct-7B (Ye et al., "Dream 7B: Diffusion Large Language Models", arXiv:2508.15487) is Qwen2-shaped
(q/k/v biases, RMSNorm, RoPE, SwiGLU, untied head) with full attention, and predicts token ``t`` from the
logits at ``t - 1`` (lit_rl's policy shifts them: ``logits_shift``). Its weight names are Qwen2's
(``model.layers.N.self_attn.q_proj``, ``lm_head``), so :class:`NativeDreamModel` *is*
``Qwen2ForCausalLM`` with two changes:

* every attention layer has ``is_causal = False``, and the mask handed to the layers is
  ``masking_utils.create_bidirectional_mask`` of the padding mask (``None`` when nothing is padded, so SDPA
  runs unmasked and bidirectional);
* position ids count real tokens only (``position_ids_from_attention_mask``) unless given — what Dream's
  own generation passes (``tok_idx``).

The official config (``model_type: "Dream"``) is read as a ``Qwen2Config`` (:func:`qwen2_config_from_dream`)
without running the checkpoint's code.
"""

from __future__ import annotations

import json
from pathlib import Path  # noqa: F401  (annotations)
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_rl.generation.diffusion import position_ids_from_attention_mask

#: DreamConfig fields that are Qwen2Config fields of the same meaning, with DreamConfig's defaults
#: (``configuration_dream.py``): a ``config.json`` that omits one means this value, as for the official code
DREAM_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
    "attention_dropout": 0.0, "pad_token_id": 151643, "bos_token_id": None, "eos_token_id": None,
}


def qwen2_config_from_dream(path: str | Path, **overrides: Any) -> Qwen2Config:
    """A ``Qwen2Config`` from a Dream ``config.json`` (file or folder); sliding windows are refused."""
    from lit_rl.models.llada import config_file

    file = config_file(path)
    from lit_rl.errors import ConfigError

    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{file}: cannot read the Dream config ({err})") from None
    if str(raw.get("model_type", "")).lower() not in ("dream", "qwen2"):
        raise ConfigError(f"{file}: model_type={raw.get('model_type')!r} is not Dream; "
                          "NativeDream loads Dream checkpoints only")
    if raw.get("use_sliding_window"):
        raise ConfigError(f"{file}: use_sliding_window=true is not supported by the native Dream; "
                          "use PretrainedDiffusionLM")
    if raw.get("rope_scaling"):
        raise ConfigError(f"{file}: rope_scaling={raw['rope_scaling']!r} is not supported by the native Dream; "
                          "use PretrainedDiffusionLM")
    kwargs = {k: raw.get(k, v) for k, v in DREAM_DEFAULTS.items()}
    config = Qwen2Config(**(kwargs | {"use_sliding_window": False, "use_cache": False} | overrides))
    config.mask_token_id = raw.get("mask_token_id", 151666)
    return config


class NativeDreamModel(Qwen2ForCausalLM):
    """Qwen2ForCausalLM made bidirectional (module docstring); logits ``(B, T, V)`` unshifted, as Dream's."""

    kv_architecture = "qwen2"  # the cached-decoding adapter (lit_rl.generation.kv_stack.kv_stack_for)

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__(config)
        for module in self.modules():
            if hasattr(module, "is_causal"):
                module.is_causal = False

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 on real tokens
        position_ids: torch.Tensor | None = None,  # (B, T)
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ):
        from transformers.masking_utils import create_bidirectional_mask

        if inputs_embeds is None:
            inputs_embeds = self.model.embed_tokens(input_ids)  # (B, T, d)
        if position_ids is None and attention_mask is not None:
            position_ids = position_ids_from_attention_mask(attention_mask)  # (B, T)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
        return super().forward(
            inputs_embeds=inputs_embeds, attention_mask={"full_attention": mask}, position_ids=position_ids,
            use_cache=False, **kwargs,
        )


__all__ = ["DREAM_DEFAULTS", "NativeDreamModel", "qwen2_config_from_dream"]
