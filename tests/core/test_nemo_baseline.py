"""NeMo-RL's GRPO advantage (``group_centered(..., std_of="baseline")``, the DR paper's baseline) and the
``bonus`` added after the baseline (double rollout's length bonus), by hand.

NeMo-RL's rule (nemo_rl/algorithms/utils.py ``calculate_baseline_and_std_per_prompt``, advantage_estimator.py
``GRPOAdvantageEstimator``): b_i = mean of the others (leave-one-out) or of all; σ_i = sample std of the same
set (0 for fewer than two); A_i = (r_i − b_i)/(σ_i + eps) where σ_i > 0, else r_i − b_i.
"""

import math

import pytest
import torch

from lit_rl.algorithms.losses import GRPOLossSettings
from lit_rl.algorithms.processors import GroupBaseline
from lit_rl.core.advantages import group_centered
from lit_rl.errors import FieldError

S3 = math.sqrt(3)
ONE = torch.zeros(4, dtype=torch.long)  # one group of four


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def nemo(rewards, group=ONE, loo=True, eps=0.0, **kw):
    return group_centered(torch.tensor(rewards, dtype=torch.float64), group, scale_std=True, leave_one_out=loo,
                          std_of="baseline", eps=eps, **kw)


def test_one_correct_of_four():
    # [1, 0, 0, 0], leave-one-out:
    #   row 0: others [0, 0, 0] -> b 0, σ 0 (all equal) -> A = 1 - 0 = 1, NOT divided
    #   rows 1-3: others [1, 0, 0] -> b 1/3; sample var ((2/3)² + 2·(1/3)²)/2 = 1/3 -> σ 1/√3;
    #             A = (0 - 1/3)·√3 = -1/√3
    torch.testing.assert_close(nemo([1.0, 0, 0, 0]), t(1.0, -1 / S3, -1 / S3, -1 / S3))
    # std_of="group" divides row 0's LOO advantage 1 by the whole group's sample std 1/2 -> 2
    got = group_centered(torch.tensor([1.0, 0, 0, 0]), ONE, scale_std=True, leave_one_out=True, eps=0.0)
    torch.testing.assert_close(got, torch.tensor([2.0, -2 / 3, -2 / 3, -2 / 3]))
    # without leave-one-out: b 1/4 for all, σ = sample std of all = sqrt((9/16 + 3/16)/3) = 1/2
    #   A = [3/4, -1/4, -1/4, -1/4] / (1/2) = [1.5, -0.5, -0.5, -0.5] (the same as std_of="group")
    torch.testing.assert_close(nemo([1.0, 0, 0, 0], loo=False), t(1.5, -0.5, -0.5, -0.5))


def test_two_correct_of_four():
    # [1, 1, 0, 0], leave-one-out: a 1 row's others [1, 0, 0] -> b 1/3, σ 1/√3 -> A = (2/3)·√3 = 2/√3;
    #   a 0 row's others [1, 1, 0] -> b 2/3, σ 1/√3 -> A = -2/√3
    torch.testing.assert_close(nemo([1.0, 1, 0, 0]), t(2 / S3, 2 / S3, -2 / S3, -2 / S3))
    # without: b 1/2, σ = sqrt(4·(1/4)/3) = 1/√3 -> A = ±(1/2)·√3
    h = S3 / 2
    torch.testing.assert_close(nemo([1.0, 1, 0, 0], loo=False), t(h, h, -h, -h))


