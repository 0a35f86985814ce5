"""rollouts filter: a reward filter on a copy of a pool (usable-first again, gz by name, atomic)."""

from __future__ import annotations

import gzip
import json

import pytest

from lit_rl.pools.cli import main
from lit_rl.pools.pool import PoolRecord, _header, load_pool, write_pool_atomic
from lit_rl.pools.pool_filter import filter_pool


def _pool(path):
    recs = [PoolRecord("p0", 0, "m", "a", 0.1, 5, "t"), PoolRecord("p0", 1, "m", "b", 1.0, 6, "t"),
            PoolRecord("p0", 2, "m", "c", 1.0, 99, "t", usable=False),  # too long: stays unusable
            PoolRecord("p1", 0, "m", "d", 0.0, 5, "t"), PoolRecord("p1", 1, "m", "e", 0.1, 5, "t")]
    write_pool_atomic(path, _header("countdown", "m", "t"), recs)
    return path


def test_filter_keeps_the_rewarded_usable_records_first(tmp_path):
    src = _pool(tmp_path / "pool.jsonl")
    counts = filter_pool(src, tmp_path / "correct.jsonl.gz", min_reward=1.0)
    assert counts == {"records": 5, "usable_before": 4, "usable_after": 1, "prompts_with_usable": 1, "prompts": 2}
    with gzip.open(tmp_path / "correct.jsonl.gz", "rt") as fh:
        lines = [json.loads(x) for x in fh]
    assert lines[0]["min_reward"] == 1.0 and lines[0]["filtered_from"].endswith("pool.jsonl")
    assert [(r["completion"], r["index"], r["usable"]) for r in lines[1:4]] == [("b", 0, True), ("a", 1, False),
                                                                                  ("c", 2, False)]
    assert list(load_pool(tmp_path / "correct.jsonl.gz", 1)) == ["p0"]  # p1 has no correct record left
    assert filter_pool(src, tmp_path / "copy.jsonl")["usable_after"] == 4  # no min_reward: a plain copy
    assert filter_pool(src, tmp_path / "short.jsonl", max_tokens=5)["usable_after"] == 3  # "b" (6 tokens) leaves


def test_filter_cli_and_refusing_to_overwrite_the_source(tmp_path, capsys):
    src = _pool(tmp_path / "pool.jsonl")
    assert main(["filter", str(src), "--out", str(tmp_path / "o.jsonl"), "--min_reward", "0.1"]) == 0
    assert json.loads(capsys.readouterr().out)["usable_after"] == 3
    assert main(["filter", str(src), "--out", str(src)]) == 2
    assert "is the source pool" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        filter_pool(tmp_path / "missing.jsonl", tmp_path / "x.jsonl")
