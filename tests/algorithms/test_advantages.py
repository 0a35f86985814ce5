"""lit_rl.algorithms.advantages: the advantage processors (ERILS Eq. 9 / Eq. 11 and the variants: which rows they
keep, NaN rewards); the pure functions they call are tested by hand in tests/core/test_advantages.py."""

import pytest
import torch

from lit_rl.algorithms.advantages import ExternalOnly, Joint, OnPolicyOnly, SourceSpecific
from lit_rl.core.advantages import joint_advantages, source_specific_advantages

# group 0: on-policy [1, 0, 1], external [1, 0.5]; group 1: on-policy [0.1, 0.1, 0.1], external [0.9]
R = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.1, 0.1, 0.1, 0.9])
S = torch.tensor([0, 0, 0, 1, 1, 0, 0, 0, 1])
G = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])


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
    with pytest.raises(ValueError, match="nan_policy"):
        Joint(nan_policy="x")
