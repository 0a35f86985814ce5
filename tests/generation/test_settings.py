"""Tests lit_rl/generation/settings.py."""

import pytest

from lit_rl.generation.settings import DecodeSettings


@pytest.mark.parametrize(
    "kw, match",
    [({"cache": "full"}, "cache: must be .none., .prefix. or .dual."), ({"refresh_every": 0}, "refresh_every"),
     ({"threshold": 0.0}, "threshold"), ({"threshold": 1.5}, "threshold"),
     ({"threshold_floor": "none"}, "threshold_floor")],
)
def test_decode_settings_refuse_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        DecodeSettings(**kw)
