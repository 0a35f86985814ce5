"""Double rollout's one-way data path: the second stage (ContinuationStage) generates and scores in the data
stage; the processor (DoubleRolloutEstimate) is a pure function of the batch and gives what the one-call
estimate gives (the processor's own checks are in test_dr_estimate.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from lit_rl import rng
from lit_rl.algorithms.dr_estimate import DoubleRolloutEstimate, estimate_rewards
from lit_rl.algorithms.dr_stage import ContinuationStage, DoubleRolloutSettings
from lit_rl.algorithms.processors import GroupBaseline
from lit_rl.batch import PromptBatch

sys.path.insert(0, str(Path(__file__).parent))  # the hand-built rows and stub backend of test_double_rollout
from test_double_rollout import (  # noqa: E402
    COMPLETIONS, EOS, GROUPS, ORIGINAL, PROMPTS, TABLE, D, StubBackend, batch_of, decode,
)

SETTINGS = DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=1)


class Policy(torch.nn.Module):  # what the stage and the processor read from a policy
    eos_id, think_end = EOS, "|"

    def decode_completions(self, ids):
        return decode(ids)

    def tokenizer(self, text, add_special_tokens=False):
        return {"input_ids": [D] if text == "|" else []}


class Task:
    correct_reward = 1.0

    def total_rewards(self, texts, examples):
        return SimpleNamespace(totals=[1.0 if t.endswith("Y") else 0.0 for t in texts])


def _batch(step: int = 3) -> PromptBatch:
    b = PromptBatch(examples=[SimpleNamespace(id="p0"), SimpleNamespace(id="p1")], step=step, task=Task(),
                    generation=SimpleNamespace(max_new_tokens=16, temperature=1.0, top_p=1.0))
    b.rollouts = batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL)
    return b


def test_the_stage_generates_and_the_processor_only_computes():
    batch = _batch()
    backend = StubBackend(TABLE)
    ContinuationStage(SETTINGS, seed=0).run(batch, batch.rollouts, Policy(), backend)
    assert len(backend.calls) == 1 and batch.continuations is not None
    assert batch.continuations.rewards.tolist() == [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    assert batch.stats["train/cost/tokens_stage2"] > 0 and "time/stage2_s" in batch.stats
    proc = DoubleRolloutEstimate(SETTINGS, GroupBaseline(), seed=0)
    proc.bind(Policy())
    out = proc.process(batch.rollouts, batch)
    assert len(backend.calls) == 1  # the processor generated nothing
    # the same numbers as the one-call estimate with the same seed
    seed = rng.seed_for(0, rng.Stream.CONTINUATION, rank=0, step=3)
    want = estimate_rewards(batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL), StubBackend(TABLE),
                            lambda t, g: Task().total_rewards(t, g).totals, decode, [D], EOS, SETTINGS, GroupBaseline(),
                            correct_threshold=1.0, max_new_tokens=16, seed=seed)
    torch.testing.assert_close(out.advantages, want.advantages)
    torch.testing.assert_close(out.rewards, want.rollouts.rewards)
    assert torch.equal(out.input_ids, want.rollouts.input_ids)
    assert batch.diagnostics["double_rollout"].replaced.tolist() == want.replaced.tolist()
