"""lit_rl/algorithms/sft_module.py, a moved-name stub (:mod:`lit_rl.deprecation`): every old name still resolves, with
a warning (the stubs' machinery: tests/test_deprecation.py)."""

from __future__ import annotations

import pytest

from support.deprecation import assert_old_names_resolve

#: every public name the module had before it moved (frozen here: a stub that forgets one fails)
OLD_NAMES = {
    "lit_rl.algorithms.sft_module": ["DenoisingSFT"],
}


@pytest.mark.parametrize("old", OLD_NAMES)
def test_every_old_name_still_resolves_with_a_warning_and_star_imports_them(old):
    assert_old_names_resolve(old, OLD_NAMES[old])
