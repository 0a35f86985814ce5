"""Moved import paths (lit_rl.deprecation): each old name is the new object, with a warning that names the new
path; a config that still names an old class path parses to the class at its new home. The moved-name stubs
``lit_rl/reliability.py``, ``callbacks/reliability.py``, ``lit_rl/algorithms/sft.py`` and
``lit_rl/algorithms/sft_module.py`` have the same checks in their own test files (tests/test_reliability.py, ...)."""

from __future__ import annotations

import importlib

import pytest

from support.deprecation import assert_moved, assert_old_names_resolve

#: every public name each module had before it moved (frozen here: a stub that forgets one fails)
OLD_NAMES = {
    "lit_rl.pools.scripted": [
        "Example", "Fraction", "REGISTRY", "SCRIPTED_POLICIES", "TRACE_STYLES", "chainsum_completion",
        "chainsum_verbose_completion", "countdown_completion", "countdown_ordered_trials_completion",
        "countdown_random_try", "countdown_search", "countdown_trials_completion", "countdown_trials_pool_completion",
        "format_warmup_text", "last_answer", "reasoning_of", "sudoku_completion", "sudoku_grid_completion",
        "sudoku_grid_verbose_completion", "sudoku_trace", "verbose_trace"],
}
MOVED = [  # (old module, name, new module): a sample whose new home is checked by hand
    ("lit_rl.pools.scripted", "sudoku_completion", "lit_rl.tasks.scripted"),
    ("lit_rl.pools.scripted", "countdown_completion", "lit_rl.tasks.scripted"),
    ("lit_rl.pools.scripted", "format_warmup_text", "lit_rl.tasks.registry"),
]


@pytest.mark.parametrize("old, name, new", MOVED)
def test_an_old_name_is_the_new_object_and_warns_with_the_new_path(old, name, new):
    assert_moved(old, name, new)


@pytest.mark.parametrize("old", OLD_NAMES)
def test_every_old_name_still_resolves_with_a_warning_and_star_imports_them(old):
    assert_old_names_resolve(old, OLD_NAMES[old])


def test_computed_old_values_are_what_the_registry_gives():
    from lit_rl.tasks.registry import REGISTRY, known_traces

    scripted = importlib.import_module("lit_rl.pools.scripted")
    with pytest.warns(FutureWarning, match=r"TRACE_STYLES is deprecated: use lit_rl\.tasks\.registry\.known_t"):
        styles = scripted.TRACE_STYLES
    with pytest.warns(FutureWarning, match="SCRIPTED_POLICIES is deprecated"):
        policies = scripted.SCRIPTED_POLICIES
    assert styles["sudoku"] == known_traces("sudoku")
    assert list(styles["sudoku"]) == ["deduction", "grid", "grid_verbose"]
    assert policies["chainsum"] is REGISTRY["chainsum"].default_trace and set(policies) == set(styles)


def test_an_unknown_name_of_a_moved_module_is_an_attribute_error():
    mod = importlib.import_module("lit_rl.reliability")
    with pytest.raises(AttributeError, match="'lit_rl.reliability' has no attribute 'AtomicIO'"):
        mod.AtomicIO  # noqa: B018
    scripted = importlib.import_module("lit_rl.pools.scripted")
    with pytest.raises(AttributeError):
        scripted.random  # noqa: B018  (a module the new home imports is not a moved name)


def test_a_config_naming_the_old_class_paths_parses_to_the_new_classes(parse_training_config):
    from jsonargparse import Namespace
    from jsonargparse.typing import import_object

    from callbacks.resume import ExactResume
    from lit_rl.checkpoint_io import AtomicCheckpointIO

    with pytest.warns(FutureWarning) as caught:
        cfg = parse_training_config.argv(["--config", "conf/erils.yaml",
                                          "--trainer.plugins=[{class_path: lit_rl.reliability.AtomicCheckpointIO}]",
                                          "--trainer.callbacks+=callbacks.reliability.ExactResume"])
    said = {str(w.message) for w in caught}
    assert any("moved to lit_rl.checkpoint_io.AtomicCheckpointIO" in m for m in said), said
    assert any("moved to callbacks.resume.ExactResume" in m for m in said), said
    plugin, callback = cfg.trainer.plugins[0], cfg.trainer.callbacks[-1]
    assert isinstance(plugin, Namespace) and isinstance(callback, Namespace)
    assert import_object(plugin.class_path) is AtomicCheckpointIO
    assert import_object(callback.class_path) is ExactResume
