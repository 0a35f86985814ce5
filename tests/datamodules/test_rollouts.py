from pathlib import Path

import pytest
import torch

from datamodules import RolloutDataModule
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import Source
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"


def _dm(**kw):
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)
    args = dict(pool_path=str(POOL), prompts_per_batch=3, g_on=2, g_ext=2, generation=DecodeSettings(64, 32, 4, 1.0),
                max_prompt_len=64, eval_size=4)
    args.update(kw)
    dm = RolloutDataModule(task, **args)
    dm.setup()
    return dm


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


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(g_ext=2, pool_path=None), "pool_path: required when g_ext > 0"),
        (dict(g_on=0, g_ext=0), "g_on"),
        (dict(prompts_per_batch=0), "prompts_per_batch: must be >= 1, got 0"),
        # was a ZeroDivisionError in val_dataloader
        (dict(eval_batch_size=0), "eval_batch_size: must be >= 1, got 0"),
        (dict(eval_size=0), r"eval_size: must be >= 1 or null \(all\), got 0"),
        (dict(eval_size=-3), r"eval_size: must be >= 1 or null \(all\), got -3"),  # list[:-3] dropped 3 prompts
        (dict(num_train_prompts=-1), r"num_train_prompts: must be >= 1 or null \(all\), got -1"),
        (dict(max_prompt_len=0), r"max_prompt_len: must be >= 1 or null \(no cut\), got 0"),  # ids[-0:] kept all
        (dict(pool_path="pool.jsonl", group_size=5),
         r"group_size: G = 5 but g_on \+ g_ext = 4 \+ 2 = 6"),
    ],
)
def test_bad_arguments_fail_fast(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutDataModule(SudokuTask(num_train=10), **kwargs)


def test_decode_settings_validation_names_the_field():
    with pytest.raises(ValueError, match="gen_length: L_gen = 60 is not a multiple of block_length = 32"):
        DecodeSettings(gen_length=60, block_length=32, steps=30)
    with pytest.raises(ValueError, match="steps .* divisible by the number of blocks"):
        DecodeSettings(gen_length=64, block_length=32, steps=5)


def _tiny_policy() -> TinyDiffusionLM:
    torch.manual_seed(0)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=200)


def test_on_policy_rows_keep_their_own_width_when_external_rows_are_wider():
    # L_gen 32 while the scripted external completions take ~49 tokens: on-policy rows are padded to the
    # external width. The padding is not the policy's: no length, loss or attention may reach it (before the
    # fix a row that hit L_gen found the pad as its first EOS: length 33, an EOS the policy never wrote).
    dm = _dm(generation=DecodeSettings(32, 32, 4, 1.0))
    ro = dm.produce_rollouts(dm.prompt_batch(0), _tiny_policy())
    L, P = ro.completion_mask.shape[1], ro.prompt_len
    on = ro.source == int(Source.ON_POLICY)
    assert L > 32
    assert ro.hit_limit[on].any()  # the untrained model fills L_gen
    assert ro.lengths[on & ro.hit_limit].tolist() == [32] * int((on & ro.hit_limit).sum())
    assert (ro.lengths[on] <= 32).all()
    assert not ro.completion_mask[on][:, 32:].any()
    assert not ro.attention_mask[on][:, P + 32:].any() and ro.attention_mask[on][:, P:P + 32].all()
    assert ro.gen_width[on].tolist() == [32] * 6 and ro.gen_width[~on].tolist() == [L] * 6
    assert ro.attention_mask[~on][:, P:].all()  # external rows: their own width is the batch width
    assert (ro.completion_mask.sum(-1) == ro.lengths).all()


def test_cut_external_rows_are_rewarded_on_the_text_that_is_trained_on():
    # max_external_len 20 with L_gen 32: external rows are cut to 32 tokens (the answer tag is lost), so
    # their reward must be the cut text's, not the full record's (1.0 for these scripted solutions)
    dm = _dm(generation=DecodeSettings(32, 32, 4, 1.0), max_external_len=20)
    policy = _tiny_policy()
    batch = dm.prompt_batch(0)
    ro = dm.produce_rollouts(batch, policy)
    ext = (ro.source == int(Source.EXTERNAL)).nonzero().squeeze(-1).tolist()
    full = [r.completion for recs in batch.external for r in recs]
    assert ro.completion_mask.shape[1] == 32
    for j, i in enumerate(ext):
        trained = policy.decode_completions(ro.completion_ids[i : i + 1])[0]
        assert ro.texts[i] == trained and full[j].startswith(trained) and trained != full[j]
        ex = batch.examples[int(ro.group[i])]
        assert ro.rewards[i].item() == pytest.approx(dm.task.total_reward(trained, ex))
        assert ro.rewards[i].item() < dm.task.total_reward(full[j], ex)
        # no EOS in frame: a cut row is not taught to stop where it was cut
        assert (ro.lengths[i].item() == 32 and bool(ro.hit_limit[i])
                and policy.eos_id not in ro.completion_ids[i].tolist())
    assert dm.last_stats["train/external/cut_frac"] == 1.0


@pytest.mark.parametrize("max_external_len, cut", [(36, True), (37, False)])
def test_external_cut_boundary(max_external_len, cut):
    # grid completions are exactly 37 tokens: width max(L_gen 32, min(37 + 1, max_external_len + 1)) is 37
    # (no room for the EOS: cut) or 38 (the completion and its EOS fit: not cut)
    grid = ROOT / "data/pools/sudoku_grid.jsonl.gz"
    dm = _dm(pool_path=str(grid), generation=DecodeSettings(32, 32, 4, 1.0), max_external_len=max_external_len)
    policy = _tiny_policy()
    ro = dm.produce_rollouts(dm.prompt_batch(0), policy)
    ext = ro.source == int(Source.EXTERNAL)
    assert ro.completion_mask.shape[1] == (37 if cut else 38)
    assert ro.hit_limit[ext].tolist() == [cut] * 6
    assert ro.lengths[ext].tolist() == [37 if cut else 38] * 6
    assert all(policy.eos_id in ro.completion_ids[i].tolist() for i in ext.nonzero().flatten().tolist()) is (not cut)
    assert dm.last_stats["train/external/cut_frac"] == float(cut)


def test_format_rate_counts_on_policy_completions_with_an_answer_block(monkeypatch):
    # 6 on-policy rows (3 prompts x G_on 2): 2 hold a closed <answer> block, one an unclosed one, 3 none;
    # the 6 external rows (all well-formed) must not count
    dm = _dm(generation=DecodeSettings(32, 32, 4, 1.0))
    policy = _tiny_policy()
    texts = ["<reasoning>1</reasoning>\n<answer>1234</answer>", "<answer>1</answer>", "<answer>12",
             "1234", "", "</answer>"]
    ids = policy.encode_completions(texts, 32)[0]  # (6, 32)
    monkeypatch.setattr(policy, "generate", lambda *a, **k: ids)
    ro = dm.produce_rollouts(dm.prompt_batch(0), policy)
    assert ro.texts[:6] == texts
    assert dm.last_stats["train/on_policy/format_rate"] == pytest.approx(2 / 6)
