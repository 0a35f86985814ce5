"""The task registry: every tool finds a task by name here (``score``, ``rollouts scripted``, the scripted
external backend, the warm-up callbacks, configs that say ``task: sudoku``).

A task is its class (prompt, verifier, evaluation) and, optionally, a scripted solver: trace styles
``style -> writer(example, rng, error_rate) -> completion`` (the first is the default, what external pools
use) and a verbose first-stage writer for the scripted backend's two-stage length control. A new task is
its file and one :func:`register_task` call (here, or in your own package before the tools run).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from lit_rl.tasks.base import Example, Task
from lit_rl.tasks.chainsum import (ChainSumTask, chainsum_completion, chainsum_guessing_completion,
                                   chainsum_verbose_completion)
from lit_rl.tasks.countdown import CountdownTask
from lit_rl.tasks.math_task import MathTask
from lit_rl.tasks.prompt_task import PromptTask
from lit_rl.tasks.scripted import (
    countdown_completion,
    countdown_random_try,
    countdown_trials_pool_completion,
    sudoku_completion,
    sudoku_grid_completion,
    sudoku_grid_verbose_completion,
    verbose_trace,
)
from lit_rl.tasks.sudoku import SudokuTask
from lit_rl.tasks.word_problems import WordProblemTask

__all__ = ["REGISTRY", "TaskEntry", "format_warmup_text", "known_traces", "register_task", "scripted_tasks",
           "task_entry"]

TraceWriter = Callable[[Example, random.Random, float], str]
VerboseWriter = Callable[[str, Example, str, random.Random], str]


@dataclass(frozen=True)
class TaskEntry:
    """What the tools know about one task.

    Attributes:
        name: the registry name (``get_task(name)``, ``--task name``).
        cls: the :class:`~lit_rl.tasks.base.Task` subclass.
        traces: scripted trace styles; the first is the default.
        verbose: the scripted backend's wordy first stage for a compact trace (``None``: compact only).
        recipe_trace: the style the shipped recipe's external pool uses (``rollouts scripted``'s default
            ``--trace``; ``None``: the first style). Sudoku: ``grid``; ``docs/erils.md`` shows the
            ``deduction`` trace leaves the model at chance.
    """

    name: str
    cls: type[Task]
    traces: dict[str, TraceWriter] = field(default_factory=dict)
    verbose: VerboseWriter | None = None
    recipe_trace: str | None = None

    @property
    def default_trace(self) -> TraceWriter:
        if not self.traces:
            raise ValueError(f"task {self.name!r} has no scripted solver (known: {sorted(scripted_tasks())})")
        return next(iter(self.traces.values()))


REGISTRY: dict[str, TaskEntry] = {}


def register_task(entry: TaskEntry, *aliases: str) -> TaskEntry:
    """Add ``entry`` under its name (and ``aliases``); a name already taken by another class is refused."""
    for name in (entry.name, *aliases):
        old = REGISTRY.get(name)
        if old is not None and old.cls is not entry.cls:
            raise ValueError(f"task name {name!r} is taken by {old.cls.__name__}")
        REGISTRY[name] = entry
    return entry


def task_entry(name: str) -> TaskEntry:
    """The entry of ``name`` (case-insensitive); a clear error listing the known names otherwise."""
    try:
        return REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown task {name!r}: expected one of {sorted(REGISTRY)}") from None


def scripted_tasks() -> list[str]:
    """Names of the tasks with a scripted solver."""
    return [n for n, e in REGISTRY.items() if e.traces]


def known_traces(name: str) -> dict[str, TraceWriter]:
    """The trace styles of ``name`` (empty for an unknown task or one without a scripted solver)."""
    entry = REGISTRY.get(name)
    return dict(entry.traces) if entry else {}


register_task(TaskEntry("sudoku", SudokuTask, {
    "deduction": sudoku_completion, "grid": sudoku_grid_completion, "grid_verbose": sudoku_grid_verbose_completion,
}, verbose=verbose_trace, recipe_trace="grid"))
register_task(TaskEntry("countdown", CountdownTask, {"search": countdown_completion,
                                                     "trials": countdown_trials_pool_completion},
                        verbose=verbose_trace))
register_task(TaskEntry("math500", MathTask), "math")
register_task(TaskEntry("chainsum", ChainSumTask,
                        {"running": chainsum_completion, "verbose": chainsum_verbose_completion,
                         "guessing": chainsum_guessing_completion}))
register_task(TaskEntry("prompts", PromptTask))
register_task(TaskEntry("word_problems", WordProblemTask))


def format_warmup_text(task_name: str, example: Example, rng: random.Random, style: str | None = None) -> str:
    """A format-only completion: random reasoning, an answer unrelated to the task.

    Sudoku, ``style`` ``"deduction"`` (default): random ``rcd`` steps of random length, and an answer that
    copies the givens with random digits in the blanks (cell accuracy ~chance). ``"grid"``: the format of
    :func:`sudoku_grid_completion` with random blanks: the givens copied, random digits in the blanks, the
    same 16 digits as the answer (fixed length; blank-cell accuracy ~chance, so it teaches the format and
    the copying, not the solving). Countdown, ``"search"`` (default): a random expression of the three
    numbers after random pairs; ``"trials"``: one random try in the trials teacher's format, its numbers in the
    prompt's order (:func:`~lit_rl.tasks.scripted.countdown_random_try`: the numbers copied, random operators,
    so it teaches the format and the copying, not the solving).
    """
    if task_name == "countdown" and style == "trials":
        return countdown_random_try(example, rng)
    if task_name == "sudoku" and style == "grid":
        g = "".join(ch if ch != "0" else str(rng.randint(1, 4)) for ch in example.meta["puzzle"])
        return f"<reasoning>{g}</reasoning>\n<answer>{g}</answer>"
    if style not in (None, *known_traces(task_name)):
        raise ValueError(f"no format warm-up style {style!r} for task {task_name!r} "
                         f"(known: {sorted(known_traces(task_name))})")
    if task_name == "sudoku":
        puzzle = example.meta["puzzle"]
        n = rng.randint(0, 12)
        trace = "".join(f"{rng.randint(1, 4)}{rng.randint(1, 4)}{rng.randint(1, 4)}" for _ in range(n))
        answer = "".join(ch if ch != "0" else str(rng.randint(1, 4)) for ch in puzzle)
        return f"<reasoning>{trace}</reasoning>\n<answer>{answer}</answer>"
    if task_name == "countdown":
        numbers, _ = example.answer
        nums = [str(int(x)) for x in numbers]
        rng.shuffle(nums)
        ops = [rng.choice("+-*/") for _ in range(2)]
        n = rng.randint(0, 4)
        trace = ", ".join(f"{rng.choice(nums)}{rng.choice('+-*')}{rng.choice(nums)}" for _ in range(n))
        return f"<reasoning>{trace}</reasoning>\n<answer>({nums[0]}{ops[0]}{nums[1]}){ops[1]}{nums[2]}</answer>"
    if isinstance(example.answer, str) and example.answer:  # any task with a text answer (PromptTask)
        chars = sorted(set(example.answer))
        trace = "".join(rng.choice(chars) for _ in range(rng.randint(0, 8)))
        answer = "".join(rng.choice(chars) for _ in range(len(example.answer)))
        return f"<reasoning>{trace}</reasoning>\n<answer>{answer}</answer>"
    raise ValueError(f"no format warm-up texts for task {task_name!r} "
                     "(known: sudoku, countdown, tasks with text answers)")
