"""Where a rollout came from, and how each kind of row is treated: the one place to add a kind of row.

Rows carry their kind as a long tensor ``source (N,)`` (:class:`Source`). Everything that treats kinds
differently asks :data:`KINDS` (through :func:`rows_where` / :func:`known`) instead of testing enum values:

============  =========  ========  ==========  =====================================================================
kind          decoded    centred   counts as   meaning
============  =========  ========  ==========  =====================================================================
on_policy     yes        yes       on_policy   sampled from the current policy
external      no         no        external    from a fixed pool (another model's text): uniform masks, ``A = r``
continuation  yes        yes       on_policy   double rollout's rebuilt row: a cut trace + a continuation decoded
                                               by the policy
inpainted     yes        yes       on_policy   IGPO's row: the policy decoded it around hint chunks of a reference
                                               trace held fixed (``RolloutBatch.hint_mask``)
============  =========  ========  ==========  =====================================================================

* ``decoded``: the current policy decoded the row, so its SPG masks follow the decode's block schedule
  (:class:`~lit_rl.algorithms.surrogates.SPGSurrogate`), and masked-denoising SFT leaves it out; otherwise
  uniformly random masks (no generation confidences exist) and SFT trains on it.
* ``centred``: its advantage is centred within its group's centred rows (ERILS Eq. 9); otherwise ``A = r``.
* ``counts_as``: the metric prefix its rows are reported under (``train/<counts_as>/...``).

A new kind is one :class:`Source` value and one :data:`KINDS` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

__all__ = ["KINDS", "RowKind", "Source", "describe", "known", "metric_groups", "rows_where"]


class Source(IntEnum):
    """A rollout's origin (its treatment: :data:`KINDS`)."""

    ON_POLICY = 0
    EXTERNAL = 1
    CONTINUATION = 2
    INPAINTED = 3

    @property
    def label(self) -> str:
        """The kind's name: ``on_policy``, ``external``, ``continuation``, ``inpainted``."""
        return KINDS[self].label


@dataclass(frozen=True)
class RowKind:
    """How one kind of row is treated (module docstring)."""

    label: str
    decoded: bool
    centred: bool
    counts_as: str


KINDS: dict[Source, RowKind] = {
    Source.ON_POLICY: RowKind("on_policy", decoded=True, centred=True, counts_as="on_policy"),
    Source.EXTERNAL: RowKind("external", decoded=False, centred=False, counts_as="external"),
    Source.CONTINUATION: RowKind("continuation", decoded=True, centred=True, counts_as="on_policy"),
    Source.INPAINTED: RowKind("inpainted", decoded=True, centred=True, counts_as="on_policy"),
}


def known(source: torch.Tensor) -> torch.Tensor:
    """Rows whose ``source`` is a kind of :data:`KINDS`. Shapes: ``(N,)`` long -> ``(N,)`` bool."""
    return torch.isin(source, torch.tensor([int(s) for s in KINDS], device=source.device))


def rows_where(source: torch.Tensor, **trait: object) -> torch.Tensor:
    """Rows whose kind has every given trait, e.g. ``rows_where(source, centred=True)``.

    Shapes: ``source (N,)`` long -> ``(N,)`` bool.
    """
    ids = [int(s) for s, k in KINDS.items() if all(getattr(k, name) == v for name, v in trait.items())]
    return torch.isin(source, torch.tensor(ids, dtype=source.dtype, device=source.device))


def metric_groups() -> list[tuple[str, bool]]:
    """``[(counts_as, decoded), ...]``: the metric prefixes in the kinds' order, each with whether every kind
    reported under it was decoded by the policy (``[("on_policy", True), ("external", False)]``)."""
    names = dict.fromkeys(k.counts_as for k in KINDS.values())
    return [(n, all(k.decoded for k in KINDS.values() if k.counts_as == n)) for n in names]


def describe() -> str:
    """``0 (on_policy), 1 (external), 2 (continuation), 3 (inpainted)``: the kinds, for error messages."""
    return ", ".join(f"{int(s)} ({k.label})" for s, k in KINDS.items())
