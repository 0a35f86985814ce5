"""The committed embedded pool is what `python -m lit_rl rollouts scripted` writes (reproducible)."""

import gzip
import json
from pathlib import Path

from lit_rl.rollouts.cli import build_scripted_pool

ROOT = Path(__file__).resolve().parents[2]


def test_committed_pool_matches_a_fresh_build(tmp_path):
    out = tmp_path / "pool.jsonl"
    # the committed file: --task sudoku --limit 1000 --n 6 --error-rate 0.1 --seed 42
    build_scripted_pool("sudoku", out, n=6, error_rate=0.1, seed=42, limit=20)
    fresh = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    with gzip.open(ROOT / "data/pools/sudoku_scripted.jsonl.gz", "rt") as fh:
        committed = [json.loads(line) for _, line in zip(range(1 + len(fresh)), fh)][1:]
    assert committed == fresh
    # every completion is in the ERILS format and ~90% are fully correct
    assert all(r["completion"].startswith("<reasoning>") and r["completion"].endswith("</answer>") for r in fresh)
    assert 0.7 <= sum(r["reward"] == 1.0 for r in fresh) / len(fresh) <= 1.0
