"""LLaDA's masked-denoising SFT loss (lit_rl/core/denoising.py) against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.core.denoising import denoising_masks, masked_denoising_loss


def test_loss_is_the_masked_cross_entropy_over_t_times_length_averaged_over_rows():
    # V = 2, L = 3. Row 0: logits (0, ln 3) at every position -> p(1) = 3/4, p(0) = 1/4; targets 1, 0, 1;
    # masked 1 and 2; t 0.5; length 3: (-ln(1/4) - ln(3/4)) / (0.5 * 3). Row 1: uniform logits, masked 0 only,
    # t 0.25, length 2: ln 2 / (0.25 * 2). The loss is their mean.
    logits = torch.tensor([[[0.0, math.log(3)]] * 3, [[0.0, 0.0]] * 3])  # (2, 3, 2)
    targets = torch.tensor([[1, 0, 1], [0, 1, 1]])
    masked = torch.tensor([[False, True, True], [True, False, False]])
    t, lengths = torch.tensor([0.5, 0.25]), torch.tensor([3, 2])
    row0 = (math.log(4) + math.log(4 / 3)) / 1.5
    row1 = math.log(2) / 0.5
    assert masked_denoising_loss(logits, targets, masked, t, lengths).item() == pytest.approx((row0 + row1) / 2)


def test_an_empty_row_counts_zero_and_its_length_never_divides_by_zero():
    logits, targets = torch.zeros(2, 2, 3), torch.zeros(2, 2, dtype=torch.long)
    masked = torch.tensor([[True, False], [False, False]])
    loss = masked_denoising_loss(logits, targets, masked, torch.tensor([1.0, 1.0]), torch.tensor([2, 0]))
    assert loss.item() == pytest.approx(math.log(3) / 2 / 2)  # row 0: ln 3 / (1 * 2); row 1: 0


def test_masks_only_valid_completion_tokens_with_t_in_eps_to_one():
    cm = torch.tensor([[1, 1, 1, 0, 0]] * 400)
    t, masked = denoising_masks(cm, torch.Generator().manual_seed(0), eps=0.2)
    assert t.shape == (400,) and bool(((t >= 0.2) & (t <= 1.0)).all())
    assert not bool(masked[:, 3:].any())  # padding is never masked
    # each valid token is masked with probability t: the share over rows follows the mean of t (0.6)
    assert masked[:, :3].float().mean().item() == pytest.approx(t.mean().item(), abs=0.05)
