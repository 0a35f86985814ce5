"""Where a rollout came from: the one source enum of lit_rl (stored as a long tensor ``source (N,)``)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Source"]


class Source(IntEnum):
    """A rollout's origin. ``ON_POLICY``: sampled from the current policy; ``EXTERNAL``: from a fixed pool
    (another policy); ``CONTINUATION``: a row rebuilt from an existing rollout's prefix and a sampled
    continuation (double rollout's replacement)."""

    ON_POLICY = 0
    EXTERNAL = 1
    CONTINUATION = 2

    @property
    def label(self) -> str:
        """The metric prefix: ``on_policy``, ``external``, ``continuation``."""
        return {0: "on_policy", 1: "external", 2: "continuation"}[int(self)]
