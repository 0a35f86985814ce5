"""Tests lit_rl/pools/backend_types.py."""

from lit_rl.pools.backend_types import request_seed


def test_request_seed_is_stable_and_distinct():
    a = request_seed(42, "sudoku-train-0", 0, "generate")
    assert a == request_seed(42, "sudoku-train-0", 0, "generate")
    assert len({request_seed(42, "sudoku-train-0", j, s) for j in range(6) for s in ("generate", "rewrite")}) == 12
    assert a != request_seed(43, "sudoku-train-0", 0, "generate")
    assert 0 <= a < 2**31
