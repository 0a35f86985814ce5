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
from lit_rl.tasks.word_problems import WordProblemTask

from lit_rl.tasks.registry import REGISTRY, TaskEntry, register_task, task_entry  # noqa: E402

#: ``name -> Task class`` (the registry's classes; aliases included)
TASKS: dict[str, type[Task]] = {name: entry.cls for name, entry in REGISTRY.items()}


def get_task(name: str, **kwargs: Any) -> Task:
    """Build a task by name (``"sudoku"``, ``"countdown"``, ``"math500"``/``"math"``, ``"chainsum"``,
    ``"prompts"``, ``"word_problems"``, or one added with :func:`~lit_rl.tasks.registry.register_task`) with its
    options."""
    return task_entry(name).cls(**kwargs)


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
    "WordProblemTask",
    "Task",
    "TaskEntry",
    "get_task",
    "register_task",
    "task_entry",
    "resolve_reward_funcs",
]
