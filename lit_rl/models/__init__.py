"""Policies: masked diffusion LMs (tiny offline and LLaDA-style) with optional LoRA / 4-bit."""

from lit_rl.models.policy import (
    DiffusionPolicy,
    LoraSettings,
    PretrainedDiffusionLM,
    QuantizationSettings,
    TinyDiffusionLM,
)
from lit_rl.models.tokenizer import build_char_tokenizer

__all__ = [
    "DiffusionPolicy",
    "LoraSettings",
    "PretrainedDiffusionLM",
    "QuantizationSettings",
    "TinyDiffusionLM",
    "build_char_tokenizer",
]
