"""What a run records about itself in MLflow: the resolved config as flat params, the code's git commit.

MLflow's compare view lines runs up by their parameters, so every ``fit`` logs its whole resolved config
(``model.init_args.advantages.class_path``, ``data.init_args.g_ext``, ``model.init_args.optimizer.init_args.lr``,
...) as params: dotted keys, list items by index, values as strings truncated to MLflow's limit (Lightning's
``MLFlowLogger`` keeps 250 characters, which every MLflow version accepts; a cut value ends in ``...``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["MAX_VALUE", "RUN_IDENTITY", "flatten_config", "git_state", "split_identity"]

MAX_VALUE = 250
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /:]")  # MLflow's allowed key characters


def _value(v: Any) -> str:
    s = "null" if v is None else str(v)
    return s if len(s) <= MAX_VALUE else s[: MAX_VALUE - 3] + "..."


def flatten_config(config: Any, prefix: str = "") -> dict[str, str]:
    """``{"model": {"init_args": {"lr": 0.1}}, "cbs": [{"a": 1}]}`` -> ``{"model.init_args.lr": "0.1",
    "cbs.0.a": "1"}``; empty dicts/lists become ``"{}"`` / ``"[]"``; keys keep MLflow's allowed characters."""
    out: dict[str, str] = {}
    if isinstance(config, dict) and config:
        for k, v in config.items():
            out.update(flatten_config(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(config, (list, tuple)) and config:
        for i, v in enumerate(config):
            out.update(flatten_config(v, f"{prefix}.{i}" if prefix else str(i)))
    elif prefix:
        out[_BAD_KEY_CHARS.sub("_", prefix)[:250]] = _value(
            "{}" if config == {} else "[]" if config in ([], ()) else config)
    return out


#: params that name the run rather than configure it: different in every run (every sweep trial), so MLflow's
#: compare view, which preselects the first three *differing* params in alphabetical order, would plot them
#: instead of what was varied. They are tags (``lit_rl.run.<key>``) instead, as is any value inside the run folder.
RUN_IDENTITY = ("trainer.default_root_dir", "trainer.logger.init_args.run_name", "trainer.logger.init_args.run_id")


def split_identity(flat: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``flatten_config`` output -> (params, tags): the :data:`RUN_IDENTITY` keys and every value that is a path
    inside ``trainer.default_root_dir`` (a checkpoint ``dirpath``, a predictions file) move to tags named
    ``lit_rl.run.<key>``; the rest stay params. ``{"trainer.default_root_dir": "runs/t3", "a.lr": "0.1",
    "cb.dirpath": "runs/t3/ckpt"}`` -> ``({"a.lr": "0.1"}, {"lit_rl.run.trainer.default_root_dir": "runs/t3",
    "lit_rl.run.cb.dirpath": "runs/t3/ckpt"})``."""
    folder = flat.get("trainer.default_root_dir", "null").rstrip("/")
    inside = folder not in ("", "null", ".") and not folder.endswith("...")

    def identity(k: str, v: str) -> bool:
        return k in RUN_IDENTITY or (inside and (v == folder or v.startswith(folder + "/")))

    params = {k: v for k, v in flat.items() if not identity(k, v)}
    tags = {f"lit_rl.run.{k}"[:250]: v for k, v in flat.items() if identity(k, v)}  # MLflow's key limit
    return params, tags


def git_state(path: str | Path = ".") -> dict[str, str]:
    """``{"git.commit": sha, "git.dirty": "true"|"false"}`` of the repository holding ``path``; empty when
    there is none (an installed package, no git)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path, capture_output=True,
                               text=True, timeout=10)
        return {"git.commit": sha.stdout.strip(), "git.dirty": "true" if dirty.stdout.strip() else "false"}
    except (OSError, subprocess.SubprocessError):
        return {}
