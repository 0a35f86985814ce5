"""Config files and command-line overrides read with the place of every key (``file:line`` or
``command line (--key)``), merged as LightningCLI merges them (mappings key by key, lists replaced)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from lit_rl.errors import ConfigError

__all__ = ["ConfigView", "compose_files", "fail", "load_yaml_with_lines", "parse_command_line", "resolve_list_keys"]


@dataclass
class ConfigView:
    data: dict[str, Any]
    where: dict[tuple, str]  # key path -> "file:line" or "command line (--key)"
    files: list[str] = field(default_factory=list)  # the --config files, in order

    def loc(self, path: Sequence[Any]) -> str:
        """The most specific known location of ``path`` (its own, else its nearest ancestor's)."""
        p = tuple(path)
        while p:
            if p in self.where:
                return self.where[p]
            p = p[:-1]
        return "<defaults>"

    def get(self, path: Sequence[Any], default: Any = None) -> Any:
        node: Any = self.data
        for k in path:
            if isinstance(node, dict) and k in node:
                node = node[k]
            elif isinstance(node, list) and isinstance(k, int) and 0 <= k < len(node):
                node = node[k]
            else:
                return default
        return node


def _dotted(path: Sequence[Any]) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def fail(cfg: ConfigView, path: Sequence[Any], problem: str) -> ConfigError:
    return ConfigError(f"{cfg.loc(path)}: {_dotted(path)}: {problem}")


def load_yaml_with_lines(path: Path) -> tuple[Any, dict[tuple, str]]:
    """A YAML file's data and where each key sits: ``{key path tuple: "file:line"}``; a missing file or a
    syntax error raises :class:`ConfigError` naming the file and line (the preflight and sweep configs)."""
    import yaml

    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file (--config takes a YAML file, e.g. "
                          f"{path / 'config.yaml'})")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found (--config)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        byte = raw[e.start]
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{byte:02x}); save the file as UTF-8") from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else {}
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{path}:{line}: YAML syntax error: {e.problem or e.context}") from None
    where: dict[tuple, str] = {}

    def walk(n: Any, p: tuple) -> None:
        where[p] = f"{path}:{n.start_mark.line + 1}"
        if isinstance(n, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    line = k.start_mark.line + 1
                    if k.value in seen and k.tag != "tag:yaml.org,2002:merge":  # YAML keeps the last one silently
                        raise ConfigError(f"{path}:{line}: {_dotted(p + (k.value,))}: duplicate key (first at line "
                                          f"{seen[k.value]}); the second would silently replace the first")
                    seen.setdefault(k.value, line)
                    where[p + (k.value,)] = f"{path}:{k.start_mark.line + 1}"
                    walk(v, p + (k.value,))
                    where[p + (k.value,)] = f"{path}:{k.start_mark.line + 1}"
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, p + (i,))

    if node is not None:
        walk(node, ())
    if node is None or data is None:
        raise ConfigError(f"{path}:1: the config file is empty (only comments or blank lines); give it keys or "
                          "leave out its --config")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping at the top level, got {type(data).__name__}")
    return data, where


_CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")


#: lit_rl's key in a ``class_path`` node that changes the class: the earlier ``init_args`` it keeps
INHERIT = "inherit"


def same_class(a: Any, b: Any) -> bool:
    """Two ``class_path`` values that name the same class (the full path, or the same last component)."""
    return isinstance(a, str) and isinstance(b, str) and (a == b or a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1])


def _merge(base: Any, new: Any) -> Any:
    """The merge lit_rl's command line makes (:mod:`lit_rl.config.edits` rewrites the files so that jsonargparse
    makes the same): mappings merge key by key; a changed ``class_path`` drops the old ``init_args`` except those
    its node lists under ``inherit`` (``[policy, optimizer]`` or ``all``); anything else (lists included) is
    replaced."""
    if isinstance(base, dict) and isinstance(new, dict):
        out = dict(base)
        if "class_path" in new and "class_path" in base and not same_class(new["class_path"], base["class_path"]):
            old = out.pop("init_args", None)
            keep = new.get(INHERIT)
            if isinstance(old, dict) and keep:
                kept = {k: v for k, v in old.items() if keep == "all" or k in keep}
                if kept:
                    out["init_args"] = kept
        for k, v in new.items():
            if k == INHERIT and "class_path" in new:
                continue
            out[k] = _merge(out[k], v) if k in out else strip_inherit(v)
        return out
    return strip_inherit(new)


