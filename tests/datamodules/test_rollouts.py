from pathlib import Path

import pytest
import torch

from datamodules import RolloutDataModule
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.rollouts.types import Source
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"


def _dm(**kw):
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)
    args = dict(pool_path=str(POOL), prompts_per_batch=3, g_on=2, g_ext=2, generation=DecodeSettings(64, 32, 4, 1.0), max_prompt_len=64, eval_size=4)
    args.update(kw)
    dm = RolloutDataModule(task, **args)
    dm.setup()
    return dm


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


def test_ranks_get_disjoint_prompts_with_aligned_external_rollouts():
    dm = _dm()
    # rank r of W takes positions [s*B*W + r*B, ...): two ranks never share a prompt in a step
    pos0 = dm.stream_positions(4, rank=0, world=2)
    pos1 = dm.stream_positions(4, rank=1, world=2)
    assert pos0 == [24, 25, 26] and pos1 == [27, 28, 29]
    batch = dm.prompt_batch(0)
    for ex, recs in zip(batch.examples, batch.external):
        assert len(recs) == 2 and all(r.prompt_id == ex.id for r in recs)


def test_produce_rollouts_tags_sources_and_scores_with_the_verifier():
    torch.manual_seed(0)
    dm = _dm()
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=160)
    batch = dm.prompt_batch(0)
    ro = dm.produce_rollouts(batch, policy)
    # 3 prompts x (2 on-policy + 2 external) rows, on-policy first
    assert len(ro) == 12
    assert ro.source.tolist() == [Source.ON_POLICY] * 6 + [Source.EXTERNAL] * 6
    assert ro.group.tolist() == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    assert ro.input_ids.shape[1] == ro.prompt_len + ro.completion_mask.shape[1]
    for i in range(6, 12):
        ex = batch.examples[ro.group[i]]
        assert ro.rewards[i].item() == pytest.approx(dm.task.reward(ro.texts[i], ex))
        assert ro.completion_mask[i].sum().item() == ro.lengths[i].item()
    # the same step draws the same on-policy rollouts (seeded by (seed, step))
    again = dm.produce_rollouts(dm.prompt_batch(0), policy)
    assert torch.equal(again.input_ids, ro.input_ids)


def test_cursor_state_round_trip_and_seed_mismatch():
    dm = _dm()
    dm.cursor = 17
    other = _dm()
    other.load_state_dict(dm.state_dict())
    assert other.cursor == 17
    with pytest.raises(ValueError, match="data.seed"):
        _dm(seed=3).load_state_dict(dm.state_dict())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(g_ext=2, pool_path=None), "data.pool_path is required"),
        (dict(g_on=0, g_ext=0), "g_on"),
        (dict(prompts_per_batch=0), "data.prompts_per_batch must be >= 1, got 0"),
        (dict(eval_batch_size=0), "data.eval_batch_size must be >= 1, got 0"),  # was a ZeroDivisionError in val_dataloader
        (dict(eval_size=0), r"data.eval_size must be >= 1 or null \(all\), got 0"),
        (dict(eval_size=-3), r"data.eval_size must be >= 1 or null \(all\), got -3"),  # list[:-3] dropped 3 prompts
        (dict(num_train_prompts=-1), r"data.num_train_prompts must be >= 1 or null \(all\), got -1"),
        (dict(max_prompt_len=0), r"data.max_prompt_len must be >= 1 or null \(no cut\), got 0"),  # ids[-0:] kept all
        (dict(pool_path="pool.jsonl", group_size=5), r"data.group_size \(G = 5\) must equal data.g_on \+ data.g_ext = 4 \+ 2 = 6"),
    ],
)
def test_bad_arguments_fail_fast(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutDataModule(SudokuTask(num_train=10), **kwargs)


def test_decode_settings_validation_names_the_field():
    with pytest.raises(ValueError, match="gen_length .* multiple of generation.block_length"):
        DecodeSettings(gen_length=60, block_length=32, steps=30)
    with pytest.raises(ValueError, match="steps .* divisible by the number of blocks"):
        DecodeSettings(gen_length=64, block_length=32, steps=5)


def test_eval_batches_split_over_ranks_and_too_few_batches_fail_clearly(monkeypatch):
    dm = _dm(eval_size=8, eval_batch_size=2)  # 4 eval batches
    monkeypatch.setattr(dm, "_world", lambda: (1, 2))
    assert [b.step for b in dm.val_dataloader()] == [-2, -4]  # rank 1 of 2 takes batches 1 and 3
    dm = _dm(eval_size=4, eval_batch_size=4)  # 1 batch for 2 ranks: rank 1 would get none
    monkeypatch.setattr(dm, "_world", lambda: (1, 2))
    with pytest.raises(ValueError, match=r"data.eval_size \(4\) / data.eval_batch_size \(4\) gives 1 eval batch"):
        dm.val_dataloader()
