"""The task registry: one place every tool finds a task by name; a new task is one registration."""

from __future__ import annotations

import random

import pytest

from lit_rl.score import TASK_CHOICES
from lit_rl.tasks import TASKS, get_task
from lit_rl.tasks.base import EvalScore, Example, Task
from lit_rl.tasks.registry import REGISTRY, TaskEntry, register_task, scripted_tasks, task_entry


@pytest.mark.parametrize("name", sorted(scripted_tasks()))
def test_every_scripted_trace_is_right_by_its_own_verifier(name):
    task = get_task(name, num_train=5)
    ex = task.train_examples()[0]
    for style, write in task_entry(name).traces.items():
        if (name, style) == ("chainsum", "guessing"):  # wrong on purpose, on a parity task (test_chainsum.py)
            continue
        assert (task.reward(write(ex, random.Random(0), 0.0), ex)
                == pytest.approx(task.max_reward if name != "countdown" else 1.0)), style


def test_the_tools_read_the_registry():
    assert set(TASK_CHOICES) == set(REGISTRY) and TASKS == {n: e.cls for n, e in REGISTRY.items()}
    assert task_entry("MATH").cls is task_entry("math500").cls  # aliases, case-insensitive
    with pytest.raises(ValueError, match="unknown task 'nope': expected one of"):
        get_task("nope")


class _Echo(Task):
    """A task written by a user: the answer is the question."""

    name = "echo"
    max_reward = 1.0

    def train_examples(self):
        return [Example(id=f"echo-{i}", question=str(i), answer=str(i)) for i in range(3)]

    def eval_examples(self):
        return self.train_examples()

    def reward(self, completion, example):
        return float(f"<answer>{example.answer}</answer>" in completion)

    def evaluate(self, completion, example, parser="eval"):
        return EvalScore(self.reward(completion, example), 1.0)

    def example_from_record(self, question, ground_truth, index=0, **extra):
        return Example(id=f"echo-{index}", question=question, answer=str(ground_truth))


def test_a_new_task_is_one_registration(monkeypatch):
    monkeypatch.setattr("lit_rl.tasks.registry.REGISTRY", dict(REGISTRY))
    register_task(TaskEntry("echo", _Echo, {"copy": lambda ex, rng, err: f"<answer>{ex.answer}</answer>"}))
    assert "echo" in scripted_tasks() and isinstance(get_task("echo"), _Echo)
    ex = get_task("echo").train_examples()[1]
    assert get_task("echo").reward(task_entry("echo").default_trace(ex, random.Random(0), 0.0), ex) == 1.0
    with pytest.raises(ValueError, match="task name 'sudoku' is taken"):
        register_task(TaskEntry("sudoku", _Echo))
