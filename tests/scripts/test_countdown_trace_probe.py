"""scripts/countdown_trace_probe.py: a few steps of each trace, and its copy measure by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _probe():
    spec = importlib.util.spec_from_file_location("countdown_trace_probe", ROOT / "scripts/countdown_trace_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copy_measure_reads_the_last_answer_in_the_prompts_order():
    probe = _probe()
    assert probe.answer_in_order("<reasoning>x</reasoning>\n<answer>5+(9-6)</answer>", [5, 9, 6])
    assert not probe.answer_in_order("<answer>9-6+5</answer>", [5, 9, 6])  # the right numbers, another order
    assert not probe.answer_in_order("<answer>5+9-6</answer><answer>5+9</answer>", [5, 9, 6])  # the last one counts
    assert not probe.answer_in_order("5+9-6", [5, 9, 6])


@pytest.mark.parametrize("argv", [["--trace", "copy"], ["--trace", "trials", "--order", "any", "--tries", "0,1"]])
def test_a_few_steps_print_the_curve_and_a_json_line_last(argv, capsys):
    out = _probe().main([*argv, "--steps", "2", "--every", "1", "--test", "4", "--num-train", "20"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == json.loads(json.dumps(out))
    assert [p["step"] for p in out["curve"]] == [0, 1, 2]
    assert all(0 <= p["copy"] <= 1 and 0 <= p["acc"] <= 1 and p["s"] >= 0 for p in out["curve"])
    assert sum(line.startswith("step ") for line in lines) == 3
