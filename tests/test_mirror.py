"""Tests mirror the package: ``lit_rl/a/b.py`` is tested in ``tests/a/test_b.py`` (or ``tests/a/test_b_<aspect>.py``),
``callbacks/x.py`` in ``tests/callbacks/test_x.py``, ``datamodules/x.py`` in ``tests/datamodules/test_x.py``.

:data:`NOT_MIRRORED` lists the modules that are still tested elsewhere, each with where. The list may only
shrink: a new module needs its own test file, and a module that gains one must leave the list.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module -> the test file that exercises it today (through its package, an integration test or a sibling's tests)
NOT_MIRRORED = {
    "lit_rl/models/native.py": "tests/models/test_4bit_resume.py",  # and test_{llada,dream}_reference.py
}


def _mirror(module: Path) -> tuple[Path, str]:
    rel = module.relative_to(ROOT)
    parts = rel.parts[1:] if rel.parts[0] == "lit_rl" else rel.parts
    return ROOT.joinpath("tests", *parts[:-1]), f"test_{module.stem}"


def _unmirrored() -> set[str]:
    """Modules with neither ``test_<name>.py`` nor ``test_<name>_<aspect>.py``, where an aspect file is not
    another module's own mirror (``test_cli_args.py`` mirrors ``cli_args.py``, not ``cli.py``)."""
    modules = [m for pkg in ("lit_rl", "callbacks", "datamodules") for m in (ROOT / pkg).rglob("*.py")
               if not m.name.startswith("__")]
    own = {_mirror(m)[0] / f"{_mirror(m)[1]}.py" for m in modules}
    out = set()
    for module in modules:
        folder, stem = _mirror(module)
        aspects = [t for t in folder.glob(f"{stem}_*.py") if t not in own]
        if not ((folder / f"{stem}.py").exists() or aspects):
            out.add(module.relative_to(ROOT).as_posix())
    return out


def test_every_module_has_its_mirrored_test_file_or_says_where_it_is_tested():
    missing = _unmirrored()
    new, done = sorted(missing - NOT_MIRRORED.keys()), sorted(NOT_MIRRORED.keys() - missing)
    assert not new, f"modules without tests/<same path>/test_<name>.py: {new}"
    assert not done, f"mirrored now, take them off NOT_MIRRORED: {done}"


def test_the_named_test_files_exist():
    assert [f for f in NOT_MIRRORED.values() if not (ROOT / f).is_file()] == []
