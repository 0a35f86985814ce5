"""The layering of the code, every import counted (also those inside functions): no cycles, and the arrows
that keep parts independent point one way only. ``python tests/support/layering.py`` prints the picture."""

from __future__ import annotations

import pytest

from support import layering

GRAPH = layering.graph()
MODULES = layering.modules()


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_import_cycles():
    assert layering.cycles(GRAPH) == []


def test_no_package_loops():
    # a lazy import inside a function counts: lit_rl.models and lit_rl.generation imported each other once
    assert layering.package_cycles(GRAPH) == []
    assert layering.package_cycles({"lit_rl.a.x": {"lit_rl.b.y"}, "lit_rl.b.y": {"lit_rl.a.z"},
                                    "lit_rl.a.z": set()}) == [["lit_rl.a", "lit_rl.b"]]


def test_the_cycle_check_finds_a_cycle():
    # the checker itself: a two-module loop and a three-module loop are found, a chain is not
    assert layering.cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert layering.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert layering.cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, "lit_rl.core")))
def test_math_imports_only_torch_and_other_math(module):
    # lit_rl.core: pure tensor functions (the one place for the algorithms' math)
    internal = {d for d in GRAPH[module] if not (_within(d, "lit_rl.core") or d in ("lit_rl", "lit_rl.rng"))}
    assert internal == set(), f"{module} imports {internal}"
    third_party = layering.external(MODULES[module]) - {"torch", "__future__", "typing", "math", "enum", "dataclasses",
                                                         "collections", "warnings", "functools", "hashlib", "struct"}
    assert third_party == set(), f"{module} imports {third_party}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, "lit_rl.tasks")))
def test_tasks_import_no_models_generation_or_algorithms(module):
    bad = {d for d in GRAPH[module] for p in ("lit_rl.models", "lit_rl.generation", "lit_rl.algorithms",
                                               "lit_rl.pools", "datamodules", "callbacks") if _within(d, p)}
    assert bad == set(), f"{module} imports {bad}"
    assert not {"lightning", "torch"} & layering.external(MODULES[module]), "a task is plain Python"


def test_containers_import_no_algorithm_model_or_lightning():
    module = "lit_rl.batch"
    bad = {d for d in GRAPH[module]
           if any(_within(d, p) for p in ("lit_rl.algorithms", "lit_rl.models", "datamodules", "callbacks"))}
    assert bad == set() and "lightning" not in layering.external(MODULES[module])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _within(m, "lit_rl") and m != "lit_rl.lightning_cli"))
def test_the_library_does_not_import_datamodules_or_callbacks(module):
    # datamodules and callbacks sit on top of lit_rl; only the CLI entry wires them in (predict's writer)
    bad = {d for d in GRAPH[module] if _within(d, "datamodules") or _within(d, "callbacks")}
    assert bad == set(), f"{module} imports {bad}"


def test_the_picture_prints(capsys):
    assert layering.main() == 0
    out = capsys.readouterr().out
    assert "lit_rl.core" in out and "0 cycle(s)" in out
