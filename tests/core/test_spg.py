"""lit_rl.core.spg: SPG's bounds (ELBO, EUBO, mix), its loss, d1's and wd1's losses, as pure tensor functions;
expected values computed by hand in the comments."""

import math

import pytest
import torch

from lit_rl.core.spg import (
    d1_loss,
    elbo,
    eubo,
    mix,
    sequence_logprob_sum,
    spg_loss,
    spg_select,
    token_logprobs_from_logits,
    wd1_loss,
)

LN2 = math.log(2)

# Two sequences, three tokens, num_t = 2. Probabilities of the original tokens under each noisy input:
P = torch.tensor(
    [
        [[0.5, 0.25, 0.5], [0.5, 0.5, 0.5]],  # draw 0: seq 0, seq 1
        [[0.5, 0.5, 0.25], [0.25, 0.5, 0.5]],  # draw 1
    ]
)
LOGP = P.log()  # (num_t=2, B=2, L=3)
M = torch.tensor(
    [
        [[1, 1, 0], [0, 0, 1]],  # draw 0 scored positions
        [[0, 1, 1], [1, 1, 1]],  # draw 1
    ]
).bool()
LENGTHS = torch.tensor([3, 3])


def test_elbo_by_hand():
    # seq 0: draw 0 (log .5 + log .25)/2 = -1.5 ln2; draw 1 (log .5 + log .25)/2 = -1.5 ln2 -> -1.5 ln2
    # seq 1: draw 0 log .5 = -ln2; draw 1 (log .25 + log .5 + log .5)/3 = -4/3 ln2 -> mean = -7/6 ln2
    expected = torch.tensor([-1.5 * LN2, -7 / 6 * LN2])
    torch.testing.assert_close(elbo(LOGP, M), expected)


def test_eubo_by_hand_beta_1():
    # seq 0: t_0 = t_1 = 2/3
    #   a_0 = (0.5/(2/3) + 0)/2 = 0.375; a_1 = (0.25/(2/3) + 0.5/(2/3))/2 = 0.5625; a_2 = (0 + 0.25/(2/3))/2 = 0.1875
    # seq 1: t_0 = 1/3, t_1 = 1
    #   a_0 = (0 + 0.25)/2 = 0.125; a_1 = (0 + 0.5)/2 = 0.25; a_2 = (0.5*3 + 0.5)/2 = 1.0
    #   EUBO = (log .125 + log .25 + log 1)/3 = -5/3 ln2
    expected = torch.tensor(
        [(math.log(0.375) + math.log(0.5625) + math.log(0.1875)) / 3, -5 / 3 * LN2]
    )
    torch.testing.assert_close(eubo(LOGP, M, LENGTHS, beta=1.0), expected)


def test_eubo_by_hand_beta_2():
    # seq 1, β = 2: a_0 = (0 + .25²/1)/2 = 2^-5; a_1 = (.5²/1)/2 = 2^-3; a_2 = (.5²·3 + .5²)/2 = 2^-1
    #   EUBO = mean(-5, -3, -1)·ln2 / 2 = -1.5 ln2
    out = eubo(LOGP, M, LENGTHS, beta=2.0)
    torch.testing.assert_close(out[1], torch.tensor(-1.5 * LN2))


def test_eubo_matches_reference_formula_and_is_stable():
    # the log-space computation equals SPG's direct mean_j(p^β·1[M]/t_j) then log on random inputs
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, 6, generator=g, dtype=torch.float64) * 3
    m = torch.rand(3, 4, 6, generator=g) < 0.5
    lengths = torch.tensor([6, 5, 6, 4])
    m &= torch.arange(6)[None, None, :] < lengths[None, :, None]
    beta = 1.5
    t = m.sum(-1).double() / lengths.double()  # (num_t, B)
    a = (logp.exp() ** beta * m / t.clamp(min=1e-8)[..., None]).mean(0)  # (B, L)
    ref = torch.stack([a[b][a[b] > 0].log().mean() / beta for b in range(4)])
    torch.testing.assert_close(eubo(logp, m, lengths, beta), ref)
    # very unlikely tokens: p^β underflows float32 in the direct form, the log form stays exact
    # one draw, one position, t = 1: EUBO = β·logp / β = logp = -200
    out = eubo(torch.tensor([[[-200.0]]]), torch.tensor([[[True]]]), torch.tensor([1]), beta=2.0)
    torch.testing.assert_close(out, torch.tensor([-200.0]))


def test_values_outside_loss_mask_are_ignored_even_nan():
    logp = LOGP.clone().requires_grad_(True)
    poisoned = torch.where(M, logp, torch.full_like(logp, float("nan")))
    lo, up = elbo(poisoned, M), eubo(poisoned, M, LENGTHS, 1.5)
    assert torch.isfinite(lo).all() and torch.isfinite(up).all()
    (lo.sum() + up.sum()).backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~M] == 0).all()


def test_empty_loss_mask_gives_zero_not_nan():
    m = torch.zeros(2, 1, 3, dtype=torch.bool)
    logp = torch.zeros(2, 1, 3)
    assert elbo(logp, m).item() == 0.0
    assert eubo(logp, m, torch.tensor([0]), 1.0).item() == 0.0


