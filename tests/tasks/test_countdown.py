"""Countdown: reward (§4), eval parsing (§5), generator and solver."""

import pytest

from lit_rl.tasks import CountdownTask
from lit_rl.tasks.countdown_arith import safe_eval
from lit_rl.tasks.countdown import countdown_reward, eval_expression, read_cd3_test, solve
from lit_rl.tasks.base import Example

NUMS, TARGET = [49, 55, 53], 51


@pytest.fixture(scope="module")
def task():
    return CountdownTask(num_train=300)


def ex(numbers=NUMS, target=TARGET):
    return Example("t", "q", (list(numbers), target), {"numbers": list(numbers), "target": target})


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<reasoning>..</reasoning>\n<answer>\n49 + 55 - 53\n</answer>", 1.0),
        ("<answer>(55 - 53) + 49</answer>", 1.0),
        ("<answer>49 - 55 + 53</answer>", 0.1),  # = 47: right numbers, wrong value
        ("<answer>49 + 55</answer>", 0.1),  # a number missing
        ("<answer>49 + 55 - 53 + 1</answer>", 0.1),  # an extra number
        ("<answer>\\boxed{49 + 55 - 53}</answer>", 0.1),  # right numbers, not plain arithmetic
        ("<answer>55 - 53 + 49 = 51</answer>", 0.1),  # "= 51" adds a number
        ("<answer>1+1</answer> <answer>49 + 55 - 53</answer>", 1.0),  # the last block counts
        ("<answer>49 + 55 - 53</answer> <answer>oops</answer>", 0.1),
        ("<answer>49 + 55 - 53", 0.0),  # never closed
        ("49 + 55 - 53", 0.0),  # no block
        ("", 0.0),
    ],
)
def test_reward(task, completion, expected):
    assert task.reward(completion, ex()) == pytest.approx(expected)


def test_reward_arithmetic_edges():
    assert countdown_reward("<answer>6/3*4</answer>", [6, 3, 4], 8) == 1.0  # true division, 8.0
    assert countdown_reward("<answer>-1-2+3</answer>", [1, 2, 3], 0) == 1.0  # unary minus
    assert countdown_reward("<answer>3/(5-5)</answer>", [5, 5, 3], 1) == 0.1  # division by zero
    assert countdown_reward("<answer>9**9**9</answer>", [9, 9, 9], 1) == 0.1  # power tower: rejected, not run
    assert countdown_reward("<answer>8//3</answer>", [8, 3], 2) == 0.1  # floor division rejected
    assert countdown_reward("<answer>__import__('os') or 1+2+3</answer>", [1, 2, 3], 6) == 0.1
    assert countdown_reward("<answer>__import__('os').system('ls')</answer>", [1, 2, 3], 6) == 0.1
    assert countdown_reward("<answer>" + "(" * 150 + "1+2+3" + ")" * 150 + "</answer>", [1, 2, 3], 6) == 1.0
    assert countdown_reward("<answer>" + "(" * 500 + "1+2+3" + ")" * 500 + "</answer>", [1, 2, 3], 6) == 0.1
    assert countdown_reward("<answer>" + "9" * 100_000 + "</answer>", [1, 2, 3], 6) == 0.1
    assert countdown_reward("<answer>08 + 1 + 2</answer>", [8, 1, 2], 11) == 0.1  # Python rejects "08" too


def test_format_values_configurable():
    t = CountdownTask(num_train=0, wrong_numbers_reward=0.0, wrong_result_reward=0.05)
    assert t.reward("<answer>49 + 55</answer>", ex()) == 0.0
    assert t.reward("<answer>49 - 55 + 53</answer>", ex()) == 0.05
    assert t.reward("<answer>49 + 55 - 53</answer>", ex()) == 1.0
    assert t.reward("no answer", ex()) == 0.0


