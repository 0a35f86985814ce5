"""The import graph of lit_rl, datamodules and callbacks, every import counted (module level and inside
functions: a lazy import still ties two modules together). ``python tests/support/layering.py`` prints the
package picture (``package -> the packages it imports``) and any cycle; ``tests/test_layering.py`` checks it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lit_rl", "datamodules", "callbacks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_names(path: Path) -> set[str]:
    """Every module name an ``import`` statement of ``path`` mentions (``from a import b`` gives ``a`` and ``a.b``)."""
    out: set[str] = set()
    me = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".")
                base = base[: len(base) - node.level + (path.name == "__init__.py")]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    """``module -> the project modules it imports``."""
    mods = modules()
    return {m: {n for n in imported_names(p) if n in mods and n != m} for m, p in mods.items()}


def external(path: Path) -> set[str]:
    """Top-level names of the non-project modules ``path`` imports."""
    return {n.split(".")[0] for n in imported_names(path) if n.split(".")[0] not in PACKAGES and n}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    """``lit_rl.core.pg`` -> ``lit_rl.core``; top-level modules of lit_rl stay themselves."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or parts[0] != "lit_rl" else module


def package_picture(g: dict[str, set[str]]) -> dict[str, set[str]]:
    pic: dict[str, set[str]] = defaultdict(set)
    for m, deps in g.items():
        pic[package_of(m)].update(package_of(d) for d in deps if package_of(d) != package_of(m))
    return dict(pic)


def package_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Loops between packages (``lit_rl.models`` -> ``lit_rl.generation`` -> ``lit_rl.models``), lazy imports
    included: two packages that import each other cannot be understood, tested or replaced one at a time."""
    pic = package_picture(g)
    for deps in list(pic.values()):
        for d in deps:
            pic.setdefault(d, set())
    return cycles(pic)


def main() -> int:
    g = graph()
    for pkg, deps in sorted(package_picture(g).items()):
        print(f"{pkg:<24} -> {', '.join(sorted(deps)) or '-'}")
    found = cycles(g)
    loops = package_cycles(g)
    print(f"{len(g)} modules, {sum(len(d) for d in g.values())} import edges, {len(found)} cycle(s), "
          f"{len(loops)} package loop(s)")
    for c in found:
        print("  cycle:", " <-> ".join(c))
    for c in loops:
        print("  package loop:", " <-> ".join(c))
    return 1 if found or loops else 0


if __name__ == "__main__":
    raise SystemExit(main())
