"""Policies on lit_rl's native implementations of official dLLM checkpoints (no remote code runs).

:class:`NativeLLaDA` (:mod:`lit_rl.models.llada`) and :class:`NativeDream` (:mod:`lit_rl.models.dream`) load
the official weights by their names from the official ``config.json``, with a real padding mask and
position ids that ignore left padding; 4-bit NF4, LoRA, gradient checkpointing and ``device`` are
:class:`~lit_rl.models.policy.PretrainedDiffusionLM`'s. The remote-code class stays for other dLLMs.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_rl.models.policy import LoraSettings, PretrainedDiffusionLM, QuantizationSettings


def load_strict(cls: type, path: str, config: Any, attn_implementation: str, kwargs: dict[str, Any]) -> nn.Module:
    """``cls.from_pretrained`` that refuses a checkpoint whose weight names do not match the architecture
    (transformers only warns, and would leave the missing weights randomly initialised)."""
    from lit_rl.errors import ConfigError

    model, info = cls.from_pretrained(
        path, config=config, attn_implementation=attn_implementation, output_loading_info=True, **kwargs
    )
    missing, unexpected = sorted(info.get("missing_keys") or []), sorted(info.get("unexpected_keys") or [])
    if missing or unexpected:
        raise ConfigError(
            f"policy.path {path}: the checkpoint's weights do not match {cls.__name__}: missing {missing[:4]} "
            f"({len(missing)}), unexpected {unexpected[:4]} ({len(unexpected)})"
        )
    return model


class NativeLLaDA(PretrainedDiffusionLM):
    """LLaDA-8B-Instruct (or a compatible checkpoint) on lit_rl's native implementation.

    Loads the official weights by their names (:class:`lit_rl.models.llada.NativeLLaDAModel`: transformers'
    Llama layers, bidirectional attention with a real padding mask, position ids that ignore left padding),
    reading the official ``config.json`` without running the checkpoint's code. Everything else —
    4-bit NF4, LoRA (the official module names), gradient checkpointing, ``device`` — is
    :class:`PretrainedDiffusionLM`'s. ``mask_id: null`` reads ``config.json``'s ``mask_token_id``.
    Args as :class:`PretrainedDiffusionLM` (``trust_remote_code`` and ``logits_shift`` are fixed: no and no).
    """

    supports_kv_cache = True  # lit_rl's own layers: the KV-cached decode runs (docs/decoding.md)

    def __init__(
        self,
        path: str,
        mask_id: int | None = None,
        eos_id: int | None = 126081,
        pad_id: int | None = None,
        dtype: str = "bfloat16",
        quantization: QuantizationSettings | None = None,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        init_checkpoint: str | None = None,
        device: str | None = None,
        attn_implementation: str = "sdpa",
    ) -> None:
        self.attn_implementation = attn_implementation
        super().__init__(
            path, mask_id=mask_id, eos_id=eos_id, pad_id=pad_id, dtype=dtype, trust_remote_code=False,
            logits_shift=False, quantization=quantization, lora=lora, gradient_checkpointing=gradient_checkpointing,
            init_checkpoint=init_checkpoint, device=device,
        )

    def load_model(self, path: str, *, trust_remote_code: bool, **kwargs: Any) -> nn.Module:
        from lit_rl.models.llada import NativeLLaDAConfig, NativeLLaDAModel

        config = NativeLLaDAConfig.from_llada_json(path)
        return load_strict(NativeLLaDAModel, path, config, self.attn_implementation, kwargs)


class NativeDream(PretrainedDiffusionLM):
    """Dream-v0-Instruct-7B (or a compatible checkpoint) on transformers' Qwen2, made bidirectional.

    :class:`lit_rl.models.dream.NativeDreamModel`; logits are shifted one position (Dream predicts token ``t``
    at ``t - 1``). ``mask_id: null`` reads the tokenizer's mask token, else ``config.json``'s
    ``mask_token_id`` (Dream: 151666). Args as :class:`NativeLLaDA`.
    """

    supports_kv_cache = True  # transformers' Qwen2 layers: the KV-cached decode runs (docs/decoding.md)

    def __init__(
        self,
        path: str,
        mask_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        dtype: str = "bfloat16",
        quantization: QuantizationSettings | None = None,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        init_checkpoint: str | None = None,
        device: str | None = None,
        attn_implementation: str = "sdpa",
    ) -> None:
        self.attn_implementation = attn_implementation
        super().__init__(
            path, mask_id=mask_id, eos_id=eos_id, pad_id=pad_id, dtype=dtype, trust_remote_code=False,
            logits_shift=True, quantization=quantization, lora=lora, gradient_checkpointing=gradient_checkpointing,
            init_checkpoint=init_checkpoint, device=device,
        )

    def load_model(self, path: str, *, trust_remote_code: bool, **kwargs: Any) -> nn.Module:
        from lit_rl.models.dream import NativeDreamModel, qwen2_config_from_dream

        config = qwen2_config_from_dream(path)
        return load_strict(NativeDreamModel, path, config, self.attn_implementation, kwargs)
