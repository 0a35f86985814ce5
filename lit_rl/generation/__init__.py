"""Decoding: masked-diffusion (dLLM) generation; AR backends live next to it."""

from lit_rl.generation.ar import ARBackend, HFBackend, VLLMBackend, hit_budget
from lit_rl.generation.diffusion import (
    ModelFn,
    diffusion_generate,
    hf_model_fn,
    num_transfer_tokens,
    position_ids_from_attention_mask,
)
from lit_rl.generation.engine import DiffusionEngine, Engine

__all__ = [
    "ARBackend",
    "DiffusionEngine",
    "Engine",
    "HFBackend",
    "VLLMBackend",
    "hit_budget",
    "ModelFn",
    "diffusion_generate",
    "hf_model_fn",
    "num_transfer_tokens",
    "position_ids_from_attention_mask",
]
