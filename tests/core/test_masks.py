"""Tests for lit_rl.core.masks (SPG block masks, uniform masks, prompt masking, noisy inputs)."""

import pytest
import torch

from lit_rl.core.masks import (
    DiffusionMasks,
    apply_masks,
    full_completion_masks,
    mask_prompt_tokens,
    spg_block_choice,
    spg_block_masks,
    uniform_block_choice,
    uniform_random_masks,
)


def _cm(lengths, L):
    return torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _check_block_structure(m, cm, bl):
    num_t, B, L = m.completion.shape
    for j in range(num_t):
        for b in range(B):
            valid = cm[b]
            loss, inp = m.loss[j, b], m.completion[j, b]
            assert not (loss & ~valid).any()  # after-EOS positions are never scored
            assert inp[~valid].all()  # ... but always masked in the input
            assert torch.equal(loss, inp & valid)
            k = int(loss.nonzero()[0]) // bl  # the chosen block is the first one with a scored position
            blocks = torch.arange(L) // bl
            assert not inp[blocks < k].any()  # blocks before k clean (p_mask_clean = 0)
            assert inp[blocks > k].all()  # blocks after k fully masked
            m_valid = int((valid & (blocks == k)).sum())
            n = int((loss & (blocks == k)).sum())
            assert 1 <= n <= m_valid  # n ~ U{1..m} of the block's valid tokens


def test_spg_block_masks_structure():
    cm = _cm([10, 16, 3, 5], 16)
    for seed in range(20):
        m = spg_block_masks(cm, 4, 3, gen(seed))
        assert m.completion.shape == (3, 4, 16) and m.completion.dtype == torch.bool
        assert m.prompt is None
        _check_block_structure(m, cm, 4)
    # width not a multiple of the block (batch padded to a longer external rollout): shorter last block
    cm = _cm([10, 14, 3], 14)
    for seed in range(20):
        _check_block_structure(spg_block_masks(cm, 4, 2, gen(seed)), cm, 4)


