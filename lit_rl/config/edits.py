"""Keyed list edits for LightningCLI: an overlay changes one callback without repeating the list.

jsonargparse merges mappings key by key and replaces a list or appends to it (``callbacks+``), but it cannot change
one entry of a list: an overlay that changed one callback's arguments had to repeat the whole callback list. In
lit_rl's configs a ``key~:`` holds partial entries, each naming the entry it edits by its ``class_path``
(:func:`lit_rl.config.lines._edit_list`)::

    trainer:
      callbacks~:
        - class_path: callbacks.PassAtKEvaluation
          init_args: {subset_size: 8}

:func:`expand_list_edits` rewrites a command line before jsonargparse reads it: each ``--config`` file that holds
such a key is replaced by a temporary copy in which the edited list is written out in full, composed from the
``--config`` files before it as LightningCLI composes them (:func:`lit_rl.config.lines.compose_files`). Files
without one pass through unchanged, so jsonargparse only ever sees the dialect it knows. The preflight reads the
same key from the original file and reports a problem at its file and line.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

__all__ = ["expand_list_edits", "has_list_edit"]

_TMP: list[Path] = []  # this process's folder of expanded files, removed at exit


def has_list_edit(data: Any) -> bool:
    """Whether a config's data holds a ``key~`` anywhere."""
    if isinstance(data, dict):
        return any((isinstance(k, str) and k.endswith("~")) or has_list_edit(v) for k, v in data.items())
    if isinstance(data, list):
        return any(has_list_edit(v) for v in data)
    return False


def _folder() -> Path:
    if not _TMP:
        _TMP.append(Path(tempfile.mkdtemp(prefix="lit_rl_config_")))
        atexit.register(shutil.rmtree, _TMP[0], True)
    return _TMP[0]


def _expanded(before: Sequence[str], path: str) -> str:
    """``path``, or a copy of it with its list edits resolved against the files ``before`` it."""
    import yaml

    from lit_rl.config.lines import compose_files, load_yaml_with_lines, resolve_list_keys
    from lit_rl.errors import ConfigError

    file = Path(path)
    if not file.is_file():
        return path  # jsonargparse reports it
    try:
        data, where = load_yaml_with_lines(file)
    except ConfigError:
        return path  # not a config this can read: jsonargparse reports it (the preflight has, at its line)
    if not has_list_edit(data):
        return path
    resolved = resolve_list_keys(compose_files(before).data, data, where)
    out = _folder() / f"{len(list(_folder().iterdir()))}_{file.name}"
    out.write_text(f"# {file} with its list edits (key~) written out; lit_rl.config.edits\n"
                   + yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    return str(out)


def expand_list_edits(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--config FILE`` / ``--config=FILE`` that holds a list edit replaced by its expanded copy
    (see the module docstring); the edits see the ``--config`` files before them, not command-line flags."""
    argv = list(argv)
    out: list[str] = []
    files: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--config" and i + 1 < len(argv):
            path, step = argv[i + 1], 2
        elif tok.startswith("--config="):
            path, step = tok.partition("=")[2], 1
        else:
            out.append(tok)
            i += 1
            continue
        new = _expanded(files, path)
        files.append(path)
        out += ["--config", new] if step == 2 else [f"--config={new}"]
        i += step
    return out
