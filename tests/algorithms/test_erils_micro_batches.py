"""Gradient accumulation in ERILSModule: micro-batches give the whole rollout batch's SPG loss and gradients
under both rollout weightings (each micro-batch loss is rescaled by its share of the batch's Σw), with the
REAL masks: every rollout draws its masks from its own seed, so the split cannot change them."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.erils import ERILSModule
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import RolloutBatch, Source

B, P, L = 5, 3, 6


def _batch(policy: TinyDiffusionLM) -> tuple[RolloutBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    lengths = torch.tensor([6, 2, 4, 1, 5])  # ragged, so length weighting differs from rollout weighting
    ro = RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P,
        completion_mask=torch.arange(L)[None] < lengths[:, None], lengths=lengths, rewards=torch.zeros(B),
        source=torch.tensor([int(Source.ON_POLICY)] * 3 + [int(Source.EXTERNAL)] * 2),
        group=torch.zeros(B, dtype=torch.long), texts=[""] * B, prompt_ids=["p"] * B,
        hit_limit=torch.zeros(B, dtype=torch.bool), eval_total=None,
    )
    return ro, torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])


def _grads(weighting: str, micro: int | None, step: int = 0, seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    # the real surrogate: SPG block masks (2-token blocks) for on-policy rows, random masks for external ones,
    # prompt masking, clean-token masking
    surrogate = SPGSurrogate(num_t=2, block_length=2, mask_id=policy.mask_id, weighting=weighting)
    module = ERILSModule(policy, surrogate=surrogate, micro_batch_size=micro, seed=seed)
    module.manual_backward = lambda loss: loss.backward()  # no trainer needed for the accumulation itself
    ro, adv = _batch(policy)
    loss, _ = module.loss_backward(module.loss_fn.prepare(ro.with_advantages(adv), module.loss_context()), 0, step=step)
    return float(loss), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("weighting", ["length", "rollout"])
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_micro_batches_match_the_full_batch(weighting, micro):
    full_loss, full = _grads(weighting, None)
    loss, grads = _grads(weighting, micro)
    assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    assert grads.keys() == full.keys() and full
    for n in full:
        torch.testing.assert_close(grads[n], full[n], rtol=1e-4, atol=1e-6, msg=n)


def test_masks_follow_the_step_and_the_seed():
    # the per-rollout seeds carry the update and the run seed: another step or seed draws other masks
    base = _grads("length", None)[0]
    assert _grads("length", None, step=1)[0] != pytest.approx(base)
    assert _grads("length", None, seed=1)[0] != pytest.approx(base)
    assert _grads("length", 2, step=1)[0] == pytest.approx(_grads("length", None, step=1)[0], rel=1e-5)


def test_the_two_weightings_differ_on_ragged_lengths():
    # the same masks and rollouts: only the per-rollout weights differ (lengths [6, 2, 4, 1, 5] vs ones)
    assert _grads("length", None)[0] != pytest.approx(_grads("rollout", None)[0])


def test_the_update_passes_each_rows_own_width_and_rank_specific_seeds(monkeypatch):
    # the update path, not only the pure mask functions: build_masks gets the rows' gen_width and seeds
    # that carry the DDP rank (ranks must not draw the same masks)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    module = ERILSModule(policy, surrogate=SPGSurrogate(num_t=2, block_length=2, mask_id=policy.mask_id))
    module.manual_backward = lambda loss: loss.backward()
    ro, adv = _batch(policy)
    ro.gen_width = torch.tensor([4, 4, 4, L, L])
    ro.completion_mask &= torch.arange(L)[None] < ro.gen_width[:, None]
    ro.lengths = ro.completion_mask.sum(-1)
    seen = []
    real = SPGSurrogate.build_masks

    def spy(self, *args, **kw):
        seen.append((kw["gen_width"].tolist(), list(kw["seeds"].tolist())))
        return real(self, *args, **kw)

    monkeypatch.setattr(SPGSurrogate, "build_masks", spy)
    module.loss_backward(module.loss_fn.prepare(ro.with_advantages(adv), module.loss_context()), 0, step=3)
    assert seen[0][0] == [4, 4, 4, L, L]
    assert seen[0][1] == module.loss_context(step=3).mask_seeds(ro) and len(set(seen[0][1])) == B
    monkeypatch.setattr(type(module), "global_rank", property(lambda self: 1))
    assert not set(module.loss_context(step=3).mask_seeds(ro)) & set(seen[0][1])


def _zero_adv_grads(skip: bool, adv: torch.Tensor, micro: int | None = None):
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    module = ERILSModule(policy, surrogate=SPGSurrogate(num_t=2, block_length=2, mask_id=policy.mask_id),
                         micro_batch_size=micro)
    module.loss_fn.skip_zero_advantage = skip
    module.manual_backward = lambda loss: loss.backward()
    rows_seen = []
    real = policy.forward
    policy.forward = lambda ids, *a, **kw: (rows_seen.append(ids.shape[0]), real(ids, *a, **kw))[1]  # (rows, T)
    ro, _ = _batch(policy)
    prepared = module.loss_fn.prepare(ro.with_advantages(adv), module.loss_context())
    prepared.logged = dict(prepared.metrics)  # the module logs and empties the mailbox
    loss, _ = module.loss_backward(prepared, 0, step=0)
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return float(loss), grads, sum(rows_seen), prepared


@pytest.mark.parametrize("micro", [None, 2])
def test_zero_advantage_rows_skip_the_forward_and_leave_the_gradient_unchanged(micro):
    # rows 1 and 3 have A = 0: their term is 0 · S · L, but their length stays in Σ L (the denominator)
    adv = torch.tensor([1.0, 0.0, 0.25, 0.0, -0.75])
    loss_all, all_grads, rows_all, _ = _zero_adv_grads(False, adv, micro)
    loss, grads, rows, prepared = _zero_adv_grads(True, adv, micro)
    assert rows_all == 2 * B and rows == 2 * 3  # num_t 2 noisy copies per row forwarded
    assert prepared.rows.row.tolist() == [0, 2, 4] and prepared.logged["train/rows_trained"] == 3.0
    assert float(prepared.total_w) == 6 + 2 + 4 + 1 + 5  # every kept row's length
    assert loss == pytest.approx(loss_all, rel=1e-5, abs=1e-7)
    assert grads.keys() == all_grads.keys() and grads
    for n in grads:
        torch.testing.assert_close(grads[n], all_grads[n], rtol=1e-4, atol=1e-6, msg=n)


def test_a_batch_without_a_nonzero_advantage_trains_on_all_rows():
    _, _, rows, prepared = _zero_adv_grads(True, torch.zeros(B))
    assert len(prepared.rows) == B and rows == 2 * B


def test_the_skip_is_off_across_ranks_with_micro_batches(monkeypatch):
    # under DDP / FSDP each rank must run the same number of micro-batch passes: with micro-batches the skip
    # would make that depend on the rank's advantages, so it is off there (and on without micro-batches)
    import lit_rl.algorithms.losses as losses

    monkeypatch.setattr(losses, "_distributed", lambda: True)
    adv = torch.tensor([1.0, 0.0, 0.25, 0.0, -0.75])
    assert _zero_adv_grads(True, adv, micro=2)[2] == 2 * B  # every row forwarded
    assert _zero_adv_grads(True, adv, micro=None)[2] == 2 * 3  # one pass per rank anyway: skipped
