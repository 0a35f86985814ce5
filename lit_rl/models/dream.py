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

#: DreamConfig fields that are Qwen2Config fields of the same meaning
DREAM_FIELDS = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads hidden_act "
    "max_position_embeddings rms_norm_eps rope_theta tie_word_embeddings attention_dropout initializer_range "
    "pad_token_id bos_token_id eos_token_id"
).split()


def qwen2_config_from_dream(path: str | Path, **overrides: Any) -> Qwen2Config:
    """A ``Qwen2Config`` from a Dream ``config.json`` (file or folder); sliding windows are refused."""
    from lit_rl.models.llada import config_file

    file = config_file(path)
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: cannot read the Dream config ({err})") from None
    if raw.get("use_sliding_window"):
        raise ValueError(f"{file}: use_sliding_window=true is not supported by the native Dream; use PretrainedDiffusionLM")
    if raw.get("rope_scaling"):
        raise ValueError(f"{file}: rope_scaling={raw['rope_scaling']!r} is not supported by the native Dream; use PretrainedDiffusionLM")
    kwargs = {k: raw[k] for k in DREAM_FIELDS if k in raw and raw[k] is not None}
    config = Qwen2Config(**(kwargs | {"use_sliding_window": False, "use_cache": False} | overrides))
    config.mask_token_id = raw.get("mask_token_id")
    return config


class NativeDreamModel(Qwen2ForCausalLM):
    """Qwen2ForCausalLM made bidirectional (module docstring); logits ``(B, T, V)`` unshifted, as Dream's."""

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


__all__ = ["DREAM_FIELDS", "NativeDreamModel", "qwen2_config_from_dream"]
