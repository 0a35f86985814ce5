"""Decoding settings shared by training rollouts, evaluation and the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeSettings:
    """Semi-autoregressive dLLM decoding (docs/decoding.md).

    Attributes:
        gen_length: completion tokens generated (L_gen; paper 256).
        block_length: semi-autoregressive block size (paper 32); ``gen_length`` must be a multiple.
        steps: denoising steps in all (paper L_gen/2 = 128); must be a multiple of the number of blocks.
        temperature: Gumbel temperature; 0 is deterministic argmax decoding.
        cache: ``"none"`` (the exact algorithm: the whole sequence runs at every step), ``"prefix"`` (the
            prompt and finished blocks' keys/values are cached, refreshed once per block) or ``"dual"`` (the
            masked suffix's too: only the block runs); :mod:`lit_rl.generation.cached`. Cached rollouts come
            from a slightly different sampler than the one the surrogate scores (docs/decoding.md).
        refresh_every: with a cache, refresh it every this many steps inside a block (``null``: at each
            block start only; ``1``: every step, i.e. exact).
        threshold: confidence-threshold parallel decoding: reveal every masked position of the block whose
            confidence is at least this (at least one per step, rows progress independently; ``steps`` is
            then unused); ``null`` keeps the fixed schedule of ``steps``.
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 1.0
    cache: str = "none"
    refresh_every: int | None = None
    threshold: float | None = None

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
        if self.cache not in ("none", "prefix", "dual"):
            raise ValueError(f"generation.cache must be 'none', 'prefix' or 'dual', got {self.cache!r}")
        if self.refresh_every is not None and self.refresh_every < 1:
            raise ValueError(f"generation.refresh_every must be >= 1 or null, got {self.refresh_every}")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"generation.threshold must be in (0, 1] or null, got {self.threshold}")

    @property
    def exact(self) -> bool:
        """Whether these settings run the exact reference decoder (no cache, fixed schedule)."""
        return self.cache == "none" and self.threshold is None
