"""Atomic file writes: a temp file in the target's folder, fsync, ``os.replace``, folder fsync.

A reader (or a crash) sees either the old file or the complete new one, never a half-written file. Used for
every final artifact lit_rl writes (checkpoints through :func:`lit_rl.checkpoint_io.atomic_torch_save`,
reports, tables, figures). Standard library only, so light modules can import it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

__all__ = ["atomic_savefig", "atomic_write", "atomic_write_text", "current_umask"]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere
    set and restored at once (``os.umask`` has no read-only form)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """What ``open(path, "w")`` would leave: an existing file keeps its mode, a new one gets
    ``0o666 & ~umask`` (``tempfile.mkstemp`` makes every file ``0o600``)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~current_umask()


def _writer_alive(temp: Path, name: str) -> bool:
    """Whether the process that writes ``temp`` (``.<name>.<pid>.<random>.partial``) still runs on this host (a
    name without a pid, from before temp names had one, is stale)."""
    pid = temp.name[len(name) + 2:].split(".", 1)[0]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False  # this process's own leftover (an earlier write that was killed mid-way cannot be running)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any], mode: int | None = None) -> Path:
    """Run ``write(fh)`` on a temp file in ``path``'s folder, fsync it, ``os.replace`` it over ``path``,
    fsync the folder. Returns ``path``.

    The target is either the old file or the complete new one, whatever happens to the process (an
    exception in ``write`` leaves no temp file). A stale temp file of a killed writer
    (``.<name>.<pid>.*.partial``) is removed by the next write of the same target; one whose process still runs is
    another writer's in-flight file and is left alone (two runs that fill one cache at once: the last replace
    wins). The file's permissions are those ``open()`` would give it (:func:`_mode_for`), or ``mode`` (e.g.
    ``0o600`` for a file that may hold credentials).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        if not _writer_alive(stale, path.name):
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".partial", dir=path.parent)
    try:
        os.fchmod(fd, _mode_for(path) if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """:func:`atomic_write` of UTF-8 ``text``."""
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")), mode)


def atomic_savefig(fig: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)`` through :func:`atomic_write` (format from the suffix)."""
    path = Path(path)
    return atomic_write(path, lambda fh: fig.savefig(fh, format=path.suffix.lstrip(".") or "png", **kwargs))
