"""Where ClippedPGLoss's π_old comes from (``model.loss.old_logprobs``): the first update's own forward pass
(default) or a pass of its own before the updates. On a policy without dropout the two give the same losses,
gradients and ``train/entropy`` over μ updates; the default makes one forward pass fewer per batch."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO, GRPOLossSettings
from lit_rl.errors import FieldError
from lit_rl.models.ar import TinyCausalLM
from support.updates import assert_same_updates
from lit_rl.batch import RolloutBatch, Source

B, P, L = 6, 3, 5


def _rows() -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P,
        completion_mask=torch.arange(L)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.zeros(B), source=torch.full((B,), int(Source.ON_POLICY)), group=torch.zeros(B, dtype=torch.long),
        texts=[""] * B, prompt_ids=["p"] * B, hit_limit=torch.zeros(B, dtype=torch.bool), eval_total=None,
        advantages=torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, 0.5]),
    )


def _run(old_logprobs: str, micro: int | None, updates: int = 3):
    """μ SGD updates (rows without EOS: ``mask_truncated`` off; lr big enough that the later ratios leave 1
    and clip): per update the loss, the stats and the gradients; the logged metrics; and the number of policy
    forward passes."""
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    settings = GRPOLossSettings(old_logprobs=old_logprobs, mask_truncated=False)
    module = DoubleRolloutGRPO(policy, loss=settings, micro_batch_size=micro)
    module.manual_backward = lambda loss: loss.backward()
    logged: dict[str, float] = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    calls = []
    policy.model.register_forward_hook(lambda *a: calls.append(1))  # the HF model: one call per forward pass
    opt = torch.optim.SGD(policy.parameters(), lr=3.0)
    prepared = module.loss_fn.prepare(_rows(), module.loss_context())
    after_prepare = len(calls)
    out = []
    for k in range(updates):
        opt.zero_grad(set_to_none=True)
        loss, stats = module.loss_backward(prepared, k)
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        out.append((float(loss), {k: float(v) for k, v in stats.items()}, grads))
        opt.step()
    return out, logged, after_prepare, len(calls), prepared


@pytest.mark.parametrize("micro", [None, 4])
def test_first_update_pi_old_equals_the_separate_pass(micro):
    new, new_logged, new_prep, new_calls, _ = _run("first_update", micro)
    old, old_logged, old_prep, old_calls, _ = _run("separate_pass", micro)
    n_mb = 1 if micro is None else 2
    assert (new_prep, old_prep) == (0, n_mb)  # the pass of its own, before any update
    assert old_calls - new_calls == n_mb  # ... is the only forward pass the default saves
    assert new_logged.keys() == old_logged.keys() and "train/entropy" in new_logged
    for k in new_logged:
        assert new_logged[k] == pytest.approx(old_logged[k], rel=1e-6, abs=1e-7), k
    assert new[0][1]["ratio_mean"] == 1.0  # the first update's ratio is exactly 1
    assert any(u[1]["clip_frac"] > 0 for u in new[1:])  # later updates ratio against the kept π_old and clip
    assert_same_updates(new, old)


def test_the_first_update_fills_pi_old_once():
    """π_old is the policy before any update: filled by the first backward, kept by the later ones (a bug that
    refilled it each update would make every ratio 1 and the clip never bind)."""
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    ro = _rows()
    with torch.no_grad():
        want = policy.token_logprobs(ro.input_ids, ro.attention_mask, P)  # (B, L)
    out, _, _, _, prepared = _run("first_update", None, updates=2)
    assert prepared.old_logp.shape == (B, L)
    torch.testing.assert_close(prepared.old_logp, want, rtol=0, atol=1e-6)
    assert out[1][1]["ratio_mean"] != 1.0


def test_old_logprobs_value_is_checked():
    with pytest.raises(FieldError, match="old_logprobs.*first_update"):
        GRPOLossSettings(old_logprobs="eval")