def test_mix_and_select():
    # mix(w=0.5) for seq 1: 0.5·(-5/3 ln2) + 0.5·(-7/6 ln2) = -17/12 ln2
    lo, up = elbo(LOGP, M), eubo(LOGP, M, LENGTHS, 1.0)
    torch.testing.assert_close(mix(lo, up, 0.5)[1], torch.tensor(-17 / 12 * LN2))
    # A > 0 -> ELBO (lower bound); A <= 0 -> the negative branch, A == 0 included (SPG: advantages > 0)
    s = spg_select(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([2.0, 2.0, 2.0]), torch.tensor([0.5, 0.0, -0.5]))
    assert s.tolist() == [1.0, 2.0, 2.0]


def test_spg_loss_normalisation_by_hand():
    # A = [1, -0.5], S = [-1, -2], L = [2, 4]
    # terms -A·S·L: -(1)(-1)(2) = 2 and -(-0.5)(-2)(4) = -4 -> sum -2; / ΣL = 6 -> -1/3
    loss, stats = spg_loss(torch.tensor([1.0, -0.5]), torch.tensor([-1.0, -2.0]), torch.tensor([2, 4]))
    torch.testing.assert_close(loss, torch.tensor(-1 / 3))
    assert not stats["loss"].requires_grad
    assert stats["frac_positive_advantage"].item() == 0.5
    # ERILS Eq. 10's equal weighting (SPGSurrogate(weighting="rollout") passes ones): A = [1, -0.5],
    # S = [-1, -3]: terms -A·S = 1 and -1.5 -> sum -0.5 / 2 rollouts = -0.25; by length L = [2, 4]:
    # 2 and -6 -> -4 / 6 = -2/3
    A, S = torch.tensor([1.0, -0.5]), torch.tensor([-1.0, -3.0])
    torch.testing.assert_close(spg_loss(A, S, torch.ones(2))[0], torch.tensor(-0.25))
    torch.testing.assert_close(spg_loss(A, S, torch.tensor([2, 4]))[0], torch.tensor(-2 / 3))


def test_token_logprobs_from_logits():
    logits = torch.tensor([[[0.0, math.log(3)]]])  # p = [1/4, 3/4]
    out = token_logprobs_from_logits(logits, torch.tensor([[1]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.75)]]))


def test_d1_loss_by_hand():
    m = torch.tensor([[1, 1], [1, 0]]).bool()
    z = torch.zeros(2, 2)
    # ratio 1 everywhere, no KL: per-token loss -A -> tokens -1, -1, +1 -> sum -1 over 3 tokens = -1/3
    loss, _ = d1_loss(z, z, torch.tensor([1.0, -1.0]), m, beta=0.0)
    torch.testing.assert_close(loss, torch.tensor(-1 / 3))
    # ratio e, ε = 0.5: A = 1 -> -min(e, 1.5) = -1.5; A = -1 -> -min(-e, -1.5) = e
    one = torch.ones(2, 2)
    loss, stats = d1_loss(one, z, torch.tensor([1.0, -1.0]), m, beta=0.0)
    torch.testing.assert_close(loss, torch.tensor((-1.5 - 1.5 + math.e) / 3))
    # the clipped term is the one used on the two A = 1 tokens, not on the A = -1 token (its ratio e is
    # outside the range, but -min(-e, -1.5) takes the unclipped e): 2 of 3, as d1's and TRL's clip_ratio
    assert stats["clip_frac"].item() == pytest.approx(2 / 3)
    # k3 with ref - logp = ln2: 2 - ln2 - 1 = 1 - ln2 per token; β = 0.04, A = 0
    loss, stats = d1_loss(z, z, torch.zeros(2), m, beta=0.04, ref_logp=torch.full((2, 2), LN2))
    torch.testing.assert_close(loss, torch.tensor(0.04 * (1 - LN2)))
    with pytest.raises(ValueError, match="ref_logp"):
        d1_loss(z, z, torch.zeros(2), m, beta=0.04)


def test_wd1_loss_on_an_empty_batch_is_a_connected_zero():
    s = torch.zeros(0, requires_grad=True)
    loss, stats = wd1_loss(s, torch.zeros(0), torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0 and stats["loss"].item() == 0 and s.grad.shape == (0,)


def test_wd1_loss_by_hand():
    # one group, A = [1, -1]: softmax(A) = [σ(2), σ(-2)], softmax(-A) = [σ(-2), σ(2)]; S = [-1, -3]
    # loss = -(σ(2)(-1) + σ(-2)(-3)) + (σ(-2)(-1) + σ(2)(-3)) = 2σ(-2) - 2σ(2) = -2 tanh(1)
    s = torch.tensor([-1.0, -3.0])
    loss, _ = wd1_loss(s, torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(loss, torch.tensor(-2 * math.tanh(1)))
    # two groups: softmax within each, summed -> twice the single-group loss
    loss2, _ = wd1_loss(torch.cat([s, s]), torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([0, 0, 5, 5]))
    torch.testing.assert_close(loss2, torch.tensor(-4 * math.tanh(1)))
    assert sequence_logprob_sum(LOGP, M)[0, 0].item() == pytest.approx(math.log(0.5 * 0.25))


# ---------------------------------------------------------------------------------- SPGSurrogate
