"""MATH: reward (§4: correctness 2.0 + format), eval parsing (§5), data loading."""

import json

import sys

import pytest

from lit_rl.tasks import MathTask, get_task
from lit_rl.tasks.base import Example
from lit_rl.tasks.math_task import math_format_reward
from lit_rl.tasks.parsing import last_boxed, reference_boxed

HALF = Example("t", "q", "\\frac{1}{2}")


@pytest.fixture(scope="module")
def task():
    return MathTask()


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<reasoning>r</reasoning>\n<answer>\n\\boxed{\\dfrac{1}{2}}\n</answer>", 3.0),  # 2 + 1.0
        ("<answer>\\boxed{0.5}</answer>", 3.0),  # "0.5" normalises to \frac{1}{2}
        ("so \\boxed{1/2}", 2.5),  # 2 + 0.5 (box, no <answer>)
        ("\\boxed{1} first, then \\boxed{\\frac12}", 2.5),  # last box, \frac12 -> \frac{1}{2}
        ("<answer>\\boxed{3}</answer>", 1.0),  # wrong: format only
        ("<answer>1/2</answer>", 0.75),  # no box: no correctness (§4), <answer> without box
        ("1/2", 0.25),
        ("<answer>\\boxed{1/2</answer>", 1.0),  # unbalanced box: no correctness, format 1.0
        ("so \\boxed 1/2$.", 2.5),  # "\boxed " form
        ("", 0.25),
    ],
)
def test_reward(task, completion, expected):
    assert task.reward(completion, HALF) == pytest.approx(expected)


def test_reward_against_worked_solution(task):
    # a training row whose answer is a full solution: its last box is the reference answer
    e = Example("t", "q", "We get $x = \\boxed{\\frac{3}{4}}$.")
    assert task.reward("<answer>\\boxed{3/4}</answer>", e) == 3.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>\\boxed{1}</answer>", 1.0),
        ("<answer>1</answer>", 0.75),
        ("\\boxed{1}", 0.5),
        ("1", 0.25),
        ("<answer>x<answer>\\boxed{1}</answer>", 0.75),  # box only in the 2nd block: not counted
        ("<answer>x</answer> \\boxed{1}", 0.75),  # box after the block: not counted
        ("<answer>\\boxed{1}", 1.0),  # unclosed block runs to the end
    ],
)
def test_format_reward(completion, expected):
    assert math_format_reward(completion) == expected


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", True),
        ("<answer>1/2</answer>", True),  # no box: first <answer> block
        ("<answer>\\boxed{}</answer><answer>0.5</answer>", False),  # empty box: first block is "\boxed{}"
        ("<answer>\\boxed{1/2</answer>", False),  # unbalanced: first block "\boxed{1/2"
        ("\\boxed{1/2} <answer>3</answer>", True),  # box wins over the block
        ("1/2", False),  # no box, no block
    ],
)
def test_eval(task, completion, correct):
    assert task.evaluate(completion, HALF) == (int(correct), 1)


def test_boxed_extraction():
    assert last_boxed("a \\boxed{x^{2}} b") == "x^{2}"
    assert last_boxed("\\boxed{1") is None and last_boxed("no box") is None
    assert last_boxed("\\fbox{5}") == "\\fbox{5}"  # the reference strips only \boxed{...}
    assert reference_boxed("no box") == "no box"  # the reference helper returns its input
    assert last_boxed("\\boxed}" + "}" * 10) is None


def test_eval_set(task):
    evs = task.eval_examples()
    assert len(evs) == 500
    assert evs[0].id == "math500-test-0" and evs[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert evs[0].meta["level"] == 2
    (msg,) = task.messages(evs[0])
    assert "Wrap the final answer in a \\boxed{}. \n\nConvert the point $(0,3)$" in msg["content"]


def test_train_from_jsonl_and_parquet(tmp_path):
    rows = [
        {"problem": "1+1?", "answer": "2"},
        {"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
    ]
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = get_task("math", train_path=str(p))
    exs = t.train_examples()
    assert [e.answer for e in exs] == ["2", "\\frac{1}{2}"]
    assert [e.id for e in exs] == ["math-train-0", "math-train-1"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "2+2?", "final": "4"}]), tmp_path / "t.parquet")
    t = MathTask(train_path=str(tmp_path / "t.parquet"), problem_field="question", answer_field="final")
    assert t.train_examples()[0].answer == "4"


def test_train_errors(tmp_path):
    with pytest.raises(ValueError, match="train_path"):
        MathTask().train_examples()
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"problem": "x", "solution": "no box"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: .*'answer'"):
        MathTask(train_path=str(p)).train_examples()
    p.write_text(json.dumps({"question": "x", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match="'problem'"):
        MathTask(train_path=str(p)).train_examples()
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        MathTask(train_path=str(p)).train_examples()
    with pytest.raises(FileNotFoundError, match="train_path"):
        MathTask(train_path=str(tmp_path / "missing.jsonl")).train_examples()


def test_train_dataset_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError, installed or not
    with pytest.raises(RuntimeError, match="train_dataset.*datasets"):
        MathTask(train_dataset="ankner/math-500").train_examples()
