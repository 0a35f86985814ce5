"""Loading helpers for pretrained dLLMs: LoRA head exclusion and activation checkpointing across architectures."""

from __future__ import annotations

from torch import nn


def is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ in ("Linear4bit", "Linear8bitLt")


def lora_excluded_modules(model: nn.Module) -> list[str]:
    """Full names of the LM head: ``get_output_embeddings()``, or (when the model does not say) every Linear
    whose output size is the vocabulary size."""
    head = None
    if hasattr(model, "get_output_embeddings"):
        try:
            head = model.get_output_embeddings()
        except (NotImplementedError, AttributeError):
            head = None
    if head is not None:
        return [n for n, m in model.named_modules() if m is head and is_linear(m)]
    config = getattr(model, "config", None)
    vocab = {v for v in (getattr(config, "vocab_size", None), getattr(config, "embedding_size", None)) if v}
    return [n for n, m in model.named_modules() if is_linear(m) and getattr(m, "out_features", None) in vocab]


def enable_activation_checkpointing(model: nn.Module) -> str:
    """Turn on activation checkpointing for an HF model or a LLaDA/OLMo-style remote-code model.

    LLaDA's ``LLaDAModelLM`` does not declare HF's ``supports_gradient_checkpointing`` (so
    ``gradient_checkpointing_enable()`` raises); it checkpoints through its inner model's
    ``set_activation_checkpointing(strategy)``. Returns which mechanism was used.
    """
    import sys

    if getattr(model, "supports_gradient_checkpointing", False):
        if hasattr(model, "activation_checkpointing_enable"):  # transformers' name since 5.2x (the old one warns)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "hf"
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "set_activation_checkpointing"):
        enum = getattr(sys.modules.get(type(inner).__module__), "ActivationCheckpointingStrategy", None)
        inner.set_activation_checkpointing(enum.whole_layer if enum is not None else "whole_layer")
        return "whole_layer"
    raise ValueError(
        f"policy.gradient_checkpointing: {type(model).__name__} supports neither HF gradient checkpointing nor "
        "set_activation_checkpointing(); set gradient_checkpointing: false"
    )
