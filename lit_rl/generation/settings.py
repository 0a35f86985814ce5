"""Decoding settings shared by training rollouts, evaluation and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from lit_rl.errors import FieldError


def check_block_multiple(gen_length: int, block_length: int, field: str = "gen_length", whose: str = "") -> None:
    """The one rule for blocks: ``L_gen`` is a multiple of the block length (the decoder's, in
    :class:`DecodeSettings`; the SPG surrogate's masking blocks against the training decode's ``L_gen``, which SPG
    asserts too). ``whose`` names the block length's owner in the message (e.g. ``"the surrogate's "``)."""
    if gen_length % block_length:
        raise FieldError(field, f"L_gen = {gen_length} is not a multiple of {whose}block_length = {block_length}")


THRESHOLD_FLOORS = ("one", "schedule")


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
        threshold_floor: the least a threshold step reveals: ``"one"`` (Fast-dLLM's rule: the most confident
            position; a block can then take up to ``block_length`` steps, more than the fixed schedule) or
            ``"schedule"`` (the fixed schedule's count for that step, so a row never needs more forward
            passes than ``steps``, and fewer where the model is sure).
    """

    gen_length: int = 256
    block_length: int = 32
    steps: int = 128
    temperature: float = 1.0
    cache: str = "none"
    refresh_every: int | None = None
    threshold: float | None = None
    threshold_floor: str = "one"

    def __post_init__(self) -> None:
        # FieldError: the config preflight reports each at its key's file:line (lit_rl.config.preflight)
        for name in ("gen_length", "block_length", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise FieldError(name, f"must be a positive integer, got {value!r}")
        L, B, S = self.gen_length, self.block_length, self.steps
        check_block_multiple(L, B)
        if S % (L // B):
            raise FieldError(
                "steps", f"steps = {S} is not divisible by the number of blocks L_gen/block_length = {L}/{B} = {L // B}"
            )
        if not self.temperature >= 0:
            raise FieldError("temperature", f"must be >= 0, got {self.temperature}")
        if self.cache not in ("none", "prefix", "dual"):
            raise FieldError("cache", f"must be 'none', 'prefix' or 'dual', got {self.cache!r}")
        r = self.refresh_every
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise FieldError("refresh_every", f"must be a positive integer or null, got {r!r}")
        th = self.threshold
        if th is not None and (isinstance(th, bool) or not isinstance(th, (int, float)) or not 0.0 < th <= 1.0):
            raise FieldError("threshold", f"must be in (0, 1] or null, got {th!r}")
        if self.threshold_floor not in THRESHOLD_FLOORS:
            raise FieldError("threshold_floor", f"must be one of {THRESHOLD_FLOORS}, got {self.threshold_floor!r}")

    @property
    def exact(self) -> bool:
        """Whether these settings run the exact reference decoder (no cache, fixed schedule)."""
        return self.cache == "none" and self.threshold is None
