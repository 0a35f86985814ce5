"""A real small file system for full-disk tests: a tmpfs mounted where root on Linux allows it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator


def mount_tmpfs(folder: Path, size: str) -> bool:
    """Mount a tmpfs of ``size`` (``"512k"``, ``"3m"``) on ``folder``; False where it cannot be done here."""
    folder.mkdir(parents=True, exist_ok=True)
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[bool]:
    """:func:`mount_tmpfs` for the block (whether it was mounted), unmounted after it."""
    mounted = mount_tmpfs(folder, size)
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)
