"""Tasks: prompts, datasets, training rewards and evaluation metrics (docs/tasks.md).

>>> task = get_task("sudoku", num_train=2)
>>> ex = task.eval_examples()[0]
>>> task.reward("<answer>" + ex.answer + "</answer>", ex)
1.0
"""

from __future__ import annotations

from typing import Any

from lit_rl.tasks.base import EvalScore, Example, Task
from lit_rl.tasks.chainsum import ChainSumTask
from lit_rl.tasks.countdown import CountdownTask
from lit_rl.tasks.math_task import MathTask
from lit_rl.tasks.prompt_task import PromptTask
from lit_rl.tasks.rewards import RewardFunc, resolve_reward_funcs
from lit_rl.tasks.sudoku import SudokuTask

TASKS: dict[str, type[Task]] = {
    "sudoku": SudokuTask,
    "countdown": CountdownTask,
    "math500": MathTask,
    "math": MathTask,
    "chainsum": ChainSumTask,
    "prompts": PromptTask,
}


def get_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``"sudoku"``, ``"countdown"``, ``"math500"``/``"math"``) with its options."""
    try:
        cls = TASKS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown task {name!r}: expected one of {sorted(TASKS)}") from None
    return cls(**kwargs)


__all__ = [
    "ChainSumTask",
    "CountdownTask",
    "EvalScore",
    "Example",
    "MathTask",
    "PromptTask",
    "RewardFunc",
    "SudokuTask",
    "TASKS",
    "Task",
    "get_task",
    "resolve_reward_funcs",
]
