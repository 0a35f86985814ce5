"""WordProblemTask: problems, the natural-output answer parser and the step checker, on completions that
SmolLM2-135M-Instruct wrote (greedy, the task's held-out problems; labelled by hand)."""

from __future__ import annotations

import pytest

from lit_rl.errors import FieldError
from lit_rl.tasks import WordProblemTask, get_task
from lit_rl.tasks.base import Example
from lit_rl.tasks.word_problems import equations, final_int, first_error_at, steps_verdict


def _ex(kind: str, numbers: list[int], answer: int) -> Example:
    return Example(id="x", question="", answer=answer, meta={"kind": kind, "numbers": numbers})


# (completion, problem, answer read, reward, verdict): real outputs of the starting model
REAL = [
    ("Tom has 5 books.\nTom buys 6 more books, so he has 5 + 6 = 11 books now.\nTom has 11 books now.\n#### 11\n"
     "The answer is: 11", _ex("add", [5, 6], 11), 11, 1.0, "supported"),
    ("Zoe buys 9 more pens, so she has 9 + 9 = 18 pens now.\nZoe has 18 pens now.\n\nThis is a classic example of a "
     "simple equation: 9 + 9 = 18.", _ex("add", [9, 9], 18), 18, 1.0, "supported"),
    # a right sum, then "#### 11" and a restatement: the stated answer wins, and it is wrong
    ("Tom has 7 + 3 = 10 pens.\nTom buys 3 more pens, so he now has 10 - 3 = 6 pens.\nTom has now 11 pens.\n#### 11\n"
     "Tom has 11 pens.", _ex("add", [7, 3], 10), 11, 0.0, "wrong"),
    # multiplies instead of adding: arithmetic right, the step wrong for the problem
    ("Sam buys 4 apples, so Sam has 4 apples.\nTo find out how many apples Sam has now, we need to calculate 4 apples "
     "as 4 x 12 = 48 apples.\nSo Sam has 48 apples now.\n#### 48\nThe answer is: 48", _ex("add", [4, 12], 16), 48, 0.0,
     "wrong"),
    # a lucky guess: the answer is right, the only equation is wrong arithmetic
    ("Sam gives 6 books to a friend, so 7 - 6 = 2 books.\n\nThe answer is 1.", _ex("sub", [7, 6], 1), 1, 1.0, "wrong"),
    # right steps, cut mid-sentence at the token limit: read at the last number
    ("Let's break this down step by step. We know that Zoe has 3 coins, and she gives 1 coin to a friend. This means "
     "she has 3 - 1 = 2 coins.\n\nTo find out how many coins she has now, we need to consider the total number of "
     "coins she has. Since she gave 1 coin to her friend, she has 2 coins left.\n\nThe tota", _ex("sub", [3, 1], 2), 2,
     1.0, "supported"),
    # no equation at all
    ("Sam gives 6 books to a friend, so Sam has 6 books.\n\nThis is a classic example of a multiplication problem "
     "involving a fraction. The answer is 6.", _ex("sub", [7, 6], 1), 6, 0.0, "none"),
    # every step right arithmetic, none of them reaches the answer (two-step problem)
    ("Sam buys 9 books and gives 13 books to a friend, so he has 9 + 13 = 22 books now.\nSam has 22 - 9 = 13 books.",
     _ex("two_step", [9, 10, 13], 6), 13, 0.0, "wrong"),
]


@pytest.mark.parametrize("completion, ex, read, reward, verdict", REAL)
def test_real_completions_read_and_judged_as_labelled(completion, ex, read, reward, verdict):
    task = WordProblemTask(num_train=0, num_eval=0)
    assert final_int(completion) == read
    assert task.reward(completion, ex) == reward
    assert steps_verdict(completion, ex) == verdict


