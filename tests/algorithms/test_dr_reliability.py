"""The reliability study's binning (lit_rl/algorithms/dr_reliability.py), on values computed by hand."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.dr_reliability import (
    crossed_markdown,
    crossed_table,
    length_edges,
    reliability_rows,
    reliability_table,
    table_markdown,
)


def test_rows_pass_rate_counts_every_row_of_the_prompt_and_keep_only_rows_with_continuations():
    # prompt 0: rows 0-3, correct 1,1,0,0 -> pass rate 0.5; prompt 1: rows 4-5, correct 0,0 -> 0.0
    y = torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool)
    cont = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 0], [0, 0], [0, 1]], dtype=torch.bool)  # (B, N=2)
    has = torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.bool)  # row 3 got no continuations
    lengths = torch.tensor([10, 20, 30, 40, 50, 60])
    group = torch.tensor([0, 0, 0, 0, 1, 1])
    rows = reliability_rows(y, cont, has, lengths, group)
    assert rows["correct"].tolist() == [True, True, False, False, False]
    assert rows["cont_acc"].tolist() == [1.0, 0.5, 0.0, 0.0, 0.5]
    assert rows["length"].tolist() == [10, 20, 30, 50, 60]
    assert rows["pass_rate"].tolist() == [0.5, 0.5, 0.5, 0.0, 0.0]  # row 3 still counts for prompt 0's rate


def test_table_bins_by_length_tercile_and_difficulty():
    rows = {
        "correct": torch.tensor([True, True, False, False, True, False]),
        "cont_acc": torch.tensor([1.0, 0.5, 0.25, 0.0, 0.75, 0.5]),
        "length": torch.tensor([10, 20, 30, 40, 50, 60]),
        "pass_rate": torch.tensor([0.9, 0.9, 0.5, 0.5, 0.1, 0.1]),
    }
    assert length_edges(rows["length"], 3) == pytest.approx([10 + 50 / 3, 10 + 100 / 3], rel=1e-5)  # tertiles
    cells = {(r["by"], r["bin"], r["rollout"]): (r["n"], r["cont_acc"]) for r in reliability_table(rows)}
    assert cells[("all", "all", "correct")] == (3, (1.0 + 0.5 + 0.75) / 3)
    assert cells[("all", "all", "incorrect")] == (3, (0.25 + 0.0 + 0.5) / 3)
    # lengths 10, 20 | 30, 40 | 50, 60
    short = [k for k in cells if k[0] == "length"][0][1]
    assert cells[("length", short, "correct")] == (2, 0.75) and cells[("length", short, "incorrect")] == (0, None)
    assert cells[("difficulty", "easy", "correct")] == (2, 0.75)
    assert cells[("difficulty", "medium", "incorrect")] == (2, 0.125)
    assert (cells[("difficulty", "hard", "correct")] == (1, 0.75)
            and cells[("difficulty", "hard", "incorrect")] == (1, 0.5))
    md = table_markdown(reliability_table(rows))
    assert "| all | all | 0.750 (3) | 0.250 (3) |" in md and "| difficulty | medium | - | 0.125 (2) |" in md


def test_crossed_table_crosses_difficulty_with_length_and_hides_thin_cells():
    # lengths 10..60: tertile edges 26.67 and 43.33 -> {10, 20}, {30, 40}, {50, 60}; pass rates: rows 0-1 easy,
    # 2-3 medium, 4-5 hard. So each difficulty sits in one length bin.
    rows = {
        "correct": torch.tensor([True, True, False, False, True, False]),
        "cont_acc": torch.tensor([1.0, 0.5, 0.25, 0.0, 0.75, 0.5]),
        "length": torch.tensor([10, 20, 30, 40, 50, 60]),
        "pass_rate": torch.tensor([0.9, 0.9, 0.5, 0.5, 0.1, 0.1]),
    }
    table = crossed_table(rows, 3, min_count=1)
    assert len(table) == 3 * 3 * 2  # difficulty x length bin x correct/incorrect
    cell = {(r["difficulty"], r["bin"], r["rollout"]): (r["n"], r["cont_acc"]) for r in table}
    assert cell[("easy", "<=26.6667", "correct")] == (2, 0.75)
    assert cell[("easy", "<=26.6667", "incorrect")] == (0, None)
    assert cell[("medium", "(26.6667,43.3333]", "incorrect")] == (2, 0.125)
    assert cell[("hard", ">43.3333", "correct")] == (1, 0.75)
    assert cell[("hard", ">43.3333", "incorrect")] == (1, 0.5)
    assert cell[("hard", "<=26.6667", "correct")] == (0, None)
    thin = {(r["difficulty"], r["bin"], r["rollout"]): (r["n"], r["cont_acc"]) for r in crossed_table(rows, 3, 2)}
    assert thin[("hard", ">43.3333", "correct")] == (1, None)  # one rollout is too few to read
    assert thin[("easy", "<=26.6667", "correct")] == (2, 0.75)
    md = crossed_markdown(crossed_table(rows, 3, 2), 2)
    assert "| hard | >43.3333 | - (1 < 2) | - (1 < 2) |" in md and "| easy | <=26.6667 | 0.750 (2) |" in md
    with pytest.raises(ValueError, match="min_count must be >= 1"):
        crossed_table(rows, 3, 0)
