"""Do the configs still mean what they meant? Every training config under ``conf/`` resolved (with the base its usage
line names, as ``python -m lit_rl fit`` would) in this checkout and at a git ref, compared value by value.

    python scripts/config_meaning.py --ref main

A refactor of ``conf/`` (a block moved into a base, an overlay that now sets one key of the base's logger instead
of repeating it) must leave every resolved config equal. Class paths are compared by the object they name, so a
moved path with a deprecation stub (``lit_rl.reliability.AtomicCheckpointIO`` ->
``lit_rl.checkpoint_io.AtomicCheckpointIO``) is the same value. Prints one line per config that differs (the first
differing keys) and a JSON line last; exits 1 if any config differs or exists on one side only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import warnings
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "tests"))  # tests/support, which tests/conftest.py imports


def _tests_conftest():
    """``tests/conftest.py`` (``overlay_bases``: the configs an overlay's usage line puts under it;
    ``training_parser``: the ``fit`` parser), loaded by path: under pytest, ``conftest`` in ``sys.modules`` may be
    another folder's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lit_rl_tests_root_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _canonical(value: Any) -> Any:
    """The config as plain data, each ``class_path`` replaced by the module and name of the object it imports."""
    from jsonargparse.typing import import_object

    if isinstance(value, dict):
        out = {k: _canonical(v) for k, v in value.items()}
        cp = out.get("class_path")
        if isinstance(cp, str):
            try:
                with warnings.catch_warnings():  # a moved path's stub warns
                    warnings.simplefilter("ignore")
                    obj = import_object(cp)
                out["class_path"] = f"{obj.__module__}.{obj.__qualname__}"
            except Exception:  # noqa: BLE001  (kept as written: the parse would have failed on it)
                pass
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def resolve_all(root: Path) -> dict[str, Any]:
    """``conf/... path -> resolved config`` for every training config under ``root/conf`` (paths relative to root)."""
    import os

    import yaml

    conftest = _tests_conftest()
    from lit_rl.config.edits import expand_list_edits  # this checkout's (a --ref's configs have no edits to expand)

    out: dict[str, Any] = {}
    here = os.getcwd()
    os.chdir(root)
    try:
        for path in sorted((root / "conf").rglob("*.yaml")):
            raw = yaml.safe_load(path.read_text()) or {}
            if not {"model", "data", "trainer"} & raw.keys():
                continue  # sweeps, pool builds and callback fragments have their own dialects
            rel = path.relative_to(root).as_posix()
            argv = [*(a for base in conftest.overlay_bases(path) for a in ("--config", base)), "--config", rel]
            argv = expand_list_edits(argv)  # an overlay's callbacks~ edits, as `python -m lit_rl fit` expands them
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resolved = conftest.training_parser().parse_args(argv).as_dict()
            resolved.pop("config", None)  # the files it came from, not what it means
            out[rel] = _canonical(_default_checkpoint_dirs(resolved))
    finally:
        os.chdir(here)
    return out


def _default_checkpoint_dirs(resolved: dict[str, Any]) -> dict[str, Any]:
    """A ``ModelCheckpoint`` whose ``dirpath`` is ``<trainer.default_root_dir>/checkpoints`` written out means what
    no ``dirpath`` means (:func:`lit_rl.lightning_cli.resolve_checkpoint_dirs`): both become ``None``."""
    import posixpath

    trainer = resolved.get("trainer") or {}
    root = trainer.get("default_root_dir")
    for cb in trainer.get("callbacks") or []:
        args = cb.get("init_args") or {} if isinstance(cb, dict) else {}
        if str(cb.get("class_path", "")).endswith("ModelCheckpoint") and root is not None and args.get("dirpath") \
                and posixpath.normpath(args["dirpath"]) == posixpath.normpath(posixpath.join(root, "checkpoints")):
            args["dirpath"] = None
    return resolved


def first_differences(a: Any, b: Any, prefix: str = "", limit: int = 3) -> list[str]:
    """Dotted keys where ``a`` and ``b`` differ (at most ``limit``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            if len(out) >= limit:
                break
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                out.append(f"{key} (only {'new' if k not in a else 'old'})")
            else:
                out += first_differences(a[k], b[k], key, limit - len(out))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += first_differences(x, y, f"{prefix}[{i}]", limit - len(out))
            if len(out) >= limit:
                break
        return out
    return [] if a == b else [f"{prefix}: {a!r} -> {b!r}"[:200]]


def _export(ref: str, dest: Path) -> None:
    """``conf/`` at ``ref`` into ``dest/conf``, with this checkout's data folders beside it."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "conf"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(dest, filter="data")
    for name in ("data", "tests"):
        (dest / name).symlink_to(ROOT / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/config_meaning.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="main", help="the git ref to compare with (default main)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        _export(args.ref, Path(tmp))
        old = resolve_all(Path(tmp))
    new = resolve_all(ROOT)
    differ = {p: first_differences(old[p], new[p]) for p in sorted(set(old) & set(new)) if old[p] != new[p]}
    only_old, only_new = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    for path, keys in differ.items():
        print(f"{path}: {'; '.join(keys)}")
    for path in only_old + only_new:
        print(f"{path}: only {'at ' + args.ref if path in only_old else 'here'}")
    same = len(set(old) & set(new)) - len(differ)
    print(json.dumps({"ref": args.ref, "configs": len(set(old) | set(new)), "same": same, "differ": list(differ),
                      "only_ref": only_old, "only_here": only_new}))
    return 1 if differ or only_old or only_new else 0


if __name__ == "__main__":
    sys.exit(main())
