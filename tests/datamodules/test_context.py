"""datamodules/context.py: what a source is handed. A new rollout source is a subclass with ``num`` and
``rows(batch, ctx)``; everything it needs is in the frozen context (no DataModule, no trainer), and its setup
returns the prompts it keeps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from datamodules import RolloutDataModule
from datamodules.context import RolloutContext, SourceSetup
from datamodules.sources import RolloutSource, Rows
from lit_rl.core.sources import Source
from lit_rl.generation.engine import DiffusionEngine
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import SudokuTask


class EchoSource(RolloutSource):
    """A source written against the context alone: one row per prompt, the prompt's own last 4 tokens."""

    num = 1

    def __init__(self):
        self.seen: list[RolloutContext] = []
        self.setup_seen: SourceSetup | None = None

    def setup(self, prompts):
        self.setup_seen = prompts
        return prompts.examples[::2]  # keeps every other prompt

    def rows(self, batch, ctx):
        self.seen.append(ctx)
        comp = ctx.prompt_ids[:, -4:].clone()  # (B_p, 4)
        return Rows(completion=comp, lengths=torch.full((comp.shape[0],), 4), group=list(range(comp.shape[0])),
                    source=Source.ON_POLICY, texts=ctx.policy.decode_completions(comp), hit_limit=[True] * len(comp))


def test_a_new_source_gets_a_frozen_context_and_narrows_the_prompts_at_setup():
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=40)
    src = EchoSource()
    gen = DecodeSettings(32, 32, 4, 1.0)
    dm = RolloutDataModule(task, prompts_per_batch=2, max_prompt_len=64, eval_size=4, sources=[src], generation=gen)
    dm.setup()
    all_ids = [e.id for e in task.train_examples()]
    assert src.setup_seen.examples[0].id == all_ids[0] and src.setup_seen.gen_width == 32
    assert [e.id for e in dm.train_examples] == all_ids[::2]  # what setup returned is the stream's prompt set
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256)
    ro = dm.produce_rollouts(dm.prompt_batch(3), policy)
    ctx = src.seen[-1]
    assert ctx.step == 3 and ctx.rank == 0 and ctx.seed == dm.generation_seed(3) and ctx.task is task
    assert ctx.policy is policy and isinstance(ctx.engine, DiffusionEngine) and ctx.prompt_ids.shape[0] == 2
    assert torch.equal(ro.input_ids[:, ro.prompt_len:], ctx.prompt_ids[:, -4:])  # its rows, stacked
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.step = 4


def test_a_pool_row_that_cannot_fit_is_refused_whether_the_policy_comes_before_or_after_setup():
    from datamodules.sources import ExternalPool
    from lit_rl.errors import ConfigError

    pool = "data/pools/sudoku_scripted.jsonl.gz"
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)
    for policy_first in (False, True):
        dm = RolloutDataModule(task, prompts_per_batch=2, max_prompt_len=64, eval_size=4,
                               sources=[ExternalPool(2, pool, 512, min_width=32)], generation=DecodeSettings(32, 32, 4))
        policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=48)
        with pytest.raises(ConfigError, match="max_positions = 48"):
            if policy_first:  # connect (a script's own order) before setup: the check waits for the prompts
                dm.connect(policy)
                dm.setup()
                dm.produce_rollouts(dm.prompt_batch(0), policy)
            else:
                dm.setup()
                dm.connect(policy)


def test_a_batch_syncs_the_engine_once_for_its_sources_and_stages():
    from datamodules import ARRolloutDataModule
    from lit_rl.generation.ar import HFBackend
    from lit_rl.models.ar import SamplingSettings, TinyCausalLM
    from lit_rl.tasks import ChainSumTask

    pushes, seen = [], []

    class Counting(HFBackend):
        def push_weights(self, weights):
            pushes.append(1)

    class Stage:
        def run(self, batch, rollouts, policy, engine):
            seen.append(engine)

    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256, seed=0)
    dm = ARRolloutDataModule(ChainSumTask(num_train=40, num_eval=4), prompts_per_batch=2, num_generations=2,
                             generation=SamplingSettings(8), eval_size=4, backend=Counting)
    dm.setup()
    dm.connect(policy, [Stage()])  # no weight version: a push before every use, but one per batch
    batch = dm.prompt_batch(0)
    batch.rollouts = dm.produce_rollouts(batch, policy)
    dm.run_stages(batch)
    assert len(pushes) == 1 and seen == [dm._generator]


def test_a_stage_output_subclass_is_found_by_its_base_type():
    from lit_rl.batch import Continuations, PromptBatch

    class Mine(Continuations):
        pass

    batch = PromptBatch(examples=[], step=0)
    out = Mine.__new__(Mine)
    batch.put(out)
    assert batch.continuations is out and batch.get(Mine) is out
