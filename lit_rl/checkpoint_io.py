"""Durable checkpoints and RNG state: the pieces that make a killed run resumable and a resumed run exact.

* :class:`AtomicCheckpointIO` — a Lightning ``CheckpointIO`` plugin that writes every checkpoint to a
  temporary file in the target folder, ``fsync``\\ s it, renames it over the target (``os.replace``, atomic
  on POSIX) and ``fsync``\\ s the folder. A process killed during a save leaves the previous checkpoint
  intact (Lightning's default writes through an fsspec transaction whose temp file lives in ``/tmp``, so the
  final move is a copy when ``/tmp`` is another file system, and nothing is fsynced). Temp files are named
  ``.<name>.<random>.partial`` so that ``--ckpt_path last`` never picks one up. A write that fails for
  want of space or another I/O error (ENOSPC, EDQUOT, EIO, or PyTorch's "unexpected pos" from its zip writer,
  which is what a full disk looks like from ``torch.save``) raises one
  :class:`~lit_rl.errors.CheckpointError` naming the file, the error and the free space; the previous file is
  untouched. Use it with ``trainer.plugins: [lit_rl.checkpoint_io.AtomicCheckpointIO]``.
* :func:`capture_rng_state` / :func:`restore_rng_state` — python, numpy, torch (CPU and CUDA) global RNG
  states as plain tensors/ints (loadable with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_rl.atomic import atomic_write
from lit_rl.errors import CheckpointError

__all__ = ["AtomicCheckpointIO", "atomic_torch_save", "capture_rng_state", "human_bytes", "restore_rng_state",
           "write_failure"]


# ---------------------------------------------------------------------------------------------------------
# atomic checkpoint writes
# ---------------------------------------------------------------------------------------------------------
def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through :func:`atomic_write` (temp file + fsync + ``os.replace``)."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


# what torch.save's zip writer raises when the file system stops taking bytes (its own wording, no errno)
_TORCH_WRITE_ERRORS = ("unexpected pos", "PytorchStreamWriter", "inline_container", "iostream error")


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def write_failure(err: BaseException) -> str | None:
    """Why a checkpoint write failed, when it is the storage (``"No space left on device (ENOSPC)"``), from
    ``err``'s cause/context chain; ``None`` for any other error (a bug, an object that cannot be pickled)."""
    seen, e, torch_error = set(), err, None
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)})"
        if torch_error is None and isinstance(e, RuntimeError) and any(t in str(e) for t in _TORCH_WRITE_ERRORS):
            torch_error = str(e).strip().splitlines()[0]
        e = e.__cause__ or e.__context__
    return f"the write stopped short ({torch_error})" if torch_error else None


def _free_space(folder: Path) -> str:
    try:
        return f"{human_bytes(shutil.disk_usage(folder).free)} free on {folder}"
    except OSError:
        return f"free space on {folder} unknown"


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`~lightning.fabric.plugins.io.TorchCheckpointIO` with atomic, durable local writes, and one
    error line when the storage refuses one (:func:`write_failure`).

    Remote paths (``s3://`` ...) are left to Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_torch_save(checkpoint, path)
        except Exception as err:  # noqa: BLE001 - sorted by write_failure; anything else is raised as it is
            why = write_failure(err)
            if why is None:
                raise
            path = Path(path)
            kept = (f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written")
            raise CheckpointError(
                f"could not write checkpoint {path}: {why}; {_free_space(path.parent)}; {kept}; free space, then "
                "resume with --ckpt_path last") from err


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
