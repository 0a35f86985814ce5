"""A minimal reproduce plan for the plan tests (tests/reproduce/test_plan_file.py, test_plan_jobs.py): the required
keys (5 lines, so a test's first job sits at line 6) and the caller's jobs."""

from __future__ import annotations

from pathlib import Path

HEAD = """study: erils
experiment: e
metric: val/sudoku/greedy/accuracy
warm_start: {callback: callbacks.FormatWarmup}
"""


def write_plan(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + text)
    return path
