"""Scripted traces: the Sudoku grid style (fixed length, error injection) and the warm-up's style lookup."""

from __future__ import annotations

import random

import pytest

from callbacks.ar_warmup import ScriptedSFTWarmup
from lit_rl.tasks.registry import known_traces
from lit_rl.tasks.scripted import sudoku_completion, sudoku_grid_completion
from lit_rl.tasks import SudokuTask
from lit_rl.tasks.base import Example

# puzzle 1030 0402 2003 0020 (9 blanks), solution 1234 3412 2143 4321
EX = Example(id="s0", question="1030040220030020", answer="1234341221434321", meta={"puzzle": "1030040220030020"})


def test_grid_trace_is_the_solution_twice_and_scores_full_reward():
    text = sudoku_grid_completion(EX, random.Random(0))
    assert text == "<reasoning>1234341221434321</reasoning>\n<answer>1234341221434321</answer>"
    assert SudokuTask().reward(text, EX) == pytest.approx(SudokuTask().max_reward)


def test_grid_trace_errors_change_one_blank_in_trace_and_answer():
    texts = [sudoku_grid_completion(EX, random.Random(s), error_rate=1.0) for s in range(20)]
    for t in texts:
        trace, answer = t[len("<reasoning>"):len("<reasoning>") + 16], t[-len("</answer>") - 16:-len("</answer>")]
        assert trace == answer  # a reasoning error, copied consistently into the answer
        diff = [i for i in range(16) if trace[i] != EX.answer[i]]
        assert len(diff) == 1 and EX.meta["puzzle"][diff[0]] == "0"  # exactly one cell, and it is a blank
    # 9 blanks, one wrong: partial credit 8/9 of the blanks
    assert SudokuTask().reward(texts[0], EX) == pytest.approx(8 / 9 * SudokuTask().max_reward)


def test_warmup_trace_styles_resolve_or_fail_with_the_known_names():
    assert ScriptedSFTWarmup().teacher("sudoku") is sudoku_completion  # default: the pool's deduction trace
    assert ScriptedSFTWarmup(trace="grid").teacher("sudoku") is sudoku_grid_completion
    assert list(known_traces("sudoku")) == ["deduction", "grid", "grid_verbose"]
    known = r"\(known: \['search', 'trials'\]\)"
    with pytest.raises(ValueError, match=r"trace: 'grid' is not a countdown trace style " + known):
        ScriptedSFTWarmup(trace="grid").teacher("countdown")
    with pytest.raises(ValueError, match="no scripted traces for task 'math500'"):
        ScriptedSFTWarmup().teacher("math500")
