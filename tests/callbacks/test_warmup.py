"""The format warm-up's cache key (callbacks/warmup.py): another task's problems under the same task name never
load stale warmed-up weights."""

from __future__ import annotations

from types import SimpleNamespace

from callbacks.warmup import FormatWarmup
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import CountdownTask

MINI = dict(num_train=30, number_range=[1, 9], target_range=[1, 30], test_size=8, system_prompt="",
            question_template="{numbers}>{target}")


def _dm(**task_args):
    task = CountdownTask(**(MINI | task_args))
    return SimpleNamespace(task=task, train_examples=task.train_examples(), max_prompt_len=32,
                           generation=SimpleNamespace(gen_length=16))


def test_cache_key_follows_the_training_problems_not_only_the_task_name(tmp_path):
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, max_positions=64)
    warm = FormatWarmup(steps=5, batch_size=4, trace="search", cache_dir=str(tmp_path))
    plain = warm.cache_path(policy, _dm())
    assert plain == warm.cache_path(policy, _dm())  # deterministic
    assert plain.name.startswith("format_warmup_countdown_")
    others = [warm.cache_path(policy, _dm(ordered=True)),  # the same name, other problems
              warm.cache_path(policy, _dm(number_range=[2, 9])),
              warm.cache_path(policy, _dm(question_template="{numbers} to {target}")),
              FormatWarmup(steps=6, batch_size=4, trace="search", cache_dir=str(tmp_path)).cache_path(policy, _dm())]
    assert len({plain, *others}) == 5
    assert FormatWarmup(steps=5, cache_dir=None).cache_path(policy, _dm()) is None


def test_cache_key_follows_the_thread_count(tmp_path):
    """A 1-thread sweep trial's warm-up rounds differently from a 2-thread run's: cached under one key, the
    2-thread run loaded the 1-thread weights and its curve moved in the 7th digit (found by
    scripts/bitwise_curves.py after conf/sweeps/embedded.yaml, whose trials run with threads 1)."""
    import torch

    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, max_positions=64)
    warm = FormatWarmup(steps=5, batch_size=4, trace="search", cache_dir=str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = warm.cache_path(policy, _dm())
        torch.set_num_threads(2)
        two = warm.cache_path(policy, _dm())
    finally:
        torch.set_num_threads(before)
    assert one != two