def strip_inherit(data: Any) -> Any:
    """``data`` without the ``inherit`` keys of its ``class_path`` nodes (jsonargparse does not know them)."""
    if isinstance(data, dict):
        return {k: strip_inherit(v) for k, v in data.items() if not (k == INHERIT and "class_path" in data)}
    if isinstance(data, list):
        return [strip_inherit(v) for v in data]
    return data


def _class_matches(entry: Any, class_path: str) -> bool:
    """``entry``'s ``class_path`` is ``class_path``, or ends with it after a dot (``PassAtKEvaluation`` matches
    ``callbacks.PassAtKEvaluation`` and ``callbacks.passk.PassAtKEvaluation``)."""
    have = entry.get("class_path") if isinstance(entry, dict) else None
    if not isinstance(have, str):
        return False
    return have == class_path or have.rsplit(".", 1)[-1] == class_path.rsplit(".", 1)[-1]


def _edit_list(old: Any, items: Any, label: str, where: dict[tuple, str], path: tuple, key: str) -> list:
    """``key~: [partial entries]``: each item edits the one entry of the base list ``old`` of its class (and, if
    several share the class, of its ``init_args.name``); its keys merge into that entry (mappings key by key,
    lists replaced). ``where`` is rewritten to the edited entries' positions."""
    k = key + "~"
    if not isinstance(old, list):
        raise ConfigError(f"{where.get(path + (k,), label)}: {_dotted(path + (k,))}: edits entries of the base's "
                          f"{key} list, but no earlier config sets {_dotted(path + (key,))}")
    out = copy.deepcopy(old)
    for i, item in enumerate(items if isinstance(items, list) else [items]):
        at = where.get(path + (k, i), where.get(path + (k,), label))
        cls = item.get("class_path") if isinstance(item, dict) else None
        if not isinstance(cls, str):
            raise ConfigError(f"{at}: {_dotted(path + (k, i))}: an edit names the entry it changes by its "
                              "class_path (e.g. class_path: callbacks.PassAtKEvaluation)")
        hits = [j for j, e in enumerate(out) if _class_matches(e, cls)]
        name = (item.get("init_args") or {}).get("name") if isinstance(item.get("init_args"), dict) else None
        if len(hits) > 1 and name is not None:
            hits = [j for j in hits if ((out[j].get("init_args") or {}).get("name")) == name]
        if len(hits) != 1:
            what = "no entry" if not hits else f"{len(hits)} entries (give init_args.name to choose one)"
            raise ConfigError(f"{at}: {_dotted(path + (k, i))}: {cls} matches {what} of the base's "
                              f"{_dotted(path + (key,))}")
        j = hits[0]
        out[j] = _merge(out[j], {**item, "class_path": out[j]["class_path"]})
        for p_, w in [(p_, w) for p_, w in where.items() if p_[: len(path) + 2] == path + (k, i)]:
            del where[p_]
            where[path + (key, j) + p_[len(path) + 2:]] = w
    where.pop(path + (k,), None)
    return out