def test_spg_block_masks_only_choose_blocks_with_completion_tokens():
    # length 5 with blocks of 4: only blocks 0 and 1 hold completion tokens; both get chosen over many draws
    cm = _cm([5], 16)
    chosen = set()
    for seed in range(50):
        m = spg_block_masks(cm, 4, 2, gen(seed))
        for j in range(2):
            chosen.add(int(m.loss[j, 0].nonzero()[0]) // 4)
    assert chosen == {0, 1}


def test_spg_block_choice_distinct_draws():
    # 4 valid blocks, 3 draws: SPG takes the first 3 entries of a permutation -> all distinct
    k = spg_block_choice(torch.tensor([4, 4, 4]), 4, 3, gen(0))
    assert k.shape == (3, 3)
    for b in range(3):
        assert len(set(k[:, b].tolist())) == 3
    # more draws than blocks: still valid indices
    k = spg_block_choice(torch.tensor([2]), 2, 5, gen(0))
    assert k.shape == (5, 1) and ((k >= 0) & (k < 2)).all()
    k = uniform_block_choice(torch.tensor([1, 3]), 4, 100, gen(0))
    assert (k[:, 0] == 0).all() and set(k[:, 1].tolist()) == {0, 1, 2}


def test_spg_block_masks_deterministic_given_generator():
    cm = _cm([10, 16], 16)
    a = spg_block_masks(cm, 4, 2, gen(3))
    b = spg_block_masks(cm, 4, 2, gen(3))
    c = spg_block_masks(cm, 4, 2, gen(4))
    assert torch.equal(a.completion, b.completion) and torch.equal(a.loss, b.loss)
    assert not torch.equal(a.completion, c.completion)


def test_spg_block_masks_pluggable_choice_and_validation():
    cm = _cm([16], 16)

    def last_block(valid_blocks, num_blocks, num_t, generator):
        return (valid_blocks - 1)[None].expand(num_t, -1)

    m = spg_block_masks(cm, 4, 2, gen(0), block_choice=last_block)
    assert not m.completion[:, 0, :12].any()  # blocks 0..2 clean
    with pytest.raises(ValueError, match="block_length"):
        spg_block_masks(_cm([5], 8), 0, 2, gen(0))
    with pytest.raises(ValueError, match="block_choice"):
        spg_block_masks(cm, 4, 2, gen(0), block_choice="nope")


def test_spg_block_masks_clean_token_masking():
    # force block 3 so blocks 0..2 (12 tokens) are clean; with p = 0.5 about half of them get masked and scored
    cm = _cm([16], 16)

    def last_block(valid_blocks, num_blocks, num_t, generator):
        return (valid_blocks - 1)[None].expand(num_t, -1)

    m = spg_block_masks(cm.expand(200, 16), 4, 2, gen(0), block_choice=last_block, p_mask_clean=0.5)
    frac = m.loss[:, :, :12].float().mean().item()
    assert 0.45 < frac < 0.55
    assert torch.equal(m.loss, m.completion & cm)


def test_empty_completion_has_no_loss_positions():
    cm = _cm([0, 4], 8)
    m = spg_block_masks(cm, 4, 2, gen(0))
    assert not m.loss[:, 0].any() and m.completion[:, 0].all()
    u = uniform_random_masks(cm, 2, gen(0))
    assert not u.loss[:, 0].any() and u.completion[:, 0].all()


def test_uniform_random_masks_counts_and_support():
    # length 4 in width 6: n ~ U{1..4} positions among the 4 valid ones; the 2 after-EOS always input-masked
    cm = _cm([4], 6).expand(4000, 6)
    m = uniform_random_masks(cm, 2, gen(0))
    counts = m.loss.sum(-1).flatten()
    assert counts.min() >= 1 and counts.max() <= 4
    freq = torch.bincount(counts, minlength=5)[1:].float() / counts.numel()
    assert torch.allclose(freq, torch.full((4,), 0.25), atol=0.03)  # uniform count
    pos_freq = m.loss.float().mean((0, 1))[:4]  # each valid position masked w.p. E[n]/4 = 2.5/4
    assert torch.allclose(pos_freq, torch.full((4,), 0.625), atol=0.03)
    assert m.completion[..., 4:].all() and not m.loss[..., 4:].any()


def test_uniform_random_masks_bernoulli_rule():
    cm = _cm([3, 8], 8).repeat(500, 1)
    m = uniform_random_masks(cm, 2, gen(0), rule="bernoulli")
    assert (m.loss.sum(-1) >= 1).all()
    assert not (m.loss & ~cm).any()
    # t ~ U(0, 1): each token masked w.p. E[t] = 1/2 (a little more for the at-least-one rule)
    assert 0.48 < m.loss[:, 1::2].float().mean().item() < 0.56
    with pytest.raises(ValueError, match="rule"):
        uniform_random_masks(cm, 2, gen(0), rule="x")


def test_full_completion_masks():
    cm = _cm([2, 3], 3)
    m = full_completion_masks(cm)
    assert m.completion.all() and torch.equal(m.loss[0], cm)


def test_prompt_masking_only_real_prompt_tokens():
    cm = _cm([4], 4).expand(500, 4)
    m = spg_block_masks(cm, 4, 2, gen(0))
    pm = torch.tensor([[0, 1, 1, 1]]).expand(500, 4)  # first prompt position is padding
    none = mask_prompt_tokens(m, pm, 0.0, gen(0))
    assert not none.prompt.any()
    some = mask_prompt_tokens(m, pm, 0.15, gen(0))
    assert some.prompt.shape == (2, 500, 4)
    assert not some.prompt[..., 0].any()  # padding never masked
    assert 0.12 < some.prompt[..., 1:].float().mean().item() < 0.18
    assert torch.equal(some.loss, m.loss)  # prompt tokens are never scored


def test_apply_masks_by_hand():
    ids = torch.tensor([[1, 2, 3, 4, 5]])  # prompt [1, 2], completion [3, 4, 5]
    masks = DiffusionMasks(
        completion=torch.tensor([[[False, True, True]], [[True, False, False]]]),
        loss=torch.tensor([[[False, True, False]], [[True, False, False]]]),
        prompt=torch.tensor([[[True, False]], [[False, False]]]),
    )
    noisy = apply_masks(ids, masks, 2, 9)
    # draw 0: prompt position 0 and completion positions 1, 2 masked -> [9, 2, 3, 9, 9]
    # draw 1: completion position 0 masked -> [1, 2, 9, 4, 5]
    assert noisy.tolist() == [[[9, 2, 3, 9, 9]], [[1, 2, 9, 4, 5]]]
    no_prompt = apply_masks(ids, masks._replace(prompt=None), 2, 9)
    assert no_prompt[0, 0, :2].tolist() == [1, 2]
    with pytest.raises(ValueError, match="prompt_len"):
        apply_masks(ids, masks, 3, 9)


def test_spg_block_choice_runs_over_the_rows_own_width_not_the_padding():
    # 8 valid blocks of 2 tokens in a batch padded to 17 blocks: over the padded width SPG's
    # perm % valid_blocks picks block 0 w.p. 3/17 = 0.176 (perm values 0, 8, 16); over the row's own
    # 8-block generation width it is uniform, 1/8
    B, bl = 4000, 2
    cm = _cm([16] * B, 34)
    m = spg_block_masks(cm, bl, 1, gen(0), gen_width=16)
    first = m.loss[0].float().argmax(-1) // bl  # (B,) chosen block = first scored position's block
    freq0 = (first == 0).float().mean().item()
    assert abs(freq0 - 1 / 8) < 0.02, freq0
    padded = spg_block_masks(cm, bl, 1, gen(0))  # the old behaviour: blocks counted over the padded width
    freq0_padded = ((padded.loss[0].float().argmax(-1) // bl) == 0).float().mean().item()
    assert abs(freq0_padded - 3 / 17) < 0.02, freq0_padded
    # padding is never scored and always masked in the input
    assert not m.loss[..., 16:].any() and m.completion[..., 16:].all()


def test_gen_width_equal_to_the_batch_width_changes_nothing():
    cm = _cm([7, 3, 12], 12)
    a = spg_block_masks(cm, 4, 3, gen(4), p_mask_clean=0.2)
    b = spg_block_masks(cm, 4, 3, gen(4), p_mask_clean=0.2, gen_width=12)
    assert torch.equal(a.completion, b.completion) and torch.equal(a.loss, b.loss)
    with pytest.raises(ValueError, match="gen_width"):
        spg_block_masks(cm, 4, 3, gen(4), gen_width=13)
