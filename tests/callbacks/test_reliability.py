"""callbacks/reliability.py, a moved-name stub (:mod:`lit_rl.deprecation`): each old name is the new object, with a
warning that names the new path (the stubs' machinery, and a config naming the old class paths:
tests/test_deprecation.py)."""

from __future__ import annotations

import pytest

from support.deprecation import assert_moved, assert_old_names_resolve

#: every public name the module had before it moved (frozen here: a stub that forgets one fails)
OLD_NAMES = {
    "callbacks.reliability": ["CheckpointOnSigterm", "ExactResume", "PromptLedger"],
}
MOVED = [  # (old module, name, new module): a sample whose new home is checked by hand
    ("callbacks.reliability", "ExactResume", "callbacks.resume"),
    ("callbacks.reliability", "PromptLedger", "callbacks.resume"),
    ("callbacks.reliability", "CheckpointOnSigterm", "callbacks.resume"),
]


@pytest.mark.parametrize("old, name, new", MOVED)
def test_an_old_name_is_the_new_object_and_warns_with_the_new_path(old, name, new):
    assert_moved(old, name, new)


@pytest.mark.parametrize("old", OLD_NAMES)
def test_every_old_name_still_resolves_with_a_warning_and_star_imports_them(old):
    assert_old_names_resolve(old, OLD_NAMES[old])
