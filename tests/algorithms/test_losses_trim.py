"""ClippedPGLoss's ``trim_padding``: the loss passes run over the completion columns up to the last token a kept
row scores. A causal policy's logits at a position never read a later token, so the losses, gradients and
logged metrics equal the full-width run's (up to float rounding), while each forward pass is narrower."""

from __future__ import annotations

import pytest
import torch

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO, GRPOLossSettings
from lit_rl.batch import RolloutBatch, Source
from lit_rl.models.ar import TinyCausalLM
from support.updates import assert_same_updates

B, P, L = 6, 3, 9
EOS = 2


def _rows(lengths: list[int]) -> RolloutBatch:
    """Rows EOS-filled after ``lengths`` tokens (the EOS included), as the HF backend returns them."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    n = torch.tensor(lengths)
    comp = ids[:, P:]
    comp[torch.arange(L)[None] >= n[:, None] - 1] = EOS  # the row's last token and everything after: EOS
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=P,
        completion_mask=torch.arange(L)[None] < n[:, None], lengths=n, rewards=torch.zeros(B),
        source=torch.full((B,), int(Source.ON_POLICY)), group=torch.zeros(B, dtype=torch.long), texts=[""] * B,
        prompt_ids=["p"] * B, hit_limit=torch.zeros(B, dtype=torch.bool),
        advantages=torch.tensor([1.0, -0.5, 0.0, -1.0, 0.75, 0.5]),
    )


def _run(trim: bool, lengths: list[int], micro: int | None = None, updates: int = 2, **settings):
    torch.manual_seed(0)
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    policy.eos_id = EOS
    module = DoubleRolloutGRPO(policy, loss=GRPOLossSettings(trim_padding=trim, **settings), micro_batch_size=micro)
    module.manual_backward = lambda loss: loss.backward()
    logged: dict[str, float] = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, float(value))
    widths = []
    policy.model.register_forward_hook(lambda m, args, kw, out: widths.append(kw["input_ids"].shape[1]),
                                       with_kwargs=True)
    opt = torch.optim.SGD(policy.parameters(), lr=3.0)
    prepared = module.loss_fn.prepare(_rows(lengths), module.loss_context())
    out = []
    for k in range(updates):
        opt.zero_grad(set_to_none=True)
        loss, stats = module.loss_backward(prepared, k)
        out.append((float(loss), {n: float(v) for n, v in stats.items()},
                    {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}))
        opt.step()
    return out, logged, widths, prepared


@pytest.mark.parametrize("micro, settings", [
    (None, {}), (2, {}), (None, {"aggregation": "seq-mean-token-mean"}), (2, {"old_logprobs": "separate_pass"}),
    (None, {"aggregation": "seq-mean-token-sum-norm"}),  # its normaliser is the full width: not trimmed
])
def test_trimmed_passes_give_the_full_width_losses_and_gradients(micro, settings):
    # the longest kept row ends at token 5; row 2 (advantage 0, skipped) is longer and must not set the width
    lengths = [5, 2, 8, 4, 3, 1]
    short, short_logged, short_w, prepared = _run(True, lengths, micro, **settings)
    full, full_logged, full_w, _ = _run(False, lengths, micro, **settings)
    width = L if settings.get("aggregation") == "seq-mean-token-sum-norm" else 5
    assert set(short_w) == {P + width} and set(full_w) == {P + L}
    assert len(short_w) == len(full_w)  # the same passes, each narrower
    assert prepared.mask.shape == (5, width) and prepared.old_logp.shape == (5, width)
    assert short_logged.keys() == full_logged.keys()
    for k in short_logged:
        assert short_logged[k] == pytest.approx(full_logged[k], rel=1e-5, abs=1e-6), k
    assert short[1][1]["ratio_mean"] != 1.0  # the second update moved off π_old: the check covers the ratios
    assert_same_updates(short, full)


def test_a_kept_row_at_the_full_width_keeps_every_column():
    _, _, widths, _ = _run(True, [9, 2, 3, 4, 3, 1], updates=1)
    assert set(widths) == {P + L}
