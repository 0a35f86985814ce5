"""Chain sums (the double-rollout testbed task): data, the verifier on untrusted text, the scripted teacher."""

from __future__ import annotations

import random

import pytest

from lit_rl.tasks import ChainSumTask, get_task
from lit_rl.tasks.registry import REGISTRY, known_traces
from lit_rl.tasks.chainsum import (
    GUESS_RATE,
    chainsum_completion,
    chainsum_guessing_completion,
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
    assert REGISTRY["chainsum"].default_trace is chainsum_completion and "running" in known_traces("chainsum")
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


def test_answer_mod_asks_for_the_total_mod_m_and_keeps_the_problems():
    plain, mod = ChainSumTask(num_train=5, num_eval=3), ChainSumTask(num_train=5, num_eval=3, answer_mod=2)
    for a, b in zip(plain.eval_examples(), mod.eval_examples()):
        assert b.meta["numbers"] == a.meta["numbers"] and b.answer == a.answer % 2
        assert b.question == a.question + " mod 2" and b.meta["answer_mod"] == 2
    ex = mod.example_from_record("Sum: 4 4 1 mod 2", 1)  # 9 mod 2
    assert ex.answer == 1 and ex.meta["numbers"] == [4, 4, 1]
    with pytest.raises(ValueError, match="not the sum mod 2"):
        mod.example_from_record("Sum: 4 4 1 mod 2", 9)
    e = mod.example_from_record("Sum: 3 5 2 4 mod 2", 0)
    assert mod.reward("<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>0</answer>", e) == 1.0
    assert mod.reward("<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>14</answer>", e) == 0.0
    assert chainsum_completion(e, random.Random(0)) == "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>0</answer>"
    with pytest.raises(ValueError, match="answer_mod: must be null or in 2..1000, got 1"):
        ChainSumTask(answer_mod=1)


def test_plain_teachers_draw_the_same_stream_as_before_the_guessing_option():
    # the committed chain-sum curves depend on the teacher's text: guess_rate 0 must not add a draw
    e = ChainSumTask(num_train=1, num_eval=1).example_from_record("Sum: 3 5 2 4", 14)
    before = [  # the teacher's output before the option existed (lit_rl at 2aa5323), and its next draw
        "<reasoning>3+5=10 10+2=12 12+4=16</reasoning>\n<answer>14</answer>",
        "<reasoning>3+5=8 8+2=10 10+4=12</reasoning>\n<answer>12</answer>",
        "<reasoning>3+5=8 8+2=10 10+4=13</reasoning>\n<answer>13</answer>",
        "<reasoning>3+5=7 7+2=9 9+4=13</reasoning>\n<answer>13</answer>",
        "<reasoning>3+5=8 8+2=10 10+4=12</reasoning>\n<answer>14</answer>",
        "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>14</answer>",
    ]
    rng = random.Random(7)
    assert [chainsum_completion(e, rng, 0.5, guess_rate=0.0) for _ in range(6)] == before
    assert rng.random() == 0.5829969044604073
    with pytest.raises(ValueError, match="guess_rate needs a task with answer_mod"):
        chainsum_completion(e, random.Random(0), guess_rate=0.5)


def test_guessing_teacher_stops_early_and_guesses_the_parity():
    task = ChainSumTask(num_train=400, num_eval=1, answer_mod=2)
    rng = random.Random(0)
    texts = [chainsum_completion(e, rng, 0.0, guess_rate=1.0) for e in task.train_examples()]
    for t, e in zip(texts, task.train_examples()):
        steps = t.split("<reasoning>")[1].split("</reasoning>")[0].split()
        assert len(steps) < e.meta["terms"] - 1  # every trace is inconclusive
        assert not trace_correct(t, e.meta["numbers"]) and parse_int_answer(t) in (0, 1)
    hits = sum(task.reward(t, e) for t, e in zip(texts, task.train_examples())) / len(texts)
    assert 0.42 < hits < 0.58  # a guess is right half the time
    rng = random.Random(0)
    mixed = [chainsum_guessing_completion(e, rng) for e in task.train_examples()]
    inconclusive = sum(len(t.split("</reasoning>")[0].split()) < e.meta["terms"] - 1
                       for t, e in zip(mixed, task.train_examples())) / len(mixed)
    assert abs(inconclusive - GUESS_RATE) < 0.07
    assert "guessing" in known_traces("chainsum")
