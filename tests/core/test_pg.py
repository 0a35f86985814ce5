"""Hand-computed tests for lit_rl.core.pg (expected values derived in the comments)."""

import math

import pytest
import torch

from lit_rl.core.advantages import group_centered
from lit_rl.core.pg import (
    aggregate,
    cispo_loss,
    clipped_pg_loss,
    is_truncated,
    k3_kl,
    truncation_mask,
)


# ----------------------------------------------------------------------------- group_centered
class TestGroupAdvantages:
    def test_mean_centred_and_constant_group_is_zero(self):
        # group 0: rewards [1, 0, 0], mean 1/3 -> [2/3, -1/3, -1/3]
        # group 1: rewards all 0.5 -> exactly 0
        rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 0.5])
        group = torch.tensor([0, 0, 0, 1, 1, 1])
        adv = group_centered(rewards, group)
        torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]))

    def test_arbitrary_unsorted_group_ids(self):
        # group 7: rows 0, 2 rewards [1, 3], mean 2 -> [-1, 1]
        # group 3: rows 1, 3 rewards [2, 6], mean 4 -> [-2, 2]
        adv = group_centered(torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([7, 3, 7, 3]))
        torch.testing.assert_close(adv, torch.tensor([-1.0, -2.0, 1.0, 2.0]))

    def test_scale_std_uses_sample_std(self):
        # group 0 deviations [2/3, -1/3, -1/3]; squares sum 4/9 + 1/9 + 1/9 = 2/3; / (n-1 = 2) = 1/3
        # std = 1/sqrt(3) -> A = dev * sqrt(3) = [2/sqrt(3), -1/sqrt(3), -1/sqrt(3)] (eps = 0)
        rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 0.5])
        group = torch.tensor([0, 0, 0, 1, 1, 1])
        adv = group_centered(rewards, group, scale_std=True, eps=0.0)
        s3 = math.sqrt(3)
        torch.testing.assert_close(adv, torch.tensor([2 / s3, -1 / s3, -1 / s3, 0.0, 0.0, 0.0]))
        assert torch.isfinite(adv).all()
        # same as torch.std (Bessel-corrected) on group 0
        r0 = rewards[:3]
        torch.testing.assert_close(adv[:3], (r0 - r0.mean()) / r0.std())

    def test_leave_one_out(self):
        # rewards [1, 0, 0, 0]: row 0 baseline mean(0, 0, 0) = 0 -> 1
        # rows 1..3 baseline mean(1, 0, 0) = 1/3 -> -1/3
        rewards, group = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long)
        adv = group_centered(rewards, group, leave_one_out=True)
        torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))

    def test_constant_group_exact_zero_despite_roundoff(self):
        # 0.1 is not exact in binary; r - mean(r) could leave ~1e-17 residue. It must be exactly 0,
        # also with std scaling (no 0/0).
        rewards = torch.tensor([0.1, 0.1, 0.1])
        group = torch.zeros(3, dtype=torch.long)
        for kwargs in ({}, {"scale_std": True}, {"leave_one_out": True}, {"scale_std": True, "eps": 0.0}):
            adv = group_centered(rewards, group, **kwargs)
            assert torch.equal(adv, torch.zeros(3)), kwargs

    def test_singleton_group_is_zero(self):
        adv = group_centered(torch.tensor([3.0, 1.0, 0.0]), torch.tensor([0, 1, 1]), leave_one_out=True)
        # group 0 has one member -> 0; group 1: [1, 0], LOO baselines [0, 1] -> [1, -1]
        torch.testing.assert_close(adv, torch.tensor([0.0, 1.0, -1.0]))

    def test_shape_check(self):
        with pytest.raises(ValueError):
            group_centered(torch.zeros(3), torch.zeros(4, dtype=torch.long))

    def test_nan_reward_is_dropped_not_spread_over_its_group(self):
        rewards = torch.tensor([1.0, 0.0, math.nan, 1.0, math.nan])
        group = torch.tensor([0, 0, 0, 1, 2])
        # group 0 over its valid rows [1, 0]: mean 0.5 -> [0.5, -0.5], the NaN row 0; group 1 one row -> 0;
        # group 2 has no valid row -> 0
        torch.testing.assert_close(group_centered(rewards, group), torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0]))
        # sample std of [1, 0] is sqrt(0.5) = 0.7071 -> +-0.5 / 0.7071 = +-0.7071 (eps 0)
        torch.testing.assert_close(group_centered(rewards, group, scale_std=True, eps=0.0),
                                   torch.tensor([0.7071, -0.7071, 0, 0, 0]), atol=1e-4, rtol=0)
        # RLOO over the 2 valid rows: n/(n-1) = 2 -> [1, -1]
        torch.testing.assert_close(group_centered(rewards, group, leave_one_out=True),
                                   torch.tensor([1.0, -1.0, 0, 0, 0]))