def resolve_list_keys(base: Any, new: Any, where: dict[tuple, str], path: tuple = ()) -> Any:
    """A YAML ``key+: [items]`` (jsonargparse's list append, e.g. ``trainer: {callbacks+: [...]}`` in an overlay)
    becomes ``key: base list + items``; ``where`` (file:line by path) is rewritten to the appended positions, so
    a problem in an appended item is reported at its own line. One item without a list is one item appended.

    A ``key~: [partial entries]`` (lit_rl's keyed edit, e.g. ``trainer: {callbacks~: [{class_path:
    callbacks.PassAtKEvaluation, init_args: {subset_size: 8}}]}``) becomes ``key:`` the base list with each named
    entry's arguments changed (:func:`_edit_list`), so an overlay changes one callback without repeating the list.
    A file sets a list, or edits the base's and appends to it (``key~`` and ``key+`` together: the edits apply to
    the base's entries, then the items are appended); setting it next to either is refused."""
    if not isinstance(new, dict):
        return new
    out: dict = {}
    done: set[str] = set()
    for k, v in new.items():
        if isinstance(k, str) and k.endswith(("+", "~")) and len(k) > 1:
            key = k[:-1]
            if key in done:
                continue
            done.add(key)
            if key in new:
                first = next(o for o in (key + "~", key + "+") if o in new)
                at = where.get(path + (first,), "a config file")
                raise ConfigError(f"{at}: {_dotted(path + (first,))}: the same "
                                  f"file also sets {key}: set the list, or edit and append to the base's, in one "
                                  "file each")
            old = base.get(key) if isinstance(base, dict) else None
            if key + "~" in new:
                old = _edit_list(old, new[key + "~"], "a config file", where, path, key)
                if key + "+" not in new:
                    out[key] = old
                    continue
            v = new[key + "+"]
            k = key + "+"
            items = v if isinstance(v, list) else [v]
            start = len(old) if isinstance(old, list) else 0
            moved = {p: w for p, w in where.items() if p[: len(path) + 1] == path + (k,)}
            for p, w in moved.items():
                del where[p]
                rest = p[len(path) + 1:]
                if rest and isinstance(rest[0], int) and isinstance(v, list):
                    where[path + (key, start + rest[0]) + rest[1:]] = w
                elif not rest:
                    where[path + (key,)] = w
                else:  # a single item without a list
                    where[path + (key, start) + rest] = w
            out[key] = [*(old if isinstance(old, list) else []), *items]
        else:
            sub = base.get(k) if isinstance(base, dict) else None
            out[k] = resolve_list_keys(sub, v, where, path + (k,))
    return out


def _set_override(cfg: ConfigView, dotted: str, raw: str) -> None:
    """Apply ``--a.b.c=value`` (``a.b`` of a ``class_path`` node may skip ``init_args``, as in jsonargparse)."""
    import yaml

    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    keys = dotted.split(".")
    node: Any = cfg.data
    path: tuple = ()
    for i, k in enumerate(keys):
        if not isinstance(node, dict):
            return
        if "class_path" in node and k not in _CLASS_KEYS:
            node = node.setdefault("init_args", {})
            path += ("init_args",)
        path += (k,)
        if i == len(keys) - 1:
            node[k] = _merge(node[k], value) if isinstance(node.get(k), dict) and isinstance(value, dict) else value
        else:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
    for key in [w for w in cfg.where if w[: len(path)] == path]:
        del cfg.where[key]
    cfg.where[path] = f"command line (--{dotted})"


def _add_file(cfg: ConfigView, path: str | Path) -> None:
    """Merge one ``--config`` file into ``cfg`` (its list appends and edits resolved against what ``cfg`` holds)."""
    cfg.files.append(str(path))
    data, where = load_yaml_with_lines(Path(path))
    data = resolve_list_keys(cfg.data, data, where)
    cfg.data = _merge(cfg.data, data)
    cfg.where.update(where)


def compose_files(paths: Sequence[str | Path]) -> ConfigView:
    """The config that ``--config A --config B ...`` gives, as LightningCLI composes it: mappings merge key by
    key, a list is replaced by a later file's, extended by its ``key+`` append or changed by its ``key~`` edit."""
    cfg = ConfigView({}, {})
    for path in paths:
        _add_file(cfg, path)
    return cfg


def parse_command_line(argv: Sequence[str]) -> tuple[str | None, ConfigView] | None:
    """``(subcommand, merged config)`` of a LightningCLI command line, or ``None`` if it is not one this
    preflight understands (``--help``, ``--print_config``, list appends ...): the CLI then checks alone."""
    argv = list(argv)
    sub = argv[0] if argv and not argv[0].startswith("-") else None
    rest = argv[1:] if sub else argv
    cfg = ConfigView({}, {})
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            return None
        if tok in ("--help", "-h") or tok.startswith(("--print_config", "--print-config")) or "+=" in tok:
            return None
        key, eq, val = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(rest):
                return None
            val = rest[i + 1]
            i += 1
        i += 1
        if key == "config":
            _add_file(cfg, val)
        else:
            _set_override(cfg, key, val)
    return sub, cfg
