"""DenoisingSFT (the ERILS SFT baseline): trains on the external rows only, masks per row (micro-batching
never changes the update), and the likelihood of the external completions rises."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.denoising_sft import DenoisingSFT
from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import RolloutBatch, Source

B, P, L = 5, 3, 6


def _policy() -> TinyDiffusionLM:
    torch.manual_seed(0)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)


def _batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    lengths = torch.tensor([6, 2, 4, 1, 5])
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P,
        completion_mask=torch.arange(L)[None] < lengths[:, None], lengths=lengths, rewards=torch.ones(B),
        source=torch.full((B,), int(Source.EXTERNAL)), group=torch.zeros(B, dtype=torch.long), texts=[""] * B,
        prompt_ids=["p"] * B, hit_limit=torch.zeros(B, dtype=torch.bool),
    )


def _grads(micro: int | None, train_padding: bool = True) -> tuple[float, dict[str, torch.Tensor]]:
    policy = _policy()
    module = DenoisingSFT(policy, micro_batch_size=micro, train_padding=train_padding)
    module.manual_backward = lambda loss: loss.backward()
    loss, _ = module.loss_backward(module.loss_fn.prepare(_batch(), module.loss_context()), 0, step=0)
    return float(loss), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_match_the_full_batch(micro):
    full_loss, full = _grads(None)
    loss, grads = _grads(micro)
    assert loss == pytest.approx(full_loss, rel=1e-5)
    for n in full:
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-6, msg=n)


def test_train_padding_trains_the_whole_own_width():
    module = DenoisingSFT(_policy())
    ro = _batch()
    assert module.loss_fn.target_mask(ro).all()  # gen_width defaults to the full width
    ro.gen_width = torch.tensor([6, 4, 6, 6, 5])
    assert module.loss_fn.target_mask(ro).sum(-1).tolist() == [6, 4, 6, 6, 5]
    assert DenoisingSFT(_policy(), train_padding=False).loss_fn.target_mask(ro).sum(-1).tolist() == [6, 2, 4, 1, 5]
    assert _grads(None)[0] != pytest.approx(_grads(None, train_padding=False)[0])


def test_sft_raises_the_likelihood_of_the_external_rows():
    from support.fixed_batch import dllm_scores, fit_on, fixed_rollouts

    policy = _policy()
    ro = fixed_rollouts(policy, [int(Source.ON_POLICY)] * 2 + [int(Source.EXTERNAL)] * 2, [1.0, 1.0, 0.0, 0.0])
    before = dllm_scores(policy, ro, text_only=True)
    module = DenoisingSFT(policy, optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3), updates_per_batch=4)
    fit_on(module, ro, steps=8)
    delta = dllm_scores(policy, ro, text_only=True) - before
    # external rows (2, 3) rise whatever their reward; on-policy rows (0, 1) are not trained on and share
    # no text token with them ("11111111", "33333333" vs "22222222", "44444444"; EOS padding, trained
    # for every row's width, is left out of the score): they rise less
    assert (delta[2:] > 0).all() and delta[2:].min() > delta[:2].max(), delta
