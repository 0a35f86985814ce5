"""lit_rl/reproduce/lengths.py: Table XI's rows from the runs' three-length evaluation files."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the evaluation file writer of test_erils_report (its tests use it)
from test_erils_report import _lengths_report  # noqa: E402


def test_lengths_rows_average_each_length_over_a_groups_runs_and_skip_missing_runs(tmp_path):
    from lit_rl.reproduce.lengths import length_scores, lengths_rows

    _lengths_report(tmp_path / "a_s0", {96: 0.5, 48: 0.9, 192: 0.2})
    _lengths_report(tmp_path / "a_s1", {48: 0.7, 96: 0.3, 192: 0.2})
    (tmp_path / "bad/eval").mkdir(parents=True)
    (tmp_path / "bad/eval/passk_lengths_validate_report.json").write_text("{not json")
    assert list(length_scores(tmp_path / "a_s0")) == [48, 96, 192]  # sorted by length
    assert length_scores(tmp_path / "bad") is None and length_scores(tmp_path / "missing") is None
    lines, summary = lengths_rows({"A": [tmp_path / "a_s0", tmp_path / "a_s1", tmp_path / "missing"],
                                   "B": [tmp_path / "bad"]})
    assert list(summary) == ["A"]  # B has no readable evaluation
    assert summary["A"][48]["mean"] == pytest.approx(0.8)
    assert summary["A"][48]["std"] == pytest.approx(0.141421, rel=1e-5)
    assert summary["A"][96]["values"] == [0.5, 0.3] and summary["A"][192]["std"] == 0.0
    assert lines[0] == "| run | runs | L_gen 48 | L_gen 96 | L_gen 192 |"
    assert lines[2] == "| A | 2 | 0.800 ± 0.141 | 0.400 ± 0.141 | 0.200 ± 0.000 |"
    assert lengths_rows({"B": [tmp_path / "bad"]}) == ([], {})