def test_final_int_rules_and_never_raises():
    assert final_int("so 12 + 3 = 15, and later 7") == 7           # last number
    assert final_int("The answer is 1,204. Also 9.") == 1204          # stated answer wins; commas inside a number
    assert final_int("answer: -3 then 4") == -3
    assert final_int("#### 5\nThe answer is: 6") == 6                # the LAST stated one
    # an equation after the keyword states its result (word-eval-38 and -54 of premise_start.jsonl wrote these)
    assert final_int("The answer is: 42 + 28 = 60") == 60 and final_int("answer is 5 x 2 = 10 apples") == 10
    assert final_int("no digits here") is None
    assert final_int(None) is None and final_int(["x"]) is None
    assert final_int("7 then " + "1" * 100_000) == 7  # a run of digits too long to be a number is none (no raise)
    assert equations("1" * 5000 + " + 2 = 3") == []


def test_equations_and_a_step_using_an_earlier_result():
    assert equations("5 + 6 = 11, 11 x 2 = 22 and 3×4=12; 8 - 9 = -1") == [
        (5, "+", 6, 11), (11, "*", 2, 22), (3, "*", 4, 12), (8, "-", 9, -1)]
    ex = _ex("two_step", [6, 9, 10], 5)
    assert steps_verdict("6 + 9 = 15 and 15 - 10 = 5", ex) == "supported"
    assert steps_verdict("6 + 9 = 15 and 15 - 10 = 6", ex) == "wrong"        # bad arithmetic
    assert steps_verdict("6 + 9 = 15 and 20 - 15 = 5", ex) == "wrong"        # 20 from nowhere
    assert first_error_at("6 + 9 = 15 and 15 - 10 = 6", ex) == len("6 + 9 = 15 and 15 - 10 = ")  # the wrong result
    assert first_error_at("so 6 + 9 = 14, then 14 - 10 = 4", ex) == len("so 6 + 9 = ")
    assert first_error_at("6 + 9 = 15 and 20 - 15 = 5", ex) == len("6 + 9 = 15 and ")  # 20 from nowhere
    assert first_error_at("6 + 9 = 15 and 15 - 7 = 8", ex) == len("6 + 9 = 15 and 15 - ")  # 7 from nowhere
    assert first_error_at("6 + 9 = 15 and 15 - 10 = 5", ex) is None and first_error_at("no steps", ex) is None


def test_problems_are_reproducible_held_out_and_answers_right():
    task = WordProblemTask(num_train=300, num_eval=64, seed=3)
    again = WordProblemTask(num_train=300, num_eval=64, seed=3)
    assert [e.question for e in task.train_examples()] == [e.question for e in again.train_examples()]
    held = {e.question for e in task.eval_examples()}
    assert not held & {e.question for e in task.train_examples()}
    kinds = {e.meta["kind"] for e in task.train_examples()}
    assert kinds == {"add", "sub", "two_step"}
    for e in task.train_examples() + task.eval_examples():
        a, b, *c = e.meta["numbers"]
        want = {"add": a + b, "sub": a - b, "two_step": a + b - (c[0] if c else 0)}[e.meta["kind"]]
        assert e.answer == want and e.answer >= 0
        assert e.question.endswith("have now?")
    assert WordProblemTask(num_eval=4, seed=4).eval_examples()[0].question != task.eval_examples()[0].question


def test_records_round_trip_and_bad_records_are_refused():
    task = get_task("word_problems", kinds=["two_step"], num_train=0, num_eval=8)
    for e in task.eval_examples():
        back = task.example_from_record(e.question, e.answer)
        assert (back.answer, back.meta) == (e.answer, e.meta)
    e = task.eval_examples()[0]
    with pytest.raises(ValueError, match="is not the answer"):
        task.example_from_record(e.question, e.answer + 1)
    with pytest.raises(ValueError, match="not a word problem"):
        task.example_from_record("What is 2 + 2?", 4)


def test_argument_errors_name_the_field():
    with pytest.raises(FieldError, match="kinds"):
        WordProblemTask(kinds=["mul"])
    with pytest.raises(FieldError, match="max_number"):
        WordProblemTask(max_number=2)
