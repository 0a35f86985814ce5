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

The same rewrite makes a changed ``class_path`` start from the new class's defaults
(:func:`drop_switched_init_args`): jsonargparse would keep the earlier files' arguments that the new class accepts.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

__all__ = ["drop_switched_init_args", "expand_list_edits", "has_list_edit"]

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


def expand_list_edits(argv: Sequence[str], notes: list[str] | None = None) -> list[str]:
    """``argv`` with each ``--config FILE`` / ``--config=FILE`` that holds a list edit replaced by its expanded copy
    (see the module docstring; the edits see the ``--config`` files before them, not command-line flags), and the
    earlier files' ``init_args`` of a node whose ``class_path`` a later file changes dropped
    (:func:`drop_switched_init_args`; one line each appended to ``notes``, else printed to stderr)."""
    argv = list(argv)
    out: list[str] = []
    files: list[str] = []
    slots: list[int] = []  # where each --config's file name sits in ``out``
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
        if step == 2:
            out += ["--config", new]
            slots.append(len(out) - 1)
        else:
            out.append(f"--config={new}")
            slots.append(-(len(out)))  # negative: the "--config=" form
        i += step
    expanded = [out[k] if k >= 0 else out[-k - 1].partition("=")[2] for k in slots]
    rewritten, said = drop_switched_init_args(expanded, files)
    for k, path in zip(slots, rewritten):
        if k >= 0:
            out[k] = path
        else:
            out[-k - 1] = f"--config={path}"
    if notes is not None:
        notes.extend(said)
    else:
        import sys

        for line in said:
            print(f"note: {line}", file=sys.stderr)
    return out


def _class_nodes(data: Any, path: tuple = ()) -> dict[tuple, str]:
    """``{key path: class_path}`` of the mapping nodes (not list entries) that name a ``class_path``."""
    found: dict[tuple, str] = {}
    if isinstance(data, dict):
        if isinstance(data.get("class_path"), str):
            found[path] = data["class_path"]
        for k, v in data.items():
            if isinstance(v, dict):
                found.update(_class_nodes(v, path + (k,)))
    return found


def _node(data: Any, path: tuple) -> Any:
    for k in path:
        if not isinstance(data, dict) or k not in data:
            return None
        data = data[k]
    return data


def _accepted(class_path: str) -> set[str] | None:
    """The constructor arguments ``class_path`` takes (its ``__init__``, and its parents' where it passes
    ``**kwargs`` on); ``None`` if the class cannot be imported here."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - not importable here: jsonargparse will say so
        return None
    names: set[str] = set()
    for klass in getattr(cls, "__mro__", [cls]):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def drop_switched_init_args(paths: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """Where a ``--config`` file changes a node's ``class_path`` (``data.init_args.task`` from ``SudokuTask`` to
    ``PromptTask``), the earlier files' ``init_args`` of that node are dropped, so the new class starts from its
    own defaults plus what the changing file gives. jsonargparse keeps every earlier argument the new class also
    accepts: Sudoku's ``question_template: "{puzzle}"`` became ``PromptTask``'s, and every prompt was the literal
    text ``{puzzle}``. This is also the rule the config preflight checks by (:func:`lit_rl.config.lines._merge`).

    A node that changes the class may keep some of the earlier arguments on purpose: ``inherit: [policy,
    optimizer]`` (or ``inherit: all``) next to its ``class_path`` (lit_rl's key, removed before jsonargparse reads
    the file; ``conf/erils_sft.yaml`` keeps the base's policy and optimizer so).

    Returns the paths (a changed file replaced by a copy) and one line per switch that dropped arguments, naming
    the file and line of the new ``class_path``, the two classes and the arguments not carried over. ``names``:
    the files as the user gave them (for the lines; default ``paths``)."""
    import yaml

    from lit_rl.config.lines import INHERIT, compose_files, load_yaml_with_lines, same_class, strip_inherit
    from lit_rl.errors import ConfigError

    names = list(names or paths)
    loaded: list[tuple[Any, dict] | None] = []
    for path in paths:
        try:
            loaded.append(load_yaml_with_lines(Path(path)) if Path(path).is_file() else None)
        except ConfigError:
            loaded.append(None)  # jsonargparse (and the preflight, at its line) report it
    changed: set[int] = set()
    notes: list[str] = []
    for i, item in enumerate(loaded):
        if item is None or i == 0:
            continue
        data, where = item
        for node_path, cls in _class_nodes(data).items():
            try:
                before = compose_files([p for p, it in zip(paths[:i], loaded[:i]) if it is not None]).data
            except ConfigError:
                break
            old = _node(before, node_path)
            if not isinstance(old, dict) or not isinstance(old.get("class_path"), str):
                continue
            if same_class(old["class_path"], cls) or not isinstance(old.get("init_args"), dict):
                continue
            keep = _node(data, node_path).get(INHERIT) or []
            given = _node(data, node_path).get("init_args") or {}
            accepts = _accepted(cls)
            dropped = [k for k in old["init_args"] if k not in given and not (keep == "all" or k in keep)
                       and (accepts is None or k in accepts)]  # the others jsonargparse drops anyway
            for j in range(i):  # the earlier files lose this node's arguments (but those it inherits)
                node = _node(loaded[j][0], node_path) if loaded[j] is not None else None
                if isinstance(node, dict) and ("init_args" in node or "dict_kwargs" in node):
                    args = node.pop("init_args", None)
                    node.pop("dict_kwargs", None)
                    kept = {k: v for k, v in (args or {}).items() if keep == "all" or k in keep}
                    if kept:
                        node["init_args"] = kept
                    node["class_path"] = cls
                    changed.add(j)
            if dropped:
                at = where.get(node_path + ("class_path",), names[i])
                dotted = ".".join(str(k) for k in node_path)
                notes.append(f"{at}: {dotted}: class_path {old['class_path']} -> {cls}; the earlier config's "
                             f"init_args are not carried over: {', '.join(dropped)} (the new class's defaults "
                             f"apply; set them under the new class, or list them under {INHERIT}, to keep them)")
    for j, item in enumerate(loaded):  # the inherit keys themselves: lit_rl's, jsonargparse does not know them
        if item is not None and strip_inherit(item[0]) != item[0]:
            loaded[j] = (strip_inherit(item[0]), item[1])
            changed.add(j)
    out = list(paths)
    for j in sorted(changed):
        copy_path = _folder() / f"{len(list(_folder().iterdir()))}_{Path(names[j]).name}"
        copy_path.write_text(f"# {names[j]} without the init_args a later --config's class_path change drops; "
                             "lit_rl.config.edits\n" + yaml.safe_dump(loaded[j][0], sort_keys=False), encoding="utf-8")
        out[j] = str(copy_path)
    return out, notes
