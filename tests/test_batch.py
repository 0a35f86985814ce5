"""RolloutBatch.scatter: the inverse of select for a sub-batch a processor rewrote."""

import pytest
import torch

from lit_rl.batch import RolloutBatch


def _batch(n=4, P=2, L=3, base=0):
    ids = torch.arange(n * (P + L)).reshape(n, P + L) + base
    lengths = torch.tensor([3, 1, 2, 2])[:n]
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P,
        completion_mask=torch.arange(L)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.tensor([0.1, 0.2, 0.3, 0.4])[:n] + base, source=torch.tensor([0, 1, 0, 1])[:n],
        group=torch.tensor([0, 0, 1, 1])[:n], texts=[f"t{i + base}" for i in range(n)],
        prompt_ids=["a", "a", "b", "b"][:n], hit_limit=torch.zeros(n, dtype=torch.bool),
    )


def test_scatter_puts_rewritten_rows_back_in_place():
    ro = _batch()
    where = ro.source == 0  # rows 0 and 2
    sub = ro.select(where)
    new = RolloutBatch(**{**{f: getattr(sub, f) for f in sub.__dataclass_fields__},
                          "input_ids": sub.input_ids + 100, "rewards": torch.tensor([9.0, 8.0]),
                          "source": torch.tensor([2, 0]), "texts": ["new0", "new2"],
                          "kept_prefix": torch.tensor([2, 0])})
    out = ro.scatter(where, new)
    assert out.rewards.tolist() == pytest.approx([9.0, 0.2, 8.0, 0.4])
    assert out.source.tolist() == [2, 1, 0, 1] and out.texts == ["new0", "t1", "new2", "t3"]
    assert torch.equal(out.input_ids[[1, 3]], ro.input_ids[[1, 3]])  # the other rows untouched
    assert torch.equal(out.input_ids[[0, 2]], ro.input_ids[[0, 2]] + 100)
    assert out.kept_prefix.tolist() == [2, 0, 0, 0] and out.row.tolist() == [0, 1, 2, 3]
    assert ro.rewards.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])  # the original is not modified


def test_scatter_refuses_a_width_or_count_mismatch():
    ro = _batch()
    where = ro.source == 0
    with pytest.raises(ValueError, match="scatter: 1 rows"):
        ro.scatter(where, ro.select(torch.tensor([True, False, False, False])))
    wide = _batch(L=4).select(where)
    with pytest.raises(ValueError, match="width"):
        ro.scatter(where, wide)


def test_trim_completion_keeps_the_first_columns_and_every_row_field():
    ro = _batch(L=3).with_advantages(torch.tensor([1.0, -1.0, 0.5, 0.0]))
    ro.kept_prefix = torch.tensor([3, 0, 1, 2])
    out = ro.trim_completion(2)
    assert out.input_ids.shape == (4, 4) and out.completion_ids.shape == (4, 2)
    assert torch.equal(out.input_ids, ro.input_ids[:, :4]) and torch.equal(out.attention_mask, ro.attention_mask[:, :4])
    assert torch.equal(out.completion_mask, ro.completion_mask[:, :2]) and out.hint_mask.shape == (4, 2)
    assert out.gen_width.tolist() == [2, 2, 2, 2] and out.kept_prefix.tolist() == [2, 0, 1, 2]
    assert out.advantages.tolist() == [1.0, -1.0, 0.5, 0.0] and out.texts == ro.texts and out.prompt_len == 2
    assert ro.trim_completion(3) is ro  # the full width: nothing to cut
    for bad in (0, 4):
        with pytest.raises(ValueError, match=r"width must be in \[1, 3\]"):
            ro.trim_completion(bad)


def test_a_new_stage_keeps_its_typed_output_on_the_batch_without_a_field_for_it():
    from dataclasses import dataclass

    from lit_rl.batch import Continuations, PromptBatch

    @dataclass
    class Critique:  # a stage's own output class, unknown to lit_rl/batch.py
        scores: list[float]

    batch = PromptBatch(examples=[], step=0)
    assert batch.get(Critique) is None and batch.continuations is None and batch.inpainted is None
    batch.put(Critique([0.5, 1.0]))
    assert batch.get(Critique).scores == [0.5, 1.0] and batch.continuations is None
    conts = Continuations.__new__(Continuations)  # the double-rollout stage's output, read through its property
    batch.put(conts)
    assert batch.continuations is conts and batch.get(Continuations) is conts
    batch.continuations = None
    assert Continuations not in batch.outputs and batch.get(Critique) is not None
