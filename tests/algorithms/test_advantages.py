"""Tests for lit_rl.algorithms.advantages (ERILS Eq. 9 / Eq. 11 and the variant processors)."""

import math

import pytest
import torch

from lit_rl.algorithms.advantages import (
    ExternalOnly,
    Joint,
    OnPolicyOnly,
    SourceSpecific,
    joint_advantages,
    source_specific_advantages,
)

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


def test_a_continuation_row_counts_as_on_policy():
    # double rollout's rebuilt row (source 2) is the policy's own decode: the same Eq. 9 numbers as source 0
    s = S.clone()
    s[1] = 2
    torch.testing.assert_close(source_specific_advantages(R, s, G), source_specific_advantages(R, S, G))
    # the SPG baseline keeps it (a rebuilt row dropped would silently shrink the group); ExternalOnly drops it
    adv, keep = OnPolicyOnly()(R, s, G)
    assert keep.tolist() == [True, True, True, False, False, True, True, True, False]
    torch.testing.assert_close(adv, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0, 0, 0, 0, 0, 0]))
    assert ExternalOnly()(R, s, G)[1].tolist() == (S == 1).tolist()


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


def test_processors():
    adv, keep = SourceSpecific()(R, S, G)
    assert keep.all()
    torch.testing.assert_close(adv, source_specific_advantages(R, S, G))
    adv, keep = Joint()(R, S, G)
    assert keep.all()
    torch.testing.assert_close(adv, joint_advantages(R, S, G))
    # on-policy only: external dropped with A = 0; on-policy values unchanged
    adv, keep = OnPolicyOnly()(R, S, G)
    assert keep.tolist() == (S == 0).tolist()
    torch.testing.assert_close(adv, torch.tensor([1 / 3, -2 / 3, 1 / 3, 0, 0, 0, 0, 0, 0]))
    # external only: A = r on external rows; centred variant: group 0 ext mean 0.75 -> [0.25, -0.25], group 1 -> 0
    adv, keep = ExternalOnly()(R, S, G)
    assert keep.tolist() == (S == 1).tolist()
    torch.testing.assert_close(adv, torch.tensor([0, 0, 0, 1.0, 0.5, 0, 0, 0, 0.9]))
    adv, _ = ExternalOnly(center=True)(R, S, G)
    torch.testing.assert_close(adv, torch.tensor([0, 0, 0, 0.25, -0.25, 0, 0, 0, 0.0]))


def test_non_contiguous_group_ids():
    # groups [7, 3, 7, 3]: group 7 on-policy [1, 0] -> [0.5, -0.5]; group 3 on-policy [2, 4] -> [-1, 1]
    adv = source_specific_advantages(
        torch.tensor([1.0, 2.0, 0.0, 4.0]), torch.zeros(4, dtype=torch.long), torch.tensor([7, 3, 7, 3])
    )
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, -0.5, 1.0]))


def test_nan_rewards_are_dropped_or_raise():
    r = torch.tensor([1.0, float("nan"), 0.0, 0.7])
    s = torch.tensor([0, 0, 0, 1])
    g = torch.zeros(4, dtype=torch.long)
    # drop: the NaN row is excluded from the group mean (valid on-policy [1, 0] -> mean 0.5)
    with pytest.warns(RuntimeWarning, match="NaN"):
        adv, keep = SourceSpecific()(r, s, g)
    assert keep.tolist() == [True, False, True, True]
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.0, -0.5, 0.7]))
    with pytest.warns(RuntimeWarning):
        adv, _ = Joint()(r, s, g)
    assert torch.isfinite(adv).all()
    with pytest.raises(ValueError, match="NaN"):
        SourceSpecific(nan_policy="raise")(r, s, g)
    with pytest.raises(ValueError, match="NaN"):
        source_specific_advantages(r, s, g)


def test_validation():
    with pytest.raises(ValueError, match="source"):
        source_specific_advantages(R, S + 4, G)  # 4, 5: no row kind
    with pytest.raises(ValueError, match=r"\(B,\)"):
        joint_advantages(R, S[:3], G)
    with pytest.raises(ValueError, match="nan_policy"):
        Joint(nan_policy="x")


def test_frac_reward_zero_std_by_hand():
    from lit_rl.algorithms.advantages import frac_reward_zero_std

    # groups 0: [1, 1] equal; 1: [0, 1] not; 2: [0.5] one row, equal -> 2 of 3 groups have zero std
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    group = torch.tensor([0, 0, 1, 1, 2])
    assert frac_reward_zero_std(rewards, group) == pytest.approx(2 / 3)
    assert frac_reward_zero_std(torch.tensor([0.0, 0.25]), torch.tensor([7, 7])) == 0.0
    assert frac_reward_zero_std(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0
