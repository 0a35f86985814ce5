"""Durable checkpoints and RNG state: the pieces that make a killed run resumable and a resumed run exact.

* :class:`AtomicCheckpointIO` — a Lightning ``CheckpointIO`` plugin that writes every checkpoint to a
  temporary file in the target folder, ``fsync``\\ s it, renames it over the target (``os.replace``, atomic
  on POSIX) and ``fsync``\\ s the folder. A process killed during a save leaves the previous checkpoint
  intact (Lightning's default writes through an fsspec transaction whose temp file lives in ``/tmp``, so the
  final move is a copy when ``/tmp`` is another file system, and nothing is fsynced). Temp files are named
  ``.<name>.<random>.partial`` so that ``--ckpt_path last`` never picks one up. Use it with
  ``trainer.plugins: [lit_rl.reliability.AtomicCheckpointIO]``.
* :func:`capture_rng_state` / :func:`restore_rng_state` — python, numpy, torch (CPU and CUDA) global RNG
  states as plain tensors/ints (loadable with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_rl.atomic import atomic_write

__all__ = ["AtomicCheckpointIO", "atomic_torch_save", "capture_rng_state", "restore_rng_state"]


# ---------------------------------------------------------------------------------------------------------
# atomic checkpoint writes
# ---------------------------------------------------------------------------------------------------------
def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through :func:`atomic_write` (temp file + fsync + ``os.replace``)."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`~lightning.fabric.plugins.io.TorchCheckpointIO` with atomic, durable local writes.

    Remote paths (``s3://`` ...) are left to Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)


# ---------------------------------------------------------------------------------------------------------
# RNG states
# ---------------------------------------------------------------------------------------------------------
def capture_rng_state() -> dict[str, Any]:
    """Global RNG states of python, numpy, torch CPU and CUDA (plain tensors, ints and tuples only)."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (missing entries are left alone)."""
    import numpy as np

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        n = state["numpy"]
        keys = (n["keys"].numpy().astype("uint32") if isinstance(n["keys"], torch.Tensor)
                else np.asarray(n["keys"], dtype="uint32"))
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
