"""Token entropy (the ``entropy`` diagnostic): hand-computed values, chunking, masking, and its logging by
both algorithms."""

import math

import torch

from lit_rl.core.entropy import masked_entropy_mean, token_entropy


def test_entropy_by_hand():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0],
                            [math.log(3.0), 0.0, -1e9, -1e9]]])  # (1, 3, 4)
    got = token_entropy(logits)
    # uniform over 4: log 4; (nearly) one-hot: 0; p = (3/4, 1/4): -(3/4 log 3/4 + 1/4 log 1/4)
    want = torch.tensor([[math.log(4), 0.0, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_chunking_changes_nothing_and_the_mask_selects():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    whole = token_entropy(logits, chunk=10_000)
    torch.testing.assert_close(token_entropy(logits, chunk=2), whole, atol=0, rtol=0)
    ref = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(whole, ref, atol=1e-6, rtol=1e-6)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 1] = mask[2, 4] = True
    torch.testing.assert_close(masked_entropy_mean(whole, mask), (whole[0, 1] + whole[2, 4]) / 2)
    assert masked_entropy_mean(whole, torch.zeros_like(mask)) == 0
