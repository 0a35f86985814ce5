"""A ``fit`` into a run folder that already holds a run: refused, unless it resumes or says to start over.

Rerunning a command used to write a second run's checkpoints beside the first's (``runs/erils/checkpoints`` held
``step=300``, ``step=180`` and ``step=120`` files of three runs) and ``--ckpt_path last`` then picked whichever
was newest. Now a ``fit`` without ``--ckpt_path`` whose checkpoint folder holds checkpoints stops before
anything is built (:func:`check_rerun`, the config preflight) with one line naming the folder, its newest
checkpoint and the two ways on:

* ``--ckpt_path last`` resumes that run;
* ``--overwrite true`` starts over: the old checkpoints and the folder's MLflow record are removed first
  (:func:`clear_run`), the run's other files are rewritten by the new run.

``reproduce`` resumes its unfinished jobs with ``--ckpt_path last`` and clears a job whose command line changed;
``sweep`` trials have folders of their own.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

__all__ = ["OVERWRITE_HELP", "check_rerun", "checkpoint_folders", "clear_run"]

OVERWRITE_HELP = ("start over in a run folder that holds an earlier run's checkpoints (they are removed first); "
                  "without it such a fit is refused, and --ckpt_path last resumes it")


def checkpoint_folders(root: str | os.PathLike, callbacks: Any) -> list[Path]:
    """The folders a fit's checkpoints go to, from a config's ``trainer.default_root_dir`` and callback list:
    each ``ModelCheckpoint``'s ``dirpath``, else ``<root>/checkpoints``
    (:func:`lit_rl.lightning_cli.resolve_checkpoint_dirs` decides the same when the trainer is built)."""
    dirs = []
    for cb in callbacks if isinstance(callbacks, list) else []:
        if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("ModelCheckpoint"):
            dirpath = (cb.get("init_args") or {}).get("dirpath")
            dirs.append(Path(dirpath) if isinstance(dirpath, str) and dirpath else Path(root) / "checkpoints")
    return list(dict.fromkeys(dirs or [Path(root) / "checkpoints"]))


def _found(dirs: Sequence[Path]) -> list[Path]:
    out = []
    for d in dirs:
        if d.is_dir():
            out += [p for p in d.glob("*.ckpt") if p.is_file() and not p.name.startswith(".")]
    return sorted(out, key=lambda p: p.stat().st_mtime, reverse=True)


def check_rerun(root: str | os.PathLike, callbacks: Any, ckpt_path: Any, overwrite: bool) -> str | None:
    """The refusal line for a fit into a folder with checkpoints (``None``: nothing there, it resumes, or it
    starts over on purpose)."""
    if ckpt_path or overwrite:
        return None
    found = _found(checkpoint_folders(root, callbacks))
    if not found:
        return None
    newest = found[0]
    when = datetime.fromtimestamp(newest.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    return (f"{newest.parent} already holds {len(found)} checkpoint(s) of an earlier run (newest {newest.name}, "
            f"{when}): --ckpt_path last resumes it; --overwrite true starts over (removes them first); or choose "
            "another trainer.default_root_dir")


def clear_run(dirs: Sequence[Path], folder: Path) -> list[str]:
    """Remove the checkpoints in ``dirs`` and ``folder``'s MLflow record (``--overwrite true``); returns the names."""
    from lit_rl.run_owner import FILE

    gone = []
    for p in _found(dirs):
        p.unlink(missing_ok=True)
        gone.append(p.name)
    record = folder / FILE
    if record.is_file():
        record.unlink()
        gone.append(record.name)
    return gone
