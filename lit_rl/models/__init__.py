"""Policies: masked diffusion LMs and causal LMs (tiny offline and pretrained) with optional LoRA / 4-bit."""

from lit_rl.models.ar import CausalPolicy, PretrainedCausalLM, SamplingSettings, TinyCausalLM
from lit_rl.models.policy import (
    DiffusionPolicy,
    LoraSettings,
    PretrainedDiffusionLM,
    QuantizationSettings,
    TinyDiffusionLM,
)
from lit_rl.models.native import NativeDream, NativeLLaDA
from lit_rl.models.tokenizer import build_char_tokenizer

__all__ = [
    "CausalPolicy",
    "PretrainedCausalLM",
    "TinyCausalLM",
    "DiffusionPolicy",
    "LoraSettings",
    "NativeDream",
    "NativeLLaDA",
    "PretrainedDiffusionLM",
    "QuantizationSettings",
    "SamplingSettings",
    "TinyDiffusionLM",
    "build_char_tokenizer",
]
