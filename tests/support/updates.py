"""Comparing two runs of the same optimizer updates (loss tests): per update the loss, the statistics and the
gradients must agree up to float rounding."""

from __future__ import annotations

import pytest
import torch


def assert_same_updates(a: list, b: list) -> None:
    """``a`` and ``b``: per update ``(loss, stats dict, {parameter name: gradient})``."""
    assert len(a) == len(b)
    for (l1, s1, g1), (l2, s2, g2) in zip(a, b):
        assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-7)
        assert s1 == pytest.approx(s2, rel=1e-5, abs=1e-6)
        for n in g1:
            torch.testing.assert_close(g1[n], g2[n], rtol=1e-4, atol=1e-6, msg=n)