def test_sigma_zero_row_is_exact_not_roundoff_and_keeps_its_raw_advantage():
    # [0.1, 0.1, 0.1, 0.7]: row 3's others are three equal 0.1 (not exact in binary: a variance from sums could
    # leave ~1e-18 and divide by ~1e-9) -> σ 0, A = 0.7 - 0.1 = 0.6 undivided, also with eps 1e-6;
    # rows 0-2: others [0.1, 0.1, 0.7] -> b 0.3, sample var (2·0.04 + 0.16)/2 = 0.12 -> A = -0.2/sqrt(0.12)
    for eps in (0.0, 1e-6):
        got = nemo([0.1, 0.1, 0.1, 0.7], eps=eps)
        a = -0.2 / (math.sqrt(0.12) + eps)
        torch.testing.assert_close(got, t(a, a, a, 0.6))
    # eps divides only where σ > 0: [1, 0, 0, 0] with eps 1e-6 -> row 0 still exactly 1
    got = nemo([1.0, 0, 0, 0], eps=1e-6)
    assert got[0].item() == 1.0 and got[1].item() == pytest.approx(-(1 / 3) / (1 / S3 + 1e-6), rel=1e-12)


def test_small_groups_and_nan():
    # group 0: one member -> 0 (NeMo-RL: baseline = reward); group 1: two members [1, 0] -> each row's
    # "others" is one reward -> σ 0 -> A = r - other = [1, -1] undivided; group 2: NaN row 3 out, [2, 0, 1]
    # left: row 4 others [0, 1] b 1/2 σ sqrt(1/2) -> 1.5/sqrt(.5); row 5 others [2, 1] b 3/2 -> -1.5/sqrt(.5);
    # row 6 others [2, 0] b 1 σ sqrt(2) -> 0
    r = t(5.0, 1.0, 0.0, math.nan, 2.0, 0.0, 1.0)
    g = torch.tensor([0, 1, 1, 2, 2, 2, 2])
    got = group_centered(r, g, scale_std=True, leave_one_out=True, std_of="baseline", eps=0.0)
    k = 1.5 / math.sqrt(0.5)
    torch.testing.assert_close(got, t(0.0, 1.0, -1.0, 0.0, k, -k, 0.0))
    # a constant group is exactly 0
    assert torch.equal(nemo([0.3, 0.3, 0.3, 0.3]), torch.zeros(4, dtype=torch.float64))


def _nemo_loop(r: list[float], g: list[int], loo: bool, eps: float) -> list[float]:
    """The rule written out row by row (statistics.stdev of the baseline's set)."""
    import statistics

    out = []
    for i, (ri, gi) in enumerate(zip(r, g)):
        group = [j for j, gj in enumerate(g) if gj == gi]
        if len(group) <= 1:
            out.append(0.0)
            continue
        s = [r[j] for j in group if not (loo and j == i)]
        b = sum(s) / len(s)
        sd = statistics.stdev(s) if len(s) >= 2 else 0.0
        out.append((ri - b) / (sd + eps) if sd > 0 else ri - b)
    return out


@pytest.mark.parametrize("loo", [True, False])
def test_matches_the_rule_written_out_on_random_groups(loo):
    gen = torch.Generator().manual_seed(0)
    g = torch.randint(0, 6, (40,), generator=gen)
    r = torch.randint(0, 4, (40,), generator=gen).double() / 2  # ties, so σ = 0 cases occur
    got = group_centered(r, g, scale_std=True, leave_one_out=loo, std_of="baseline", eps=1e-6)
    want = _nemo_loop(r.tolist(), g.tolist(), loo, 1e-6)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-9, rtol=1e-9)


def test_default_is_bitwise_the_earlier_formula():
    # group_centered's default (std_of "group") against the earlier code path, written out
    gen = torch.Generator().manual_seed(1)
    g = torch.randint(0, 5, (64,), generator=gen)
    r = torch.rand(64, generator=gen)
    for scale_std in (False, True):
        for loo in (False, True):
            r64 = r.double()
            _, d = torch.unique(g, return_inverse=True)
            G = int(d.max()) + 1
            cnt = torch.zeros(G, dtype=torch.float64).index_add_(0, d, torch.ones_like(r64))
            mean = torch.zeros(G, dtype=torch.float64).index_add_(0, d, r64) / cnt.clamp(min=1)
            adv = r64 - mean[d]
            if loo:
                n = cnt[d]
                adv = torch.where(n > 1, adv * n / (n - 1).clamp(min=1), torch.zeros_like(adv))
            if scale_std:
                sq = torch.zeros(G, dtype=torch.float64).index_add_(0, d, (r64 - mean[d]) ** 2)
                adv = adv / ((sq / (cnt - 1).clamp(min=1)).sqrt()[d] + 1e-4)
            got = group_centered(r, g, scale_std=scale_std, leave_one_out=loo)
            assert torch.equal(got, adv.float()), (scale_std, loo)


