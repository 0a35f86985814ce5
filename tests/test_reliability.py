"""lit_rl/reliability.py, a moved-name stub (:mod:`lit_rl.deprecation`): each old name is the new object, with a
warning that names the new path (the stubs' machinery, and a config naming the old class paths:
tests/test_deprecation.py)."""

from __future__ import annotations

import pytest

from support.deprecation import assert_moved, assert_old_names_resolve

#: every public name the module had before it moved (frozen here: a stub that forgets one fails)
OLD_NAMES = {
    "lit_rl.reliability": ["AtomicCheckpointIO", "ConfigError", "FieldError", "atomic_torch_save", "capture_rng_state",
                           "load_yaml_with_lines", "preflight", "restore_rng_state", "tracking_uri_problem"],
}
MOVED = [  # (old module, name, new module): a sample whose new home is checked by hand
    ("lit_rl.reliability", "AtomicCheckpointIO", "lit_rl.checkpoint_io"),
    ("lit_rl.reliability", "atomic_torch_save", "lit_rl.checkpoint_io"),
    ("lit_rl.reliability", "load_yaml_with_lines", "lit_rl.config.lines"),
    ("lit_rl.reliability", "preflight", "lit_rl.config.preflight"),
    ("lit_rl.reliability", "FieldError", "lit_rl.errors"),
    ("lit_rl.reliability", "tracking_uri_problem", "lit_rl.tracking"),
]


@pytest.mark.parametrize("old, name, new", MOVED)
def test_an_old_name_is_the_new_object_and_warns_with_the_new_path(old, name, new):
    assert_moved(old, name, new)


@pytest.mark.parametrize("old", OLD_NAMES)
def test_every_old_name_still_resolves_with_a_warning_and_star_imports_them(old):
    assert_old_names_resolve(old, OLD_NAMES[old])