# ----------------------------------------------------------------------------- clipped_pg_loss
def _single(logratio: float, adv: float, **kw):
    """One sequence, one token, old_logp = 0 so ratio = exp(logratio)."""
    logp = torch.tensor([[logratio]], requires_grad=True)
    loss, stats = clipped_pg_loss(logp, torch.zeros(1, 1), torch.tensor([adv]),
                                  torch.ones(1, 1, dtype=torch.bool), **kw)
    loss.backward()
    return loss, stats, logp.grad


class TestClippedPGLoss:
    def test_ratio_one_is_reinforce(self):
        # ratio = 1 everywhere. A = [2, -1], two tokens each -> per-token pg = -A = [-2, -2, 1, 1]
        # token-mean = (-2 - 2 + 1 + 1) / 4 = -0.5. d loss / d logp = -A * ratio / 4 = [-0.5, -0.5, 0.25, 0.25]
        logp = torch.full((2, 2), -1.0, requires_grad=True)
        loss, stats = clipped_pg_loss(logp, logp.detach().clone(), torch.tensor([2.0, -1.0]), torch.ones(2, 2))
        loss.backward()
        torch.testing.assert_close(loss, torch.tensor(-0.5))
        torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5], [0.25, 0.25]]))
        assert stats["clip_frac"] == 0 and stats["ratio_mean"] == 1 and stats["kl_mean"] == 0

    def test_positive_advantage_clipped_high(self):
        # ratio = e ~ 2.718 > 1.28; A = 1: unclipped -e, clipped -1.28; max -> -1.28, no gradient
        loss, stats, grad = _single(1.0, 1.0)
        torch.testing.assert_close(loss, torch.tensor(-1.28))
        torch.testing.assert_close(grad, torch.zeros(1, 1))
        assert stats["clip_frac"] == 1 and stats["clip_frac_high"] == 1 and stats["clip_frac_low"] == 0
        torch.testing.assert_close(stats["ratio_mean"], torch.tensor(math.e))

    def test_symmetric_when_eps_high_none(self):
        # clipped ratio becomes 1 + eps_low = 1.2 -> loss -1.2
        loss, _, _ = _single(1.0, 1.0, eps_high=None)
        torch.testing.assert_close(loss, torch.tensor(-1.2))

    def test_negative_advantage_clipped_low(self):
        # ratio = e^-1 ~ 0.368 < 0.8; A = -1: unclipped 0.368, clipped 0.8; max -> 0.8, no gradient
        loss, stats, grad = _single(-1.0, -1.0)
        torch.testing.assert_close(loss, torch.tensor(0.8))
        torch.testing.assert_close(grad, torch.zeros(1, 1))
        assert stats["clip_frac_low"] == 1 and stats["clip_frac_high"] == 0

    def test_pessimistic_bound_keeps_unclipped(self):
        # A = -1, ratio = e: unclipped e ~ 2.718 beats clipped 1.28 -> loss e, gradient d(e^x)/dx = e
        loss, stats, grad = _single(1.0, -1.0)
        torch.testing.assert_close(loss, torch.tensor(math.e))
        torch.testing.assert_close(grad, torch.tensor([[math.e]]))
        assert stats["clip_frac"] == 0
        # A = +1, ratio = e^-1: unclipped -0.368 beats clipped -0.8 -> loss -e^-1
        loss, stats, _ = _single(-1.0, 1.0)
        torch.testing.assert_close(loss, torch.tensor(-math.exp(-1)))
        assert stats["clip_frac"] == 0

    def test_mask_excludes_tokens(self):
        # third token is padding with a huge log-ratio; only the first two count: ratio 1, A = 1 -> -1
        logp = torch.tensor([[0.0, 0.0, 50.0]], requires_grad=True)
        loss, stats = clipped_pg_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([[1, 1, 0]]))
        loss.backward()
        torch.testing.assert_close(loss, torch.tensor(-1.0))
        assert logp.grad[0, 2] == 0
        torch.testing.assert_close(stats["ratio_mean"], torch.tensor(1.0))

    @pytest.mark.parametrize(
        "aggregation, expected",
        [
            # seq 0: A = 1, two valid tokens -> per-token [-1, -1]; seq 1: A = -3, one valid token -> [3]
            ("token-mean", 1 / 3),  # (-1 - 1 + 3) / 3
            ("seq-mean-token-mean", 1.0),  # mean(-1, 3)
            ("seq-mean-token-sum-norm", 0.25),  # (-1 - 1 + 3) / (B * L = 2 * 2)
        ],
    )
    def test_aggregation(self, aggregation, expected):
        logp = torch.zeros(2, 2)
        mask = torch.tensor([[1, 1], [1, 0]])
        loss, _ = clipped_pg_loss(logp, logp, torch.tensor([1.0, -3.0]), mask, aggregation=aggregation)
        torch.testing.assert_close(loss, torch.tensor(expected))

    def test_seq_mean_skips_fully_masked_rows(self):
        # row 1 fully masked (e.g. truncated): seq-mean over row 0 only -> -1
        per_token = torch.tensor([[-1.0, -1.0], [5.0, 5.0]])
        mask = torch.tensor([[1, 1], [0, 0]])
        torch.testing.assert_close(aggregate(per_token, mask, "seq-mean-token-mean"), torch.tensor(-1.0))

    def test_k3_kl(self):
        # logp = 0, ref = ln 2: d = ln 2 -> k3 = e^d - d - 1 = 2 - ln 2 - 1 = 1 - ln 2 ~ 0.3069
        # A = 0 so pg = 0; kl_beta 0.1 -> loss = 0.1 * (1 - ln 2)
        logp = torch.zeros(1, 2)
        ref = torch.full((1, 2), math.log(2))
        loss, stats = clipped_pg_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), ref_logp=ref, kl_beta=0.1)
        torch.testing.assert_close(loss, torch.tensor(0.1 * (1 - math.log(2))))
        torch.testing.assert_close(stats["kl_mean"], torch.tensor(1 - math.log(2)))
        # k3 is zero at ref == logp and non-negative
        assert torch.equal(k3_kl(logp, logp), torch.zeros(1, 2))
        assert (k3_kl(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()

    def test_kl_reported_but_not_added_when_beta_zero(self):
        logp = torch.zeros(1, 1)
        ref = torch.full((1, 1), math.log(2))
        loss, stats = clipped_pg_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 1), ref_logp=ref)
        torch.testing.assert_close(loss, torch.tensor(-1.0))
        assert stats["kl_mean"] > 0

    def test_stats_detached_and_loss_has_grad(self):
        logp = torch.randn(3, 4, requires_grad=True)
        loss, stats = clipped_pg_loss(logp, logp.detach() + 0.1, torch.randn(3), torch.ones(3, 4))
        assert loss.requires_grad
        assert all(not v.requires_grad and v.ndim == 0 for v in stats.values())

    def test_extreme_log_probs_at_masked_positions_never_make_nan(self):
        # position 2 is padding whose old log-prob is -200: log-ratio 199 would exp to inf, and inf * 0 is NaN.
        # Only position 1 counts (ratio 1): A = -1 -> loss 1, A = 0 -> 0; k3 KL at the valid token: ref = logp -> 0
        logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
        old = torch.tensor([[-1.0, -200.0]])
        ref = torch.tensor([[-1.0, 100.0]])
        mask = torch.tensor([[True, False]])
        for adv, expected in ((-1.0, 1.0), (0.0, 0.0), (1.0, -1.0)):
            loss, stats = clipped_pg_loss(logp, old, torch.tensor([adv]), mask, ref_logp=ref, kl_beta=0.1)
            loss.backward()
            assert loss.item() == pytest.approx(expected), adv
            assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
            assert all(torch.isfinite(v) for v in stats.values()) and stats["ratio_mean"] == 1 and stats["kl_mean"] == 0
            logp.grad = None

    def test_all_masked_is_zero_and_backprops(self):
        logp = torch.randn(2, 3, requires_grad=True)
        loss, _ = clipped_pg_loss(logp, logp.detach(), torch.ones(2), torch.zeros(2, 3))
        loss.backward()
        assert loss.item() == 0 and torch.equal(logp.grad, torch.zeros(2, 3))

    def test_errors(self):
        x = torch.zeros(1, 2)
        with pytest.raises(ValueError):
            clipped_pg_loss(x, x, torch.zeros(1), torch.ones(1, 2), kl_beta=0.1)
        with pytest.raises(ValueError):
            clipped_pg_loss(x, x, torch.zeros(1), torch.ones(1, 2), aggregation="sum")
        with pytest.raises(ValueError):
            clipped_pg_loss(x, x, torch.zeros(2), torch.ones(1, 2))


