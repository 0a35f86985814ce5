"""Every scorer on hostile text: no exception, no hang, a reward from the task's allowed set."""

import time

import pytest

from lit_rl.tasks import CountdownTask, MathTask, SudokuTask

M = 1_000_000
ADVERSARIAL = {
    "empty": "",
    "1MB_x": "x" * M,
    "1MB_digits": "1" * M,
    "1MB_whitespace": " \n" * (M // 2),
    "many_open_tags": "<answer>" * (M // 8),
    "many_blocks": "<answer>1+2</answer>" * (M // 19),
    "unclosed_boxes": "\\boxed{" * (M // 7),
    "open_braces": "\\boxed" + "{" * M,
    "close_braces": "\\boxed" + "}" * M,
    "backticks": "<answer>" + "```" * (M // 3),
    "fence_whitespace": "<answer>```" + " " * M,
    "equals_chain": "1+" * (M // 2) + "=5",
    "fracs": "\\boxed{" + "\\frac" * (M // 5) + "}",
    "sqrts": "<answer>" + "\\sqrt" * (M // 5) + "</answer>",
    "huge_number": "<answer>" + "9" * 100_000 + "</answer>",
    "pow_tower": "<answer>9**9**9**9**9**9</answer>",
    "import": "<answer>__import__('os').system('echo pwned')</answer>",
    "dunder_numbers": "<answer>().__class__.__bases__[0] or 49+55-53</answer>",
    "deep_parens": "<answer>" + "(" * 5000 + "49+55-53" + ")" * 5000 + "</answer>",
    "unary_chain": "<answer>" + "-" * 10_000 + "1</answer>",
    "nul_and_unicode": "<answer>\x00\u0663\u00b2\ud7ff 1+1</answer>",
    "sixteen_then_spaces": "1234123412341234" + " " * M,
    "after_close_spaces": "</answer>" + " " * M,
    "text_units": "\\boxed{1\\text{ a}\\text{ b}\\text{ c}}",
    "slash_bigints": "\\boxed{" + "9" * 5000 + "/" + "9" * 5000 + "}",
}

TASKS = {
    "sudoku": (SudokuTask(num_train=0), {0.0} | {k / 8 for k in range(9)}),
    "countdown": (CountdownTask(num_train=0), {0.0, 0.1, 1.0}),
    "math500": (MathTask(), {0.25, 0.5, 0.75, 1.0, 2.25, 2.5, 2.75, 3.0}),
}


@pytest.mark.parametrize("text_name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_scorers_survive(task_name, text_name):
    task, allowed = TASKS[task_name]
    example = task.eval_examples()[0]
    text = ADVERSARIAL[text_name]
    t0 = time.perf_counter()
    r = task.reward(text, example)
    e = task.evaluate(text, example)
    e2 = task.evaluate(text, example, parser="reward")
    elapsed = time.perf_counter() - t0
    assert r in allowed or any(abs(r - a) < 1e-9 for a in allowed), r
    assert 0 <= e.correct <= e.total and 0 <= e2.correct <= e2.total
    assert elapsed < 5.0, f"{task_name}/{text_name} took {elapsed:.2f}s"


def test_adversarial_values_countdown():
    task, _ = TASKS["countdown"]
    ex = task.eval_examples()[0]  # [30, 100, 93] -> 23
    assert task.reward(ADVERSARIAL["pow_tower"], ex) == 0.1  # wrong numbers
    assert task.reward(ADVERSARIAL["import"], ex) == 0.1
    assert task.reward("<answer>__import__('os') and 93 + 30 - 100</answer>", ex) == 0.1  # not arithmetic
    assert task.reward("<answer>" + "(" * 5000 + "93+30-100" + ")" * 5000 + "</answer>", ex) == 0.1
    assert task.reward(ADVERSARIAL["many_blocks"], ex) == 0.1
    assert task.reward(ADVERSARIAL["empty"], ex) == 0.0
