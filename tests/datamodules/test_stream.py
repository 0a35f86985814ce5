"""datamodules/stream.py: the seeded, resumable prompt stream under the rollout DataModules."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the small RolloutDataModule of test_rollouts
from test_rollouts import _dm  # noqa: E402


def test_stream_is_seeded_and_covers_every_prompt_once_per_pass():
    dm = _dm(prompts_per_batch=4)
    n = len(dm.train_examples)
    assert n == 1000
    steps = n // 4
    ids = [e.id for s in range(steps) for e in dm.prompt_batch(s).examples]
    assert len(ids) == len(set(ids)) == n  # one full pass: nothing repeated, nothing skipped
    again = _dm(prompts_per_batch=4)
    assert [e.id for e in again.prompt_batch(5).examples] == [e.id for e in dm.prompt_batch(5).examples]
    other = _dm(prompts_per_batch=4, seed=7)
    assert [e.id for e in other.prompt_batch(0).examples] != [e.id for e in dm.prompt_batch(0).examples]


def test_cursor_state_round_trip_and_seed_mismatch():
    dm = _dm()
    dm.cursor = 17
    other = _dm()
    other.load_state_dict(dm.state_dict())
    assert other.cursor == 17
    with pytest.raises(ValueError, match="data.seed"):
        _dm(seed=3).load_state_dict(dm.state_dict())


def test_eval_batches_split_over_ranks_and_too_few_batches_fail_clearly(monkeypatch):
    dm = _dm(eval_size=8, eval_batch_size=2)  # 4 eval batches
    monkeypatch.setattr(dm, "_world", lambda: (1, 2))
    assert [b.step for b in dm.val_dataloader()] == [-2, -4]  # rank 1 of 2 takes batches 1 and 3
    dm = _dm(eval_size=4, eval_batch_size=4)  # 1 batch for 2 ranks: rank 1 would get none
    monkeypatch.setattr(dm, "_world", lambda: (1, 2))
    with pytest.raises(ValueError, match=r"data.eval_size \(4\) / data.eval_batch_size \(4\) gives 1 eval batch"):
        dm.val_dataloader()


def test_generation_seeds_differ_across_ranks_and_repeat_per_step(monkeypatch):
    dm = _dm()
    seeds = {}
    for rank in (0, 1):
        monkeypatch.setattr(type(dm), "_world", lambda self, r=rank: (r, 2))
        seeds[rank] = [dm.generation_seed(s) for s in range(3)]
    assert seeds[0] != seeds[1] and not set(seeds[0]) & set(seeds[1])
    assert len(set(seeds[0])) == 3
    monkeypatch.setattr(type(dm), "_world", lambda self: (1, 2))
    assert [dm.generation_seed(s) for s in range(3)] == seeds[1]  # a resumed rank re-derives its seeds
