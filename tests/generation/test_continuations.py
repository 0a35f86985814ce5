"""Double rollout for the dLLM: the decoder resumed from a canvas, DiffusionContinuations against
the real tiny dLLM, the rebuilt CONTINUATION rows, and their SPG masks."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.dr_estimate import DoubleRolloutSettings, estimate_rewards
from lit_rl.algorithms.processors import GroupBaseline
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.generation.continuations import DiffusionContinuations
from lit_rl.generation.diffusion import diffusion_generate
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.rng import device_generator
from lit_rl.batch import RolloutBatch, Source

GEN = DecodeSettings(gen_length=24, block_length=8, steps=6, temperature=0.0)


def _policy() -> TinyDiffusionLM:
    torch.manual_seed(0)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)


def _prompt(policy, texts=("Sum: 1 2", "Sum: 3 4 5")):
    return policy.encode_prompts([[{"role": "user", "content": t}] for t in texts])


def _counting(policy):
    calls = []

    def fn(ids, mask):
        calls.append(1)
        return policy(ids, mask)
    return fn, calls


def test_an_all_mask_init_is_the_plain_decode():
    policy = _policy().eval()
    ids, mask = _prompt(policy)
    kw = dict(gen_length=24, block_length=8, steps=6, temperature=1.0, mask_id=policy.mask_id)
    a = diffusion_generate(policy, ids, mask, generator=device_generator(3, "cpu"), **kw)
    init = torch.full((2, 24), policy.mask_id)
    b = diffusion_generate(policy, ids, mask, generator=device_generator(3, "cpu"), init=init, **kw)
    assert torch.equal(a, b)


def test_a_resumed_decode_keeps_the_prefix_and_skips_complete_blocks():
    policy = _policy().eval()
    ids, mask = _prompt(policy)
    init = torch.full((2, 24), policy.mask_id)
    init[:, :16] = 7  # blocks 0 and 1 complete
    fn, calls = _counting(policy)
    out = diffusion_generate(fn, ids, mask, gen_length=24, block_length=8, steps=6, temperature=0.0,
                             mask_id=policy.mask_id, init=init)[:, ids.shape[1]:]
    assert (out[:, :16] == 7).all() and (out != policy.mask_id).all()
    assert len(calls) == 2  # only block 2's steps_per_block = 6 / 3 steps
    with pytest.raises(ValueError, match="init shape"):
        diffusion_generate(policy, ids, mask, gen_length=24, block_length=8, steps=6, temperature=0.0,
                           mask_id=policy.mask_id, init=init[:, :8])


def test_greedy_continuation_from_a_block_boundary_reproduces_the_first_stage():
    # the canvas at a block boundary is exactly the first stage's state there: greedy decoding must then
    # write the first stage's own tail, bitwise (the same block schedule from the cut)
    policy = _policy()
    ids, mask = _prompt(policy)
    first = policy.generate(ids, mask, GEN, seed=0)  # (2, 24)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    cut = 8
    prefixes = [p + first[i, :cut].tolist() for i, p in enumerate(prompts)]
    cont = DiffusionContinuations(policy, GEN).continue_from(
        prefixes, n=2, max_new_tokens=24 - cut, temperature=0.0, prompt_lens=[len(p) for p in prompts]
    )  # (4, 16)
    assert cont.shape == (4, 16)
    for i in range(2):
        want = first[i, cut:].clone()
        hit = (want == policy.eos_id).nonzero()
        if len(hit):
            want[int(hit[0]):] = policy.eos_id
        assert torch.equal(cont[2 * i], want) and torch.equal(cont[2 * i + 1], want)


def test_sampled_continuations_differ_and_follow_budgets_and_eos_fill():
    policy = _policy()
    ids, mask = _prompt(policy)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    engine = DiffusionContinuations(policy, GEN)
    prefixes = [prompts[0] + [10, 11, 12], prompts[1] + [13] * 10]
    out = engine.continue_from(prefixes, n=3, max_new_tokens=[21, 5], temperature=1.0, seed=1,
                               prompt_lens=[len(p) for p in prompts])
    assert out.shape == (6, 21)
    assert (out[3:, 5:] == policy.eos_id).all()  # the second prefix's budget: 5 tokens
    assert len({tuple(r.tolist()) for r in out[:3]}) > 1  # T 1: the N continuations differ
    for row in out:  # EOS-filled after the first EOS
        hit = (row == policy.eos_id).nonzero()
        if len(hit):
            assert (row[int(hit[0]):] == policy.eos_id).all()
    again = engine.continue_from(prefixes, n=3, max_new_tokens=[21, 5], temperature=1.0, seed=1,
                                 prompt_lens=[len(p) for p in prompts])
    assert torch.equal(out, again)  # seeded
    with pytest.raises(ValueError, match="prompt_lens"):
        engine.continue_from(prefixes, n=1, max_new_tokens=4)
    with pytest.raises(ValueError, match="top_p"):
        engine.continue_from(prefixes, n=1, max_new_tokens=4, top_p=0.9, prompt_lens=[1, 1])


def _first_stage(policy, G=3):
    ids, mask = _prompt(policy, ("Sum: 1 2",))
    ids, mask = ids.repeat(G, 1), mask.repeat(G, 1)
    comp = policy.generate(ids, mask, DecodeSettings(gen_length=24, block_length=8, steps=6, temperature=1.0), 5)
    lengths = policy.completion_lengths(comp)
    return RolloutBatch(
        input_ids=torch.cat([ids, comp], 1), attention_mask=torch.cat([mask, torch.ones_like(comp)], 1),
        prompt_len=ids.shape[1], completion_mask=torch.arange(24)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.zeros(G), source=torch.zeros(G, dtype=torch.long), group=torch.zeros(G, dtype=torch.long),
        texts=[""] * G, prompt_ids=["p"] * G, hit_limit=torch.zeros(G, dtype=torch.bool),
    )


def test_estimate_with_the_dllm_rebuilds_a_continuation_row_on_its_canvas():
    policy = _policy()
    ro = _first_stage(policy)
    N = 2

    def score(texts, groups):  # row 0's continuations are correct, the others' wrong
        return [1.0] * N + [0.0] * (len(texts) - N)

    settings = DoubleRolloutSettings(rho=0.5, num_continuations=N, buffer=1024, delimiter="</answer>")
    est = estimate_rewards(
        ro, DiffusionContinuations(policy, GEN), score, policy.decode_completions, [policy.eos_id + 10 ** 6],
        policy.eos_id, settings, GroupBaseline(), correct_threshold=1.0, max_new_tokens=24, temperature=1.0,
    )
    out = est.rollouts
    assert est.replaced.tolist() == [0, -1, -1]  # A_0 > 0, own answer wrong, a continuation correct
    assert out.source.tolist() == [int(Source.CONTINUATION), 0, 0]
    body = ro.lengths[0] - int(ro.completion_ids[0, ro.lengths[0] - 1] == policy.eos_id)  # trace = the body
    cut = int(body) // 2
    assert out.kept_prefix.tolist() == [cut, 0, 0]
    assert out.completion_ids.shape[1] == 24 and out.gen_width.tolist() == [24] * 3  # the canvas width stays
    assert torch.equal(out.completion_ids[0, :cut], ro.completion_ids[0, :cut])
    assert torch.equal(out.completion_ids[1:], ro.completion_ids[1:])


def test_spg_masks_continuation_rows_as_on_policy_whole_or_tail():
    cm = torch.ones(2, 16, dtype=torch.bool)
    pm = torch.ones(2, 3, dtype=torch.bool)
    seeds = [11, 11]  # the same seed: the same draw for both rows
    src = torch.tensor([int(Source.ON_POLICY), int(Source.CONTINUATION)])
    kept = torch.tensor([0, 6])
    whole = SPGSurrogate(num_t=4, block_length=4).build_masks(cm, pm, src, seeds=seeds, kept_prefix=kept)
    assert torch.equal(whole.completion[:, 0], whole.completion[:, 1])
    assert torch.equal(whole.loss[:, 0], whole.loss[:, 1])
    tail = SPGSurrogate(num_t=4, block_length=4, continuation_masks="tail").build_masks(
        cm, pm, src, seeds=seeds, kept_prefix=kept)
    assert not tail.completion[:, 1, :6].any() and not tail.loss[:, 1, :6].any()  # the cut: clean, unscored
    assert torch.equal(tail.completion[:, 1, 6:], whole.completion[:, 1, 6:])
    assert torch.equal(tail.loss[:, 0], whole.loss[:, 0])  # on-policy rows unchanged
    with pytest.raises(ValueError, match="continuation_masks"):
        SPGSurrogate(continuation_masks="prefix")
    with pytest.raises(ValueError, match="source must hold"):
        SPGSurrogate().build_masks(cm, pm, torch.tensor([0, 5]), seeds=seeds)