# ----------------------------------------------------------------------------- truncation
class TestTruncation:
    def test_rows_without_eos_dropped(self):
        # row 0 has EOS (2) inside its valid tokens; row 1 hit the limit without EOS
        ids = torch.tensor([[5, 2, 0], [5, 5, 5]])
        mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
        assert is_truncated(ids, mask, 2).tolist() == [False, True]
        assert truncation_mask(ids, mask, 2).tolist() == [[1, 1, 0], [0, 0, 0]]
        assert torch.equal(truncation_mask(ids, mask, 2, enabled=False), mask)

    def test_eos_in_padding_does_not_count_and_multiple_eos_ids(self):
        ids = torch.tensor([[5, 5, 2], [5, 9, 0]])
        mask = torch.tensor([[True, True, False], [True, True, False]])
        # row 0: the EOS lies in padding -> truncated; row 1 ends with 9, an accepted end token
        assert is_truncated(ids, mask, [2, 9]).tolist() == [True, False]
        out = truncation_mask(ids, mask, [2, 9])
        assert out.dtype == torch.bool and out.tolist() == [[False, False, False], [True, True, False]]


# ----------------------------------------------------------------------------- CISPO
def test_cispo_by_hand_every_token_keeps_a_gradient_scaled_by_its_clipped_weight():
    # ratios exp(0.5) = 1.6487 -> clipped to 1.28, exp(-1) = 0.3679 -> clipped to 0.8 (eps 0.2 / 0.28)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0]])
    adv, mask = torch.tensor([2.0]), torch.ones(1, 2, dtype=torch.bool)
    loss, stats = cispo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # loss_t = -w_t A logp_t: -1.28 * 2 * -1 = 2.56, -0.8 * 2 * -2 = 3.2; token mean 2.88
    assert float(loss) == pytest.approx(2.88, abs=1e-5)
    loss.backward()
    # d/dlogp_t = -w_t A / 2 tokens: both tokens keep a gradient (the PPO clip gives 0 to both here)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -0.8]]), atol=1e-6, rtol=0)
    assert float(stats["clip_frac"]) == 1.0 and float(stats["clip_frac_low"]) == 0.5
    # the PPO clip on the same tokens: A > 0, ratio 1.65 above the range (clipped: no gradient), ratio 0.37
    # below it (the unclipped term is the max: gradient -ratio A / 2 = -0.3679)
    ppo = logp.detach().clone().requires_grad_(True)
    clipped_pg_loss(ppo, old, adv, mask, eps_low=0.2, eps_high=0.28)[0].backward()
    torch.testing.assert_close(ppo.grad, torch.tensor([[0.0, -math.exp(-1.0)]]), atol=1e-5, rtol=0)
    # at ratio 1 (the first update) CISPO's gradient is REINFORCE's, the same as the PPO clip's
    fresh = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    cispo_loss(fresh, fresh.detach(), adv, mask)[0].backward()
    same = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    clipped_pg_loss(same, same.detach(), adv, mask)[0].backward()
    torch.testing.assert_close(fresh.grad, same.grad)
    # eps_low 1: no lower bound (a weight of exp(-3) stays exp(-3)); padding with -inf log-probs is ignored
    lp = torch.tensor([[-4.0, float("-inf")]], requires_grad=True)
    m = torch.tensor([[True, False]])
    loss, _ = cispo_loss(lp, torch.tensor([[-1.0, 0.0]]), torch.tensor([1.0]), m, eps_low=1.0, eps_high=0.28)
    assert float(loss) == pytest.approx(-math.exp(-3.0) * -4.0, rel=1e-5) and torch.isfinite(loss)