def test_decimal_glue_scores_by_default_and_not_without_decimals():
    # the reference counts digit runs, so "1.5" uses the given 1 and 5: 1.5 * 2 = 3 hits
    gl = Example(id="g", question="q", answer=([1, 5, 2], 3), meta={"numbers": [1, 5, 2], "target": 3})
    ref, strict = CountdownTask(num_train=0), CountdownTask(num_train=0, decimals=False)
    glued, honest = "<answer>1.5*2</answer>", "<answer>1*5-2</answer>"
    assert ref.reward(glued, gl) == 1.0 and ref.evaluate(glued, gl).correct == 1
    assert strict.reward(glued, gl) == 0.1 and strict.evaluate(glued, gl).correct == 0
    assert strict.evaluate(glued, gl, parser="reward").correct == 0
    assert strict.reward(honest, gl) == 1.0 and strict.evaluate(honest, gl).correct == 1
    assert ref.evaluate("\\boxed{1.5*2}", gl).correct == 1 and strict.evaluate("\\boxed{1.5*2}", gl).correct == 0


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("<answer>\n\\boxed{49 + 55 - 53}\n</answer>", True),  # LLaDA style
        ("\\boxed{1+1} and finally \\boxed{55 - 53 + 49}", True),  # last box
        ("<answer>\\boxed{49 \\times 55 \\div 53}</answer>", False),  # operators converted, wrong value
        ("<answer>55 - 53 + 49 = 51</answer>", True),  # "= value" dropped
        ("<answer>49 + 55 - 53</answer>", True),  # no box: the answer block
        ("\\boxed{49 + 55 - 53 <answer>49 + 55 - 53</answer>", True),  # unbalanced box: the answer block
        ("so 49 + 55 - 53 = 51", True),  # no box, no block: the whole text
        ("<answer>49 + 55 + 53</answer>", False),
        ("<answer>49 + 55</answer>", False),
        ("", False),
    ],
)
def test_eval(task, completion, correct):
    assert task.evaluate(completion, ex()) == (int(correct), 1)


def test_eval_expression_rules():
    assert eval_expression("x \\boxed{2 \\times 3 \\cdot 4 \\div 6} y") == "2 * 3 * 4 / 6"
    assert eval_expression("<answer>12 + 3 = 15</answer>") == "12 + 3"
    assert eval_expression("text only") == "text only"


def test_reward_parser_for_eval(task):
    assert task.evaluate("<answer>\\boxed{49 + 55 - 53}</answer>", ex(), parser="reward") == (0, 1)
    assert task.evaluate("<answer>49 + 55 - 53</answer>", ex(), parser="reward") == (1, 1)


def test_test_set(task):
    evs = task.eval_examples()
    assert len(evs) == 256
    assert evs[0].answer == ([30, 100, 93], 23) and evs[0].id == "countdown-test-0"
    assert evs[0].meta == {"numbers": [30, 100, 93], "target": 23}


def test_generator(task):
    exs = task.train_examples()
    assert [e.id for e in exs[:2]] == ["countdown-train-0", "countdown-train-1"]
    test = {(tuple(sorted(n)), t) for n, t in read_cd3_test()}
    for e in exs:
        numbers, target = e.answer
        assert len(numbers) == 3 and all(1 <= n <= 100 for n in numbers) and 1 <= target <= 100
        assert (tuple(sorted(numbers)), target) not in test
        expr = solve(numbers, target)
        assert expr is not None, e
        assert task.reward(f"<answer>{expr}</answer>", e) == 1.0
    assert [e.answer for e in CountdownTask(num_train=20).train_examples()] == [e.answer for e in exs[:20]]
    assert len({e.question for e in exs}) > 290


def test_solve():
    assert solve([1, 1, 1], 100) is None
    expr = solve([30, 100, 93], 23)
    assert expr is not None and countdown_reward(f"<answer>{expr}</answer>", [30, 100, 93], 23) == 1.0
    expr = solve([4, 6, 3], 8)  # needs division: 6/3*4
    assert expr is not None and abs(safe_eval(expr) - 8) < 1e-9
    # every test problem that the reference's target range allows is solvable
    assert sum(solve(list(n), t) is not None for n, t in read_cd3_test()) == 256


def test_prompts():
    t = CountdownTask(num_train=1)
    (msg,) = t.messages(t.eval_examples()[0])
    assert msg["content"].startswith("\nRespond in the following format:\n<reasoning>\n")
    assert ("</answer>\n\nUsing only the numbers [30, 100, 93], create an arithmetic expression that evaluates to "
            "exactly 23." in msg["content"])
    ev = CountdownTask(num_train=1, prompt_style="d1_eval")
    (msg,) = ev.messages(ev.eval_examples()[0])
    assert msg["content"].endswith("</answer>\n\nNumbers: [30, 100, 93]\nTarget: 23")
    with pytest.raises(ValueError, match="prompt_style"):
        CountdownTask(prompt_style="nope")
