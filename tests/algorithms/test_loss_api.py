"""Tests lit_rl/algorithms/loss_api.py."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.loss_api import LossContext, kept_rows, mask_seeds
from lit_rl.batch import RolloutBatch


def _rows(n: int) -> RolloutBatch:
    """``n`` one-token rows with rewards 0, 1, ..., n - 1 (only row identity matters here)."""
    return RolloutBatch(
        input_ids=torch.ones(n, 2, dtype=torch.long), attention_mask=torch.ones(n, 2, dtype=torch.long), prompt_len=1,
        completion_mask=torch.ones(n, 1, dtype=torch.bool), lengths=torch.ones(n, dtype=torch.long),
        rewards=torch.arange(n, dtype=torch.float), source=torch.zeros(n, dtype=torch.long),
        group=torch.zeros(n, dtype=torch.long), texts=[""] * n, prompt_ids=["p"] * n,
        hit_limit=torch.zeros(n, dtype=torch.bool))


def test_slices_are_consecutive_micro_batches():
    ctx = LossContext(policy=torch.nn.Identity(), device=torch.device("cpu"), micro_batch_size=2)
    assert ctx.slices(5) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert ctx.slices(4) == [slice(0, 2), slice(2, 4)]
    assert LossContext(policy=torch.nn.Identity(), device=torch.device("cpu")).slices(5) == [slice(0, 5)]
    with pytest.raises(RuntimeError, match="asked for no KL reference"):
        ctx.reference_policy()


def test_a_rows_mask_seed_depends_on_the_row_and_step_not_its_batch_mates():
    rows = _rows(4)
    full = mask_seeds(7, 0, 3, rows)
    assert len(set(full)) == 4
    # a micro-batch of rows 1-2, or the rows 0 and 3 alone, draw the seeds they draw in the whole batch
    assert mask_seeds(7, 0, 3, rows.slice_rows(slice(1, 3))) == full[1:3]
    assert mask_seeds(7, 0, 3, rows.select(torch.tensor([True, False, False, True]))) == [full[0], full[3]]
    assert set(mask_seeds(7, 0, 4, rows)).isdisjoint(full) and set(mask_seeds(7, 1, 3, rows)).isdisjoint(full)
    ctx = LossContext(policy=torch.nn.Identity(), device=torch.device("cpu"), step=3, seed=7)
    assert ctx.mask_seeds(rows) == full and ctx.mask_seeds(rows, step=4) == mask_seeds(7, 0, 4, rows)


def test_kept_rows_are_the_rows_the_processors_keep():
    rows = _rows(4)
    with pytest.raises(ValueError, match="no advantages"):
        kept_rows(rows)
    everyone = rows.with_advantages(torch.zeros(4))
    assert kept_rows(everyone).rewards.tolist() == [0.0, 1.0, 2.0, 3.0]
    some = rows.with_advantages(torch.zeros(4), keep=torch.tensor([True, False, True, False]))
    assert kept_rows(some).rewards.tolist() == [0.0, 2.0] and kept_rows(some).row.tolist() == [0, 2]
