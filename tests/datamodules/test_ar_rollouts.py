"""The AR rollout DataModule: stream/cursor like the dLLM one, G rollouts per prompt scored by the verifier,
data profiling with its cache and checkpointed kept ids."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from datamodules.ar_rollouts import ARRolloutDataModule, ProfilingSettings, policy_key
from lit_rl.generation.ar import ARBackend
from lit_rl.models.ar import SamplingSettings, TinyCausalLM
from lit_rl.tasks.scripted import countdown_completion
from lit_rl.batch import Source
from lit_rl.tasks import CountdownTask


def task():
    return CountdownTask(num_train=12, system_prompt="", question_template="{numbers} {target}")


def tiny():
    return TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256, seed=0)


class ScriptedBackend(ARBackend):
    """First stage only: completion k of a prompt is the scripted solver's answer when ``good(prompt, k)``,
    else a wrong one, so rewards are known in advance."""

    def __init__(self, policy, dm, good) -> None:
        self.policy, self.dm, self.good, self.eos_id = policy, dm, good, policy.eos_id
        self.calls = []

    def generate(self, prompt_ids, prompt_mask, *, max_new_tokens, temperature=1.0, top_p=1.0, n=1, seed=0):
        self.calls.append((prompt_ids.shape[0], n, max_new_tokens, seed))
        texts = []
        for row, m in zip(prompt_ids, prompt_mask):
            q = self.policy.tokenizer.decode(row[m.bool()].tolist()).strip()
            ex = next(e for e in self.dm.all_train_examples + self.dm._eval if e.question == q)
            for k in range(n):
                right = self.good(ex, k)
                texts.append(countdown_completion(ex, random.Random(0)) if right else "<answer>1+1</answer>")
        ids, _ = self.policy.encode_completions(texts, max_new_tokens)
        return ids

    def continue_from(self, *a, **k):
        raise AssertionError("not used by the DataModule")


def dm_with(backend_good, **kw):
    policy = tiny()
    made = []  # the DataModule builds its generator from the factory, with the policy, on first use
    factory = lambda p: made.append(ScriptedBackend(p, dm, backend_good)) or made[-1]  # noqa: E731
    dm = ARRolloutDataModule(task(), prompts_per_batch=2, num_generations=3, generation=SamplingSettings(96),
                             eval_size=4, backend=factory, **kw)
    dm.setup("fit")
    backend = dm.engine(policy)
    assert made == [backend] and dm.engine(policy) is backend  # built once
    module = SimpleNamespace(policy=policy)
    return dm, module, backend


def test_rollouts_are_g_per_prompt_prompt_major_and_scored_by_the_verifier():
    dm, module, backend = dm_with(lambda ex, k: k == 0)
    batch = dm.prompt_batch(0)
    ro = dm.produce_rollouts(batch, module)
    assert len(ro) == 6 and ro.group.tolist() == [0, 0, 0, 1, 1, 1]
    assert ro.prompt_ids == [batch.examples[0].id] * 3 + [batch.examples[1].id] * 3
    # k = 0 is the scripted (right) answer: reward 1; the others use the wrong numbers: 0.1
    assert ro.rewards.tolist() == pytest.approx([1.0, 0.1, 0.1, 1.0, 0.1, 0.1])
    assert (ro.source == int(Source.ON_POLICY)).all()
    assert backend.calls[0][:3] == (2, 3, 96)
    assert ro.completion_mask.sum(1).tolist() == ro.lengths.tolist()
    assert {"time/stage1_s", "train/tokens_per_problem", "train/cost/tokens_stage1"} <= set(dm.last_stats)
    # tokens per problem = mean completion length of one rollout (EOS included)
    assert dm.last_stats["train/tokens_per_problem"] == pytest.approx(float(ro.lengths.float().mean()))
    # the same step gives the same seed (a resumed run redraws the same rollouts)
    dm.produce_rollouts(dm.prompt_batch(0), module)
    assert backend.calls[0][3] == backend.calls[1][3]


def test_cursor_and_order_survive_a_checkpoint():
    dm, _, _ = dm_with(lambda ex, k: True)
    first = [e.id for e in dm.prompt_batch(3).examples]
    dm.cursor = 4
    state = dm.state_dict()
    dm2, _, _ = dm_with(lambda ex, k: True)
    dm2.load_state_dict(state)
    assert dm2.cursor == 4 and [e.id for e in dm2.prompt_batch(3).examples] == first
    with pytest.raises(ValueError, match="data.seed"):
        dm3 = ARRolloutDataModule(task(), seed=7)
        dm3.load_state_dict(state)


def test_profiling_drops_always_and_never_solved_prompts_and_caches(tmp_path):
    # pass rate by prompt index i: i % 3 == 0 → 0/4, i % 3 == 1 → 4/4, else 2/4 → only the last are kept
    def good(ex, k):
        i = int(ex.id.rsplit("-", 1)[1])
        return {0: False, 1: True, 2: k < 2}[i % 3]

    prof = ProfilingSettings(num_samples=4, batch_prompts=5, cache_dir=str(tmp_path))
    dm, module, backend = dm_with(good, profiling=prof)
    kept = dm.profile(module.policy, backend)
    assert kept == [f"countdown-train-{i}" for i in range(12) if i % 3 == 2]
    assert {e.id for e in dm.train_examples} == set(kept) and len(dm.all_train_examples) == 12
    assert (dm.profile_stats["data/kept_prompts"] == 4
            and dm.profile_stats["data/pass_rate_0_frac"] == pytest.approx(4 / 12))
    assert len(backend.calls) == 3 and backend.calls[0][1] == 4  # 12 prompts in chunks of 5, n = 4 each
    (cache,) = tmp_path.glob("profile_countdown_*.json")
    assert json.loads(cache.read_text())["pass_rates"][:3] == [0.0, 1.0, 0.5]
    # same policy and settings: the cache answers, no generation
    dm2, module2, backend2 = dm_with(good, profiling=prof)
    assert dm2.profile(module2.policy, backend2) == kept and backend2.calls == []
    # a different policy is a different cache entry
    other = tiny()
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    assert policy_key(other) != policy_key(module.policy)
    # the kept ids travel in the checkpoint, so a resumed run (trained policy) keeps the same prompts
    dm3, _, backend3 = dm_with(good, profiling=prof)
    dm3.load_state_dict(dm.state_dict())
    assert [e.id for e in dm3.train_examples] == kept
    dm3.prompt_batch(0)  # no trainer: nothing to profile with, and nothing needed
    assert backend3.calls == []


def test_profiling_that_drops_everything_says_what_to_do(tmp_path):
    dm, module, backend = dm_with(lambda ex, k: True, profiling=ProfilingSettings(num_samples=2, cache_dir=None))
    with pytest.raises(ValueError, match="data.profiling dropped every prompt"):
        dm.profile(module.policy, backend)


def test_eval_batches_use_eval_generation_and_the_eval_rule():
    dm, module, backend = dm_with(lambda ex, k: True)
    from lit_rl.batch import PromptBatch

    ro = dm.evaluate_batch(PromptBatch(examples=dm._eval[:2], step=-1), module)
    assert ro.rewards.tolist() == [1.0, 1.0] and ro.eval_total.tolist() == [1.0, 1.0]
    assert backend.calls[-1][1:3] == (1, 96)


def test_policy_generate_matches_the_pass_at_k_signature():
    p = tiny()
    ids, mask = p.encode_prompts([[{"role": "user", "content": "[1, 2, 3] 6"}]] * 2)
    a = p.generate(ids, mask, SamplingSettings(max_new_tokens=8, temperature=1.0), seed=3)
    b = p.generate(ids, mask, {"max_new_tokens": 8, "temperature": 1.0}, seed=3)
    assert a.shape == (2, 8) and torch.equal(a, b)
    g = p.generate(ids, mask, SimpleNamespace(gen_length=8, temperature=0.0), seed=0)  # dLLM-style settings
    assert torch.equal(g[0], g[1])


def test_eval_batch_size_zero_fails_at_construction():
    # it used to pass construction and die with a ZeroDivisionError in val_dataloader
    with pytest.raises(ValueError, match="eval_batch_size: must be >= 1, got 0"):
        ARRolloutDataModule(task(), prompts_per_batch=2, num_generations=3, eval_batch_size=0)