def test_bonus_is_added_after_the_baseline():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0])
    bonus = torch.tensor([0.5, 0.0, 0.0, 0.0])
    # mean-centred: baseline 3/4 from r (not from r + bonus): A = [1/4 + 1/2, 1/4, 1/4, -3/4]
    torch.testing.assert_close(group_centered(r, ONE, bonus=bonus), torch.tensor([0.75, 0.25, 0.25, -0.75]))
    # std "group": σ = sqrt(3·(1/16) + 9/16)/sqrt(3) = 1/2 -> [.5, .5, .5, -1.5] + bonus/σ = [1.5, .5, .5, -1.5]
    torch.testing.assert_close(group_centered(r, ONE, scale_std=True, eps=0.0, bonus=bonus),
                               torch.tensor([1.5, 0.5, 0.5, -1.5]))
    # NeMo-RL LOO: row 0's others [1, 1, 0] b 2/3 σ 1/√3 -> (1/3 + 1/2)·√3; rows 1, 2 (1/3)·√3; row 3's others
    # [1, 1, 1] σ 0 -> -1 undivided
    torch.testing.assert_close(nemo([1.0, 1, 1, 0], bonus=bonus.double()),
                               t((5 / 6) * S3, S3 / 3, S3 / 3, -1.0))
    # a constant group: 0 plus the bonus, undivided (no std to divide by); NaN rows stay 0
    got = group_centered(torch.tensor([2.0, 2.0, math.nan]), torch.zeros(3, dtype=torch.long), scale_std=True,
                         bonus=torch.tensor([0.5, 0.0, 1.0]))
    assert got.tolist() == [0.5, 0.0, 0.0]


@pytest.mark.parametrize("kw", [{}, {"scale_std": True}, {"scale_std": True, "leave_one_out": True},
                                {"scale_std": True, "leave_one_out": True, "std_of": "baseline", "eps": 1e-6}])
def test_a_nonnegative_bonus_never_lowers_an_advantage(kw):
    gen = torch.Generator().manual_seed(2)
    g = torch.randint(0, 4, (32,), generator=gen)
    r = torch.randint(0, 3, (32,), generator=gen).float()
    bonus = torch.rand(32, generator=gen) * (torch.rand(32, generator=gen) < 0.5)
    base, with_bonus = group_centered(r, g, **kw), group_centered(r, g, bonus=bonus, **kw)
    assert (with_bonus >= base).all() and torch.equal(with_bonus > base, bonus > 0)


def test_settings_and_processor_carry_the_rule():
    with pytest.raises(FieldError, match="std_of"):
        GRPOLossSettings(std_of="others")
    with pytest.raises(FieldError, match="std_of"):
        GroupBaseline(std_of="nemo")
    with pytest.raises(ValueError, match="std_of"):
        group_centered(torch.zeros(2), torch.zeros(2, dtype=torch.long), std_of="x")
    assert GRPOLossSettings().std_of == "group"  # the default stays TRL's rule
    b = GroupBaseline(scale_std=True, leave_one_out=True, eps=0.0, std_of="baseline")
    torch.testing.assert_close(b(torch.tensor([1.0, 0, 0, 0]), ONE), torch.tensor([1.0, -1 / S3, -1 / S3, -1 / S3]))
    assert "std_of='baseline'" in repr(b) and repr(GroupBaseline()) == (
        "GroupBaseline(scale_std=False, leave_one_out=False, eps=0.0001)")
