"""The dLLM likelihood estimators (lit_rl/algorithms/estimators.py): DiffuCoder's coupled masks against values
computed by hand, SPG's masks as an estimator whose per-token estimate sums to its ELBO, per-row draws, and a
new estimator in a loss as one YAML line."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.algorithms.advantages import OnPolicyOnly
from lit_rl.algorithms.d1 import D1Loss, WD1Loss
from lit_rl.algorithms.erils import ERILSModule
from lit_rl.algorithms.estimators import Coupled, OneStep
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.core.spg import coupled_coefficients, elbo
from lit_rl.errors import FieldError
from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import RolloutBatch

MASK, V = 9, 10


class CountingLogits(torch.nn.Module):
    """A denoiser whose score of every token is set by how many completion tokens of its row are masked:
    logit ``c = −(masked count)`` on token 1, 0 elsewhere, so ``log p(1) = c − log(e^c + V − 1)``."""

    mask_id = MASK

    def forward(self, ids, attn=None):
        c = -(ids[:, 2:] == MASK).sum(-1).float()  # (n,) masked completion tokens (prompt width 2)
        logits = torch.zeros(*ids.shape, V)
        logits[..., 1] = c[:, None]
        return logits


def _lp(c: float) -> float:
    return c - math.log(math.exp(c) + V - 1)


def _rows(n: int = 1, L: int = 3) -> RolloutBatch:
    ids = torch.cat([torch.full((n, 2), 5), torch.ones(n, L, dtype=torch.long)], 1)  # completion tokens are all 1
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=2,
        completion_mask=torch.ones(n, L, dtype=torch.bool), lengths=torch.full((n,), L), rewards=torch.zeros(n),
        source=torch.zeros(n, dtype=torch.long), group=torch.zeros(n, dtype=torch.long), texts=[""] * n,
        prompt_ids=["p"] * n, hit_limit=torch.zeros(n, dtype=torch.bool),
    )


def test_coupled_coefficients_by_hand():
    a, t = torch.tensor([[True, False, True]]), torch.tensor([0.25])
    # the reference code: (log p_full + w log p_masked) / 2 with w = 1/t = 4 for copy a, 1/(1-t) = 4/3 for copy b
    full = coupled_coefficients(a, t)
    torch.testing.assert_close(full, torch.tensor([[[0.5, 0.5, 0.5]], [[2.0, 0.0, 2.0]], [[0.0, 2 / 3, 0.0]]]))
    torch.testing.assert_close(coupled_coefficients(a, t, full_mask_copy=False),
                               torch.tensor([[[4.0, 0.0, 4.0]], [[0.0, 4 / 3, 0.0]]]))


@pytest.mark.parametrize("full_mask_copy", [True, False])
def test_coupled_estimate_by_hand(full_mask_copy):
    est = Coupled(full_mask_copy=full_mask_copy)
    draw = {"t": torch.tensor([0.25]), "masked_a": torch.tensor([[True, False, True]])}
    scores = est.score(CountingLogits(), _rows(), draw)
    # copy a masks 2 tokens (c = -2), copy b masks 1 (c = -1), the full copy 3 (c = -3)
    if full_mask_copy:
        want = [(_lp(-3) + 4 * _lp(-2)) / 2, (_lp(-3) + 4 / 3 * _lp(-1)) / 2, (_lp(-3) + 4 * _lp(-2)) / 2]
    else:
        want = [4 * _lp(-2), 4 / 3 * _lp(-1), 4 * _lp(-2)]
    torch.testing.assert_close(scores.per_token(), torch.tensor([want]))
    assert scores.logp.shape == (3 if full_mask_copy else 2, 1, 3)


def test_coupled_draws_are_complementary_per_row_and_follow_the_row_seed():
    est = Coupled()
    d = est.draw(_rows(3, L=400), [1, 2, 3])
    assert d["t"].shape == (3,) and bool(((d["t"] >= 0.2) & (d["t"] <= 0.8)).all())
    assert len(set(d["t"].tolist())) == 3  # each row its own ratio
    for i in range(3):  # copy a masks about a share t of the completion; copy b masks exactly the rest
        assert abs(float(d["masked_a"][i].float().mean()) - float(d["t"][i])) < 0.08
    one = est.draw(_rows(1, L=400), [2])  # a row's draw ignores its batch-mates
    assert torch.equal(one["masked_a"][0], d["masked_a"][1]) and float(one["t"][0]) == float(d["t"][1])
    coef = coupled_coefficients(d["masked_a"], d["t"])
    assert bool(((coef[1] > 0) ^ (coef[2] > 0)).all())  # every token is scored by exactly one copy of the pair
    with pytest.raises(FieldError, match="t_min"):
        Coupled(t_min=0.9, t_max=0.1)


def test_one_step_is_one_fully_masked_copy():
    scores = OneStep(p_mask_prompt=0.0).score(CountingLogits(), _rows(), {"prompt_masked": torch.zeros(1, 2).bool()})
    torch.testing.assert_close(scores.per_token(), torch.tensor([[_lp(-3)] * 3]))


def test_spg_masks_as_an_estimator_sum_to_the_elbo():
    spg = SPGSurrogate(num_t=3, block_length=2, mask_id=MASK)
    ro = _rows(2, L=4)
    draw = spg.draw(ro, [11, 12])
    scores = spg.score(CountingLogits(), ro, draw)
    want = elbo(scores.logp, draw["loss"].transpose(0, 1))  # (B,)
    torch.testing.assert_close(scores.per_token().sum(-1), want)


def _policy() -> TinyDiffusionLM:
    torch.manual_seed(0)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)


@pytest.mark.parametrize("estimator", [Coupled, lambda: SPGSurrogate(num_t=2, block_length=5)], ids=["coupled", "spg"])
@pytest.mark.parametrize("make", [lambda e: D1Loss(beta=0.0, estimator=e), lambda e: WD1Loss(estimator=e)],
                         ids=["d1", "wd1"])
def test_losses_take_any_estimator_and_micro_batching_keeps_the_gradient(make, estimator):
    ro = _rows(4, L=5).with_advantages(torch.tensor([1.0, -1.0, 0.5, -0.5]))
    ro.input_ids[:, 2:] = torch.randint(10, 40, (4, 5), generator=torch.Generator().manual_seed(0))

    def grads(micro):
        # the module binds the loss, which binds its estimator (SPG's masks take the policy's mask id)
        module = ERILSModule(_policy(), processors=[OnPolicyOnly()], loss_fn=make(estimator()), updates_per_batch=2,
                             micro_batch_size=micro)
        module.manual_backward = lambda loss: loss.backward()
        p = module.loss_fn.prepare(ro, module.loss_context())
        loss, stats = module.loss_backward(p, 0)
        assert math.isfinite(float(stats["entropy"]))
        return float(loss), {n: q.grad.clone() for n, q in module.policy.named_parameters() if q.grad is not None}

    full_loss, full = grads(None)
    loss, part = grads(1)
    assert full and loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    for n in full:
        torch.testing.assert_close(part[n], full[n], rtol=1e-4, atol=1e-7, msg=n)


def test_p_mask_prompt_is_sugar_for_the_one_step_estimator():
    assert D1Loss(p_mask_prompt=0.3).estimator.p_mask_prompt == 0.3
    assert isinstance(D1Loss().estimator, OneStep) and D1Loss().estimator.p_mask_prompt == 0.15
    with pytest.raises(FieldError, match="p_mask_prompt"):
        D1Loss(p_mask_prompt=0.3, estimator=Coupled())
