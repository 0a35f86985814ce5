"""The AR warm start's cache key (callbacks/ar_warmup.py): a changed teacher never reuses a stale warm start."""

from __future__ import annotations

from types import SimpleNamespace

from callbacks.ar_warmup import ScriptedSFTWarmup
from lit_rl.models.ar import TinyCausalLM
from lit_rl.tasks import ChainSumTask, chainsum


def test_cache_key_follows_the_teachers_text_not_only_its_name(tmp_path, monkeypatch):
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, max_positions=256)
    guess = SimpleNamespace(task=ChainSumTask(num_train=40, num_eval=4, answer_mod=2), max_prompt_len=32)
    plain = SimpleNamespace(task=ChainSumTask(num_train=40, num_eval=4), max_prompt_len=32)
    guessing = ScriptedSFTWarmup(steps=10, trace="guessing", error_rate=0.2, cache_dir=str(tmp_path))
    running = ScriptedSFTWarmup(steps=10, trace="running", error_rate=0.2, cache_dir=str(tmp_path))
    before = guessing.cache_path(policy, guess), running.cache_path(policy, plain)
    assert before[0] == guessing.cache_path(policy, guess)  # deterministic
    monkeypatch.setattr(chainsum, "GUESS_RATE", 0.5)  # the guessing teacher changes, its name does not
    assert guessing.cache_path(policy, guess) != before[0]
    assert running.cache_path(policy, plain) == before[1]  # the other teachers' keys do not move
    assert ScriptedSFTWarmup(steps=10, trace="running", error_rate=0.3, cache_dir=str(tmp_path)).cache_path(
        policy, plain) != before[1]


def test_cache_key_follows_the_thread_count(tmp_path):
    import torch

    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=1, intermediate_size=64, max_positions=256)
    dm = SimpleNamespace(task=ChainSumTask(num_train=40, num_eval=4), max_prompt_len=32)
    warm = ScriptedSFTWarmup(steps=10, trace="running", cache_dir=str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = warm.cache_path(policy, dm)
        torch.set_num_threads(2)
        two = warm.cache_path(policy, dm)
    finally:
        torch.set_num_threads(before)
    assert one != two
