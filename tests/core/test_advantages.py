"""lit_rl.core.advantages: ERILS Eq. 9 (source-specific) and Eq. 11 (joint) advantages and the zero-std share,
as pure tensor functions, against values computed by hand."""

import math

import pytest
import torch

from lit_rl.core.advantages import frac_reward_zero_std, joint_advantages, source_specific_advantages

# group 0: on-policy [1, 0, 1], external [1, 0.5]; group 1: on-policy [0.1, 0.1, 0.1], external [0.9]
R = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.1, 0.1, 0.1, 0.9])
S = torch.tensor([0, 0, 0, 1, 1, 0, 0, 0, 1])
G = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])


def test_source_specific_by_hand():
    # group 0 on-policy mean 2/3 -> [1/3, -2/3, 1/3]; external A = r = [1, 0.5]
    # group 1 on-policy all 0.1 -> exactly 0 (no rounding residue); external A = 0.9
    adv = source_specific_advantages(R, S, G)
    expected = torch.tensor([1 / 3, -2 / 3, 1 / 3, 1.0, 0.5, 0.0, 0.0, 0.0, 0.9])
    torch.testing.assert_close(adv, expected)
    assert (adv[5:8] == 0).all()


def test_joint_by_hand():
    # group 0 mean over all 5 = 3.5/5 = 0.7 -> [0.3, -0.7, 0.3, 0.3, -0.2]
    # group 1 mean = (0.3 + 0.9)/4 = 0.3 -> [-0.2, -0.2, -0.2, 0.6]
    adv = joint_advantages(R, S, G)
    expected = torch.tensor([0.3, -0.7, 0.3, 0.3, -0.2, -0.2, -0.2, -0.2, 0.6])
    torch.testing.assert_close(adv, expected)


def test_std_scaling_by_hand():
    # group 0 on-policy [1, 0, 1]: mean 2/3, unbiased var ((1/3)²·2 + (2/3)²)/2 = 1/3 -> std 1/√3
    # A = [1/3, -2/3, 1/3] / (1/√3 + 1e-4); all-equal group 1 stays exactly 0 (no 0/0)
    adv = source_specific_advantages(R, S, G, scale_std=True)
    d = 1 / math.sqrt(3) + 1e-4
    torch.testing.assert_close(adv[:3], torch.tensor([1 / 3, -2 / 3, 1 / 3]) / d)
    assert (adv[5:8] == 0).all()
    assert adv[3].item() == 1.0  # external rollouts are never centred or scaled


def test_non_contiguous_group_ids():
    # groups [7, 3, 7, 3]: group 7 on-policy [1, 0] -> [0.5, -0.5]; group 3 on-policy [2, 4] -> [-1, 1]
    adv = source_specific_advantages(
        torch.tensor([1.0, 2.0, 0.0, 4.0]), torch.zeros(4, dtype=torch.long), torch.tensor([7, 3, 7, 3])
    )
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, -0.5, 1.0]))


def test_frac_reward_zero_std_by_hand():
    # groups 0: [1, 1] equal; 1: [0, 1] not; 2: [0.5] one row, equal -> 2 of 3 groups have zero std
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    group = torch.tensor([0, 0, 1, 1, 2])
    assert frac_reward_zero_std(rewards, group) == pytest.approx(2 / 3)
    assert frac_reward_zero_std(torch.tensor([0.0, 0.25]), torch.tensor([7, 7])) == 0.0
    assert frac_reward_zero_std(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0


def test_validation():
    with pytest.raises(ValueError, match="source"):
        source_specific_advantages(R, S + 4, G)  # 4, 5: no row kind
    with pytest.raises(ValueError, match=r"\(B,\)"):
        joint_advantages(R, S[:3], G)
