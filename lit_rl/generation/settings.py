"""Decoding settings shared by training rollouts, evaluation and the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeSettings:
    """Semi-autoregressive dLLM decoding (ALGORITHMS.md §1).

    Attributes:
        gen_length: completion tokens generated (L_gen; paper 256).
        block_length: semi-autoregressive block size (paper 32); ``gen_length`` must be a multiple.
        steps: denoising steps in all (paper L_gen/2 = 128); must be a multiple of the number of blocks.
        temperature: Gumbel temperature; 0 is deterministic argmax decoding.
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.gen_length <= 0 or self.block_length <= 0 or self.steps <= 0:
            raise ValueError(f"generation: gen_length, block_length and steps must be positive, got {self}")
        if self.gen_length % self.block_length:
            raise ValueError(
                f"generation.gen_length ({self.gen_length}) must be a multiple of generation.block_length ({self.block_length})"
            )
        blocks = self.gen_length // self.block_length
        if self.steps % blocks:
            raise ValueError(
                f"generation.steps ({self.steps}) must be divisible by the number of blocks "
                f"(gen_length/block_length = {blocks})"
            )
        if self.temperature < 0:
            raise ValueError(f"generation.temperature must be >= 0, got {self.temperature}")
