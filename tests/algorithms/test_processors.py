"""Tests lit_rl/algorithms/processors.py."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.processors import GroupBaseline, Processor, run_processors
from lit_rl.batch import RolloutBatch


def _rows(rewards: list[float], groups: list[int]) -> RolloutBatch:
    """One-token prompts and completions: only the rewards and groups matter here."""
    n = len(rewards)
    return RolloutBatch(
        input_ids=torch.ones(n, 2, dtype=torch.long), attention_mask=torch.ones(n, 2, dtype=torch.long), prompt_len=1,
        completion_mask=torch.ones(n, 1, dtype=torch.bool), lengths=torch.ones(n, dtype=torch.long),
        rewards=torch.tensor(rewards), source=torch.zeros(n, dtype=torch.long), group=torch.tensor(groups),
        texts=[""] * n, prompt_ids=[f"p{g}" for g in groups], hit_limit=torch.zeros(n, dtype=torch.bool))


class Double(Processor):
    def process(self, rollouts, batch):
        return rollouts.with_advantages(2 * rollouts.advantages)


class Noop(Processor):
    def process(self, rollouts, batch):
        return rollouts


def test_the_chain_runs_in_order_and_must_leave_advantages():
    rows = _rows([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1])
    # Dr. GRPO: each group's mean 0.5 taken off -> [0.5, -0.5, -0.5, 0.5]; then doubled
    out = run_processors([GroupBaseline(), Double()], rows, None)
    assert out.advantages.tolist() == [1.0, -1.0, -1.0, 1.0] and out.keep.tolist() == [True] * 4
    assert rows.advantages is None  # a copy: the input rows are not changed
    with pytest.raises(ValueError, match=r"^processors \['Noop'\] set no advantages$"):
        run_processors([Noop()], rows, None)
    assert run_processors([], rows, None) is rows  # no processors (SFT): no advantages needed


def test_group_baseline_process_matches_its_call_on_the_rows():
    rows = _rows([1.0, 0.0, 0.0, 3.0, 1.0], [0, 0, 0, 1, 1])
    # RLOO: the mean of the group's other rewards: group 0 [1 - 0, 0 - 0.5, 0 - 0.5], group 1 [3 - 1, 1 - 3]
    out = GroupBaseline(leave_one_out=True).process(rows, None)
    assert out.advantages.tolist() == [1.0, -0.5, -0.5, 2.0, -2.0] and bool(out.keep.all())
