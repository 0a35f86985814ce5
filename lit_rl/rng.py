"""One rule for every random draw in lit_rl.

CUDA refuses a draw whose generator lives on another device than its output ("Expected a 'cuda' device
type for generator but found 'cpu'"), and CPU and CUDA generators give different streams for one seed.
So every draw in the package goes through the functions below (a test walks the source and finds no
``generator=`` draw anywhere else), which follow one rule:

* **draw where the generator lives, then move**: ``uniform(shape, generator=g, device=d)`` draws on
  ``g.device`` and returns ``.to(d)`` (without a generator it draws from ``d``'s global stream). Masks and other
  small draws use CPU generators (:func:`cpu_generator`), so the same seed gives the same masks on CPU and
  GPU and a run resumed on another device draws the same.
* **large noise tensors** (Gumbel noise over the vocabulary: ``(N, V)`` float64 is ~0.8 GB per decoding
  step at LLaDA's 126k vocabulary) would be slow to draw on CPU and copy: callers that draw such tensors
  pass a generator on the output's device, :func:`device_generator`, seeded by :func:`derive_seed`. Its stream is
  device-specific (CPU and CUDA differ): exact repeatability holds per device type. ``benchmarks/sampler_noise.py``
  measures both options.

Per-row streams: :class:`RowStreams` holds one CPU generator per row of a batch; a :func:`uniform` draw over the
batch (``row_dim`` names the rows' axis) takes row ``i``'s slice from generator ``i``, exactly the numbers a draw
of that row alone would give, so each row's randomness does not depend on which rows share its batch, while the
arithmetic after the draw runs over the whole batch at once.

Seeds: :func:`derive_seed` hashes ``(base, *parts)`` (e.g. ``(seed, rank, step, row)``) into an independent
63-bit seed, so DDP ranks, steps and rollouts never share a stream and a resumed run re-derives the same.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

import torch

__all__ = [
    "RowStreams",
    "Stream",
    "derive_seed",
    "seed_for",
    "cpu_generator",
    "device_generator",
    "uniform",
    "exponential",
    "randint",
]

_MASK63 = (1 << 63) - 1


def derive_seed(base: int, *parts: int) -> int:
    """An independent 63-bit seed for ``(base, *parts)``, e.g. ``derive_seed(seed, rank, step, row)``.

    blake2b of the integers (each taken mod 2**64, little-endian), so nearby tuples give unrelated seeds (a
    linear formula such as ``seed * a + step * b`` repeats across ``(seed, step)`` pairs) and the result is
    the same on every machine and Python version.
    """
    data = struct.pack(f"<{1 + len(parts)}Q", *(int(v) % 2**64 for v in (base, *parts)))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK63


class Stream:
    """What a seed is for (the first part of :func:`seed_for`), so two uses never share a stream."""

    GENERATION = 0  #: training rollouts (on-policy decoding / AR sampling), per batch
    EVAL = 1  #: evaluation decoding in the rollout DataModules
    MASKS = 2  #: the surrogate's noise masks, per rollout and optimizer update
    CONTINUATION = 3  #: double-rollout continuations and the random replacement rule, per batch
    INPAINT = 4  #: inpainting hints (chunks, shown share) and the inpainted rows' decoding, per batch


def seed_for(base: int, stream: int, *, rank: int = 0, step: int = 0, row: int = 0) -> int:
    """The seed of one random stream: ``derive_seed(base, stream, rank, step, row)``.

    The one formula for the run's randomness: ``stream`` is a :class:`Stream`, ``rank`` the DDP global
    rank (TRL seeds each process separately; ranks must not draw the same rollouts or masks), ``step`` the
    rollout batch or optimizer update, ``row`` the rollout within it. Everything is a function of values a
    checkpoint restores, so a resumed run draws the same.
    """
    return derive_seed(base, stream, rank, step, row)


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (masks and other small draws)."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def device_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``, for large noise tensors drawn where they are used."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


class RowStreams:
    """One CPU generator per row of a batch (see the module docstring).

    ``draw(shape, row_dim, dtype)`` returns ``torch.cat`` over rows of each generator's own ``torch.rand`` of
    ``shape`` with ``shape[row_dim] = 1``: bitwise what ``B`` separate one-row draws give, in one tensor.
    """

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)
        if not self.generators:
            raise ValueError("RowStreams needs at least one generator (one per row)")

    @classmethod
    def from_seeds(cls, seeds: Sequence[int]) -> "RowStreams":
        """Row ``i`` draws from :func:`cpu_generator` ``(seeds[i])``."""
        return cls([cpu_generator(s) for s in seeds])

    def draw(self, shape: Sequence[int], row_dim: int, dtype: torch.dtype) -> torch.Tensor:
        """``U[0, 1)`` of ``shape`` with row ``i`` of axis ``row_dim`` from generator ``i`` (on CPU)."""
        one = list(shape)
        if one[row_dim] != len(self.generators):
            raise ValueError(f"a draw of shape {tuple(shape)} has {one[row_dim]} rows on axis {row_dim}, but the "
                             f"streams hold {len(self.generators)} generators (one per row)")
        one[row_dim] = 1
        return torch.cat([torch.rand(one, generator=g, dtype=dtype) for g in self.generators], dim=row_dim)


def _source_device(generator: torch.Generator | None, device: torch.device | str | None) -> torch.device:
    if generator is not None:
        return generator.device
    return torch.device("cpu") if device is None else torch.device(device)


def uniform(
    shape: Sequence[int],
    *,
    generator: torch.Generator | RowStreams | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    row_dim: int | None = None,
) -> torch.Tensor:
    """``U[0, 1)`` draws of ``shape``, drawn on the generator's device and moved to ``device`` (no generator:
    the output device's global stream, nothing copied). With :class:`RowStreams`, ``row_dim`` is the axis of
    the rows: row ``i`` comes from the ``i``-th generator."""
    if isinstance(generator, RowStreams):
        if row_dim is None:
            raise ValueError("a draw from RowStreams needs row_dim (the axis of the rows)")
        out = generator.draw(shape, row_dim, dtype)
        return out if device is None else out.to(device)
    out = torch.rand(tuple(shape), generator=generator, dtype=dtype, device=_source_device(generator, device))
    return out if device is None else out.to(device)


def exponential(
    shape: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``Exp(1)`` draws of ``shape`` (the Gumbel-max / exponential-race trick), same rule as :func:`uniform`."""
    out = torch.empty(tuple(shape), dtype=dtype,
                      device=_source_device(generator, device)).exponential_(generator=generator)
    return out if device is None else out.to(device)


def randint(
    low: int,
    high: int,
    shape: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Integers in ``[low, high)`` of ``shape`` (long), same rule as :func:`uniform`."""
    out = torch.randint(low, high, tuple(shape), generator=generator, device=_source_device(generator, device))
    return out if device is None else out.to(device)
