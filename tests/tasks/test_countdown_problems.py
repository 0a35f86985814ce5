"""Countdown's expression enumeration, miniature ranges and generated test split, and the trials teacher."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from lit_rl.errors import FieldError
from lit_rl.tasks import CountdownTask
from lit_rl.tasks.countdown_arith import safe_eval
from lit_rl.tasks.countdown_problems import generate_problem, in_order, three_number_expressions
from lit_rl.tasks.scripted import countdown_ordered_trials_completion, countdown_trials_completion

MINI = dict(number_range=[1, 9], target_range=[1, 30], test_size=64, system_prompt="",
            question_template="{numbers}>{target}")


def test_expressions_are_192_with_two_step_traces_computed_by_hand():
    rows = three_number_expressions([3, 4, 5])
    assert len(rows) == 192  # 6 orders x 16 operator pairs x 2 bracketings
    assert rows[0] == ("3+4+5", "3+4=7;7+5=12", Fraction(12))
    assert ("3-(4-5)", "4-5=-1;3--1=4", Fraction(4)) in rows  # the brackets stay where they change the value
    assert ("(3+4)*5", "3+4=7;7*5=35", Fraction(35)) in rows
    assert ("3/(4*5)", "4*5=20;3/20=3/20", Fraction(3, 20)) in rows
    assert ("3+4*5", "4*5=20;3+20=23", Fraction(23)) in rows  # no brackets where precedence does it


@pytest.mark.parametrize("numbers", [[3, 4, 5], [7, 2, 9], [6, 6, 2], [1, 8, 1], [9, 3, 3]])
def test_every_expression_evaluates_to_its_value_and_uses_the_numbers(numbers):
    for expr, trace, value in three_number_expressions(numbers):
        if value is None:
            assert trace == ""
            continue
        assert safe_eval(expr) == pytest.approx(float(value)), expr
        assert sorted(int(x) for x in expr.replace("(", " ").replace(")", " ").replace("+", " ").replace(
            "-", " ").replace("*", " ").replace("/", " ").split()) == sorted(numbers)


def test_default_countdown_problems_are_unchanged():
    t = CountdownTask(num_train=3)  # pinned from the code before the ranges became settings
    assert [t.train_problem(i) for i in range(3)] == [([78, 45, 78], 45), ([45, 70, 9], 75), ([76, 17, 1], 93)]
    assert len(t.eval_examples()) == 256 and t.eval_examples()[0].meta == {"numbers": [30, 100, 93], "target": 23}


def test_miniature_ranges_and_generated_test_split():
    t = CountdownTask(num_train=500, **MINI)
    test = t.eval_examples()
    assert len(test) == 64 and test[0].id == "countdown-test-0"
    keys = {(tuple(sorted(e.meta["numbers"])), e.meta["target"]) for e in test}
    assert len(keys) == 64  # distinct problems
    for e in t.train_examples() + test:
        assert all(1 <= n <= 9 for n in e.meta["numbers"]) and 1 <= e.meta["target"] <= 30
        assert e.question == f"{e.meta['numbers']}>{e.meta['target']}"
    assert not keys & {(tuple(sorted(e.meta["numbers"])), e.meta["target"]) for e in t.train_examples()}
    assert CountdownTask(num_train=5, **MINI).eval_examples() == test  # the same split every time
    assert CountdownTask(num_train=5, seed=1, **MINI).eval_examples() != test


@pytest.mark.parametrize("kwargs, field", [
    ({"number_range": [5, 1]}, "number_range"), ({"number_range": [0, 9]}, "number_range"),
    ({"target_range": [1]}, "target_range"), ({"target_range": ["a", 3]}, "target_range"),
    ({"test_size": 0}, "test_size"), ({"ordered": True}, "ordered: needs a generated test split"),
])
def test_bad_ranges_name_the_field(kwargs, field):
    with pytest.raises(FieldError, match=field):
        CountdownTask(num_train=1, **kwargs)


def test_trials_teacher_writes_k_wrong_tries_then_a_hit():
    t = CountdownTask(num_train=50, **MINI)
    rng = random.Random(0)
    for e in t.train_examples():
        for lo, hi in ((0, 0), (1, 4)):
            text = countdown_trials_completion(e, rng, (lo, hi))
            assert t.reward(text, e) == 1.0  # the answer hits: generated problems are solvable
            trace = text.split("<reasoning>")[1].split("</reasoning>")[0]
            tries = trace.split(", ")
            assert lo + 1 <= len(tries) <= hi + 1
            assert tries[-1].endswith(f"={e.meta['target']}")
            assert all(not x.endswith(f"={e.meta['target']}") for x in tries[:-1])  # the wrong ones miss


def test_ranges_that_cannot_fill_the_splits_fail_with_the_field_instead_of_hanging():
    with pytest.raises(FieldError, match="test_size: only 12 distinct problems"):
        CountdownTask(num_train=3, number_range=[1, 2], target_range=[1, 3], test_size=100).eval_examples()
    with pytest.raises(FieldError, match="target_range: no expression"):
        CountdownTask(num_train=3, number_range=[1, 2], target_range=[500, 600], test_size=10).train_examples()
    assert len(CountdownTask(num_train=3, test_size="5", **{k: v for k, v in MINI.items() if k != "test_size"})
               .eval_examples()) == 5


def test_in_order_reads_the_numbers_left_to_right():
    assert in_order("5+(9-6)", [5, 9, 6]) and in_order("(5+9)/6", [5, 9, 6])
    assert not in_order("9-6+5", [5, 9, 6]) and not in_order("5+9", [5, 9, 6])
    assert in_order("12-3*3", [12, 3, 3]) and not in_order("1+23", [12, 3])


def _ordered_hits(numbers, target):
    return [r for r in three_number_expressions(numbers) if r[2] == target and in_order(r[0], numbers)]


def test_ordered_problems_all_have_a_solution_in_the_given_order():
    rng = random.Random(7)
    problems = [generate_problem(rng, (1, 9), (1, 30), ordered=True) for _ in range(300)]
    assert all(_ordered_hits(n, t) for n, t in problems)
    # without ``ordered`` some problems are solvable only in another order (so the option changes the task)
    rng = random.Random(7)
    free = [generate_problem(rng, (1, 9), (1, 30)) for _ in range(300)]
    assert sum(not _ordered_hits(n, t) for n, t in free) > 10


def test_an_ordered_task_keeps_both_splits_ordered_and_the_default_task_unchanged():
    t = CountdownTask(num_train=200, ordered=True, **MINI)
    for e in t.train_examples() + t.eval_examples():
        assert _ordered_hits(e.meta["numbers"], e.meta["target"]), e.id
    assert len(t.eval_examples()) == 64
    plain = CountdownTask(num_train=5, **MINI)
    assert [e.answer for e in plain.train_examples()] != [e.answer for e in t.train_examples()[:5]]


def test_ordered_teacher_keeps_every_try_and_the_answer_in_the_prompts_order():
    t = CountdownTask(num_train=100, ordered=True, **MINI)
    rng = random.Random(1)
    for e in t.train_examples():
        numbers = e.meta["numbers"]
        text = countdown_ordered_trials_completion(e, rng, (1, 3))
        assert t.reward(text, e) == 1.0
        answer = text.split("<answer>")[1].split("</answer>")[0]
        assert in_order(answer, numbers)
        a, b, c = (str(n) for n in numbers)
        for attempt in text.split("<reasoning>")[1].split("</reasoning>")[0].split(", "):
            inner = attempt.split(";")[0].split("=")[0]  # (a o b) o c writes a o b first; a o (b o c), b o c
            assert re.findall(r"\d+", inner) in ([a, b], [b, c]), attempt


def test_the_trials_warm_up_copies_the_numbers_in_order_with_random_operators():
    from lit_rl.tasks.countdown_arith import safe_eval
    from lit_rl.tasks.registry import format_warmup_text

    t = CountdownTask(num_train=60, ordered=True, **MINI)
    rng = random.Random(3)
    hits, answers = 0, set()
    for e in t.train_examples():
        text = format_warmup_text("countdown", e, rng, "trials")
        answer = text.split("<answer>")[1].split("</answer>")[0]
        trace = text.split("<reasoning>")[1].split("</reasoning>")[0]
        assert in_order(answer, e.meta["numbers"]) and ", " not in trace  # one try, the prompt's order
        assert safe_eval(answer) == pytest.approx(float(Fraction(trace.rsplit("=", 1)[1])))  # the try's value
        hits += t.reward(text, e) == 1.0
        answers.add(re.sub(r"\d+", "n", answer))
    assert hits < 20 and len(answers) > 8  # chance-level hits, many operator / bracket shapes


def test_the_scripted_trials_style_writes_the_ordered_teacher_and_its_errors():
    from lit_rl.tasks.registry import known_traces

    t = CountdownTask(num_train=40, ordered=True, **MINI)
    write = known_traces("countdown")["trials"]
    rng = random.Random(5)
    for e in t.train_examples():
        good, bad = write(e, rng, 0.0), write(e, rng, 1.0)
        assert t.reward(good, e) == 1.0 and t.reward(bad, e) < 1.0
        for text in (good, bad):
            assert in_order(text.split("<answer>")[1].split("</answer>")[0], e.meta["numbers"])
