"""Tests lit_rl/algorithms/dr_estimate.py."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from lit_rl.algorithms.dr_estimate import DoubleRolloutEstimate
from lit_rl.algorithms.dr_stage import ContinuationStage
from lit_rl.algorithms.processors import GroupBaseline
from lit_rl.batch import PromptBatch

sys.path.insert(0, str(Path(__file__).parent))  # the hand-built rows and stub backend, the batch and policy
from test_double_rollout import TABLE, StubBackend  # noqa: E402
from test_dr_stage import SETTINGS, Policy, _batch  # noqa: E402


def test_the_processor_without_the_stage_says_what_is_missing():
    batch = _batch()
    proc = DoubleRolloutEstimate(SETTINGS, GroupBaseline())
    proc.bind(Policy())
    with pytest.raises(RuntimeError, match="rollout_stages"):
        proc.process(batch.rollouts, batch)


def test_the_module_lists_its_stages_and_the_batch_carries_no_generator():
    assert "generator" not in {f.name for f in dataclasses.fields(PromptBatch)}
    proc = DoubleRolloutEstimate(SETTINGS)
    assert isinstance(proc.stage, ContinuationStage) and proc.stage.settings is proc.settings
    # the stage off (vanilla GRPO): no stage, so the DataModule builds no engine and generates nothing
    assert DoubleRolloutEstimate(dataclasses.replace(SETTINGS, enabled=False)).stage is None
    assert DoubleRolloutEstimate(dataclasses.replace(SETTINGS, num_continuations=1)).stage is None


def test_continuations_of_other_rows_are_refused():
    batch = _batch()
    ContinuationStage(SETTINGS, seed=0).run(batch, batch.rollouts, Policy(), StubBackend(TABLE))
    proc = DoubleRolloutEstimate(SETTINGS, GroupBaseline())
    proc.bind(Policy())
    reordered = batch.rollouts.select(torch.ones(5, dtype=torch.bool))
    reordered.row = reordered.row.flip(0)  # as if a processor before the estimate had reordered the rows
    with pytest.raises(RuntimeError, match="belong to other rows"):
        proc.process(reordered, batch)
