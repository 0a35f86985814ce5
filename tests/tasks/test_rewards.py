"""TRL-style reward callables, the registry and the shared Task API."""

import pytest

from lit_rl.tasks import CountdownTask, MathTask, SudokuTask, get_task, resolve_reward_funcs
from lit_rl.tasks.rewards import completion_text, zero_reward

CALLS = []


def length_penalty(prompts, completions, **kwargs):
    """A user reward in TRL's signature (used via its "module.attr" path below)."""
    CALLS.append(sorted(kwargs))
    return [-0.01 * len(completion_text(c)) for c in completions]


class Holder:
    @staticmethod
    def bonus(prompts, completions, **kwargs):
        return [0.5 for _ in completions]


def test_resolve_callables_and_strings():
    funcs = resolve_reward_funcs([length_penalty, f"{__name__}.length_penalty", f"{__name__}:Holder.bonus",
                                  "lit_rl.tasks.rewards.zero_reward"])
    assert funcs[0] is length_penalty and funcs[1] is length_penalty
    assert funcs[2]([None], ["x"]) == [0.5] and funcs[3] is zero_reward
    assert resolve_reward_funcs(None) == [] and resolve_reward_funcs(length_penalty) == [length_penalty]


@pytest.mark.parametrize(
    "spec, match",
    [("no_such_module_xyz.f", "cannot import"), ("lit_rl.tasks.rewards.nope", "no attribute"), ("nodots", "expected"),
     (42, "not callable")],
)
def test_resolve_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        resolve_reward_funcs([spec])


def test_total_reward_adds_extra_funcs():
    CALLS.clear()
    task = SudokuTask(num_train=0, reward_funcs=[f"{__name__}.length_penalty"])
    ex = task.eval_examples()[0]
    text = f"<answer>{ex.answer}</answer>"
    assert task.total_reward(text, ex) == pytest.approx(1.0 - 0.01 * len(text))
    assert CALLS == [["answer", "prompt_id", "puzzle", "solution"]]  # dataset columns as kwargs


def test_registry():
    assert isinstance(get_task("sudoku", num_train=0), SudokuTask)
    assert isinstance(get_task("countdown", num_train=0), CountdownTask)
    assert isinstance(get_task("math500"), MathTask) and isinstance(get_task("math"), MathTask)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("chess")
    assert [SudokuTask.max_reward, CountdownTask.max_reward, MathTask.max_reward] == [1.0, 1.0, 3.0]
    assert [SudokuTask.correct_reward, CountdownTask.correct_reward, MathTask.correct_reward] == [1.0, 1.0, 2.0]
