"""Gradient accumulation in DoubleRolloutGRPO: micro-batches give the full batch's loss and gradients for
every aggregation (each micro-batch loss is weighted by its share of the aggregation's denominator)."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO, GRPOLossSettings
from lit_rl.algorithms.losses import PreparedPG
from lit_rl.models.ar import TinyCausalLM
from lit_rl.batch import RolloutBatch, Source

B, P, L = 5, 3, 6


def _batch(policy: TinyCausalLM) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    lengths = torch.tensor([6, 2, 4, 1, 5])  # ragged: token counts differ per row
    comp_mask = torch.arange(L)[None] < lengths[:, None]  # (B, L)
    ro = RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P, completion_mask=comp_mask,
        lengths=lengths, rewards=torch.zeros(B), source=torch.full((B,), int(Source.ON_POLICY)),
        group=torch.zeros(B, dtype=torch.long), texts=[""] * B, prompt_ids=["p"] * B,
        hit_limit=torch.zeros(B, dtype=torch.bool), eval_total=None,
    )
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])
    with torch.no_grad():  # π_old a little off the current policy, so ratios are not all 1 and some clip
        old = policy.token_logprobs(ids, ro.attention_mask, P) + 0.3 * torch.randn(B, L, generator=g)
    return ro, adv, old


def _grads(aggregation: str, micro: int | None) -> tuple[float, dict[str, torch.Tensor]]:
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    module = DoubleRolloutGRPO(policy, loss=GRPOLossSettings(aggregation=aggregation), micro_batch_size=micro)
    module.manual_backward = lambda loss: loss.backward()  # no trainer needed for the accumulation itself
    ro, adv, old = _batch(policy)
    loss, _ = module.loss_backward(PreparedPG(ro, advantages=adv, mask=ro.completion_mask, old_logp=old), 0)
    return float(loss), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_match_the_full_batch(aggregation, micro):
    full_loss, full = _grads(aggregation, None)
    loss, grads = _grads(aggregation, micro)
    assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    assert full.keys() == grads.keys() and full
    for n in full:
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-7, msg=n)


@pytest.mark.parametrize("distributed,micro,rows", [(False, 2, 3), (True, None, 3), (True, 2, B)])
def test_zero_advantage_rows_are_skipped_unless_ranks_would_run_different_passes(distributed, micro, rows,
                                                                                monkeypatch):
    # under DDP / FSDP every micro-batch backward is a collective: with micro-batches, a rank-dependent row count
    # would make the ranks' pass counts differ, so the skip is off there (one pass per rank without micro-batches)
    import lit_rl.algorithms.losses as losses

    monkeypatch.setattr(losses, "_distributed", lambda: distributed)
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    module = DoubleRolloutGRPO(policy, loss=GRPOLossSettings(kl_beta=0.0, mask_truncated=False),
                               micro_batch_size=micro)
    ro, _, _ = _batch(policy)
    adv = torch.tensor([1.0, 0.0, 0.25, 0.0, -0.75])
    prepared = module.loss_fn.prepare(ro.with_advantages(adv), module.loss_context())
    assert len(prepared.rows) == rows
