"""The committed embedded pool is what `python -m lit_rl rollouts scripted` writes (reproducible)."""

import gzip
import json
from pathlib import Path

from lit_rl.pools.cli import build_scripted_pool

ROOT = Path(__file__).resolve().parents[2]


def test_committed_pool_matches_a_fresh_build(tmp_path):
    out = tmp_path / "pool.jsonl"
    # the committed file: --task sudoku --limit 1000 --n 6 --error_rate 0.1 --seed 42
    build_scripted_pool("sudoku", out, n=6, error_rate=0.1, seed=42, limit=20)
    fresh = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    with gzip.open(ROOT / "data/pools/sudoku_scripted.jsonl.gz", "rt") as fh:
        committed = [json.loads(line) for _, line in zip(range(1 + len(fresh)), fh)][1:]
    assert committed == fresh
    # every completion is in the ERILS format and ~90% are fully correct
    assert all(r["completion"].startswith("<reasoning>") and r["completion"].endswith("</answer>") for r in fresh)
    assert 0.7 <= sum(r["reward"] == 1.0 for r in fresh) / len(fresh) <= 1.0


def test_committed_grid_pool_matches_a_fresh_build(tmp_path):
    # data/pools/sudoku_grid.jsonl.gz: --task sudoku --trace grid --limit 1000 --n 6 --error_rate 0.1 --seed 42
    out = tmp_path / "pool.jsonl"
    build_scripted_pool("sudoku", out, n=6, error_rate=0.1, seed=42, limit=20, trace="grid")
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["trace"] == "grid"
    fresh = [json.loads(line) for line in lines[1:]]
    with gzip.open(ROOT / "data/pools/sudoku_grid.jsonl.gz", "rt") as fh:
        committed = [json.loads(line) for _, line in zip(range(1 + len(fresh)), fh)][1:]
    assert committed == fresh
    for r in fresh:  # fixed length: 16 trace digits, the same 16 as the answer (37 char-tokens)
        body = r["completion"]
        trace, answer = body[len("<reasoning>"):].split("</reasoning>\n<answer>")
        assert len(trace) == 16 and answer == trace + "</answer>" and r["num_tokens"] == 37


def test_committed_verbose_grid_pool_matches_a_fresh_build_and_the_grid_pool(tmp_path):
    # data/pools/sudoku_grid_verbose.jsonl.gz: --trace grid_verbose, otherwise as the grid pool
    out = tmp_path / "pool.jsonl"
    build_scripted_pool("sudoku", out, n=6, error_rate=0.1, seed=42, limit=20, trace="grid_verbose")
    fresh = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    with gzip.open(ROOT / "data/pools/sudoku_grid_verbose.jsonl.gz", "rt") as fh:
        committed = [json.loads(line) for _, line in zip(range(1 + len(fresh)), fh)][1:]
    assert committed == fresh
    with gzip.open(ROOT / "data/pools/sudoku_grid.jsonl.gz", "rt") as fh:
        short = [json.loads(line) for _, line in zip(range(1 + len(fresh)), fh)][1:]
    from lit_rl.tasks import SudokuTask

    puzzles = {e.id: e.meta["puzzle"] for e in SudokuTask(num_train=20).train_examples()}
    for r, s in zip(fresh, short):  # same answers and rewards (same error draws), 32 more trace digits
        trace, answer = r["completion"][len("<reasoning>"):].split("</reasoning>\n<answer>")
        grid = answer[:-len("</answer>")]
        assert trace[:16] == puzzles[r["prompt_id"]]  # the restated puzzle
        assert trace[16:32] == grid and trace[32:] == "".join(grid[i * 4 + c] for c in range(4) for i in range(4))
        assert s["completion"].endswith(answer) and s["reward"] == r["reward"]
        assert r["num_tokens"] == 69 > 48  # longer than the embedded L_gen, within max_external_len


def test_scripted_pool_refuses_unknown_traces(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="--trace"):
        build_scripted_pool("sudoku", tmp_path / "p.jsonl", limit=2, trace="nope")
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_cli_writes_the_recipes_trace_gzipped_when_asked(tmp_path, capsys):
    """``rollouts scripted --task sudoku --out X.jsonl.gz`` writes what conf/erils.yaml's pool is: the grid trace
    (the deduction trace leaves the model at chance), gzipped; the same pool gives the same bytes."""
    from lit_rl.pools.cli import main
    from lit_rl.pools.pool import load_pool

    out = tmp_path / "p.jsonl.gz"
    assert main(["scripted", "--task", "sudoku", "--out", str(out), "--limit", "20"]) == 0
    with gzip.open(out, "rt") as fh:
        lines = fh.read().splitlines()
    assert json.loads(lines[0])["trace"] == "grid"
    with gzip.open(ROOT / "data/pools/sudoku_grid.jsonl.gz", "rt") as fh:
        committed = [json.loads(line) for _, line in zip(range(len(lines)), fh)][1:]
    assert [json.loads(x) for x in lines[1:]] == committed
    assert sum(len(v) for v in load_pool(out, g_ext=6).values()) == 120  # the loader reads it back
    again = tmp_path / "q.jsonl.gz"
    main(["scripted", "--task", "sudoku", "--out", str(again), "--limit", "20"])
    assert again.read_bytes()[:10] == out.read_bytes()[:10]  # the gzip header (mtime 0): no timestamp in it
    with gzip.open(again, "rt") as fh:
        lines2 = fh.read().splitlines()
    assert lines2[1:] == lines[1:]  # the same records, byte for byte; the header differs only in its wall time
    head, head2 = json.loads(lines[0]), json.loads(lines2[0])
    head.pop("wall_time_s"), head2.pop("wall_time_s")
    assert head == head2
    main(["scripted", "--task", "sudoku", "--out", str(tmp_path / "d.jsonl"), "--limit", "2", "--trace", "deduction"])
    assert json.loads((tmp_path / "d.jsonl").read_text().splitlines()[0])["trace"] == "deduction"


def test_grid_format_warmup_text_copies_givens_and_repeats_the_trace():
    import random

    from lit_rl.tasks.registry import format_warmup_text
    from lit_rl.tasks.base import Example

    ex = Example(id="x", question="", answer="1234341221434321", meta={"puzzle": "1030040221004300"})
    text = format_warmup_text("sudoku", ex, random.Random(0), "grid")
    trace, answer = text[len("<reasoning>"):-len("</answer>")].split("</reasoning>\n<answer>")
    assert trace == answer and len(trace) == 16
    assert all(t == p for t, p in zip(trace, ex.meta["puzzle"]) if p != "0") and set(trace) <= set("1234")
    import pytest

    with pytest.raises(ValueError, match="style"):
        format_warmup_text("sudoku", ex, random.Random(0), "nope")
