"""Chain sums (the double-rollout testbed task): data, the verifier on untrusted text, the scripted teacher."""

from __future__ import annotations

import random

import pytest

from lit_rl.rollouts.scripted import SCRIPTED_POLICIES, TRACE_STYLES
from lit_rl.tasks import ChainSumTask, get_task
from lit_rl.tasks.chainsum import (
    chainsum_completion,
    chainsum_verbose_completion,
    parse_int_answer,
    running_sums,
    trace_correct,
)


def test_examples_are_seeded_disjoint_and_in_range():
    task = ChainSumTask(num_train=50, num_eval=20, min_terms=3, max_terms=5, max_digit=5, seed=1)
    again = ChainSumTask(num_train=50, num_eval=20, min_terms=3, max_terms=5, max_digit=5, seed=1)
    train, ev = task.train_examples(), task.eval_examples()
    assert [e.meta for e in train] == [e.meta for e in again.train_examples()]
    assert {e.id for e in train}.isdisjoint(e.id for e in ev)
    for e in train + ev:
        nums = e.meta["numbers"]
        assert 3 <= len(nums) <= 5 and all(1 <= n <= 5 for n in nums) and e.answer == sum(nums)
        assert e.question == "Sum: " + " ".join(map(str, nums))
    assert [e.meta for e in ChainSumTask(num_train=50, seed=2).train_examples()] != [e.meta for e in train]


def test_running_sums_by_hand():
    assert running_sums([3, 5, 2, 8]) == [(3, 5, 8), (8, 2, 10), (10, 8, 18)]


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("<reasoning>3+5=8 8+2=10</reasoning>\n<answer>10</answer>", 1.0),
        ("<answer> 10 </answer>", 1.0),
        ("<reasoning>3+5=8 8+2=11</reasoning>\n<answer>11</answer>", 0.0),
        ("<answer>9</answer> then <answer>10</answer>", 1.0),  # the last answer block counts
        ("<answer>10.0</answer>", 0.0),
        ("<answer>1" + "0" * 5000 + "</answer>", 0.0),  # never int() of a huge digit run
        ("no answer at all", 0.0),
        ("", 0.0),
    ],
)
def test_reward_on_untrusted_text(completion, reward):
    task = ChainSumTask(num_train=1, num_eval=1)
    ex = task._from_numbers("x", [3, 5, 2])
    assert task.reward(completion, ex) == reward
    assert task.evaluate(completion, ex).fraction == reward


def test_parse_int_answer_never_raises():
    for junk in (None, 12, "<answer>", "<answer>--3</answer>", "<answer>\x00</answer>"):
        assert parse_int_answer(junk) is None


def test_teacher_is_right_without_errors_and_slips_with_them():
    task = ChainSumTask(num_train=200, num_eval=1)
    rng = random.Random(0)
    exact = [chainsum_completion(e, rng, 0.0) for e in task.train_examples()]
    assert all(task.reward(c, e) == 1.0 for c, e in zip(exact, task.train_examples()))
    rng = random.Random(0)
    slipped = [chainsum_completion(e, rng, 1.0) for e in task.train_examples()]
    traces_wrong = [c for c, e in zip(slipped, task.train_examples())
                    if c != chainsum_completion(e, random.Random(0), 0.0)]
    assert len(traces_wrong) == 200  # every trace has a slip
    rewards = [task.reward(c, e) for c, e in zip(slipped, task.train_examples())]
    # half the slipped traces answer their own wrong sum, half the true total (unsupported by the trace)
    assert 0.35 < sum(rewards) / len(rewards) < 0.65


def test_registered_for_warm_starts_and_by_name():
    assert SCRIPTED_POLICIES["chainsum"] is chainsum_completion and "running" in TRACE_STYLES["chainsum"]
    assert isinstance(get_task("chainsum", num_train=3), ChainSumTask)


def test_example_from_record_roundtrip_and_errors():
    task = ChainSumTask(num_train=1, num_eval=1)
    ex = task.example_from_record("Sum: 4 4 1", 9)
    assert ex.meta["numbers"] == [4, 4, 1] and ex.answer == 9
    with pytest.raises(ValueError, match="not the sum"):
        task.example_from_record("Sum: 4 4 1", 10)
    with pytest.raises(ValueError, match="no 'Sum: <digits>'"):
        task.example_from_record("add 4 and 4", 8)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min_terms = 5, max_terms = 3"):
        ChainSumTask(min_terms=5, max_terms=3)
    with pytest.raises(ValueError, match="max_digit: must be in 1..9, got 0"):
        ChainSumTask(max_digit=0)


def test_training_problems_exclude_the_evaluation_problems():
    # 3-5 numbers from 1-5 is only 3,875 problems: independent draws overlapped (65% of the first 128 eval
    # problems were also training prompts, which the warm start trains on)
    task = ChainSumTask(num_train=2000, num_eval=256, min_terms=3, max_terms=5, max_digit=5)
    held_out = {tuple(e.meta["numbers"]) for e in task.eval_examples()}
    train = task.train_examples()
    assert len(train) == 2000 and not held_out & {tuple(e.meta["numbers"]) for e in train}
    with pytest.raises(ValueError, match="every one of the 4 problems"):
        ChainSumTask(num_train=5, num_eval=400, min_terms=2, max_terms=2, max_digit=2).train_examples()


def test_trace_correct_checks_every_step_in_order():
    nums = [3, 5, 2, 4]
    good = "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>14</answer>"
    assert trace_correct(good, nums)
    # a slip the teacher makes, then the TRUE total: a correct answer the trace does not support
    assert not trace_correct("<reasoning>3+5=8 8+2=11 11+4=15</reasoning>\n<answer>14</answer>", nums)
    assert not trace_correct("<reasoning>3+5=8 10+4=14</reasoning><answer>14</answer>", nums)  # a step missing
    assert not trace_correct("<reasoning>5+3=8 8+2=10 10+4=14</reasoning>", nums)  # order matters
    assert not trace_correct("<answer>14</answer>", nums) and not trace_correct(None, nums)  # type: ignore[arg-type]
    rng = random.Random(0)
    task = ChainSumTask(num_train=30, num_eval=1, min_terms=3, max_terms=5, max_digit=5)
    for ex in task.train_examples():  # the clean teacher is always right
        assert trace_correct(chainsum_completion(ex, rng), ex.meta["numbers"])


def test_verbose_teacher_restates_sums_so_correct_solutions_differ_in_length():
    ex = ChainSumTask(num_train=1, num_eval=1).train_examples()[0]
    nums = ex.meta["numbers"]
    texts = [chainsum_verbose_completion(ex, random.Random(i)) for i in range(40)]
    assert all(trace_correct(t, nums) and parse_int_answer(t) == sum(nums) for t in texts)
    assert len({len(t) for t in texts}) > 1  # same problem, same answer, different lengths
    # a restatement is part of the trace: a wrong one makes the trace wrong
    assert trace_correct("<reasoning>3+5=8 =8 8+2=10</reasoning>", [3, 5, 2])
    assert not trace_correct("<reasoning>3+5=8 =9 8+2=10</reasoning>", [3, 5, 2])
    assert not trace_correct("<reasoning>=8 3+5=8 8+2=10</reasoning>", [3, 5, 2])
