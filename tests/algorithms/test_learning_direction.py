"""Direction of learning through a real Lightning loop: a few updates on one fixed rollout batch raise the
likelihood of the positive-advantage rows and lower that of the negative ones, for ERILS (SPG surrogate,
source-specific advantages, on-policy and external rows) and for the GRPO loss of DoubleRolloutGRPO.

"Weights changed" (the fit tests) also holds with a flipped advantage sign or dropped advantages; these
tests do not (mutation-checked: negating the loss in spg_loss / clipped_pg_loss, or zeroing the advantages,
fails them)."""

from __future__ import annotations

import torch

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO, DoubleRolloutSettings
from lit_rl.algorithms.erils import ERILSModule
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import TinyCausalLM
from lit_rl.batch import RolloutBatch, Source
from support.fixed_batch import dllm_scores, fit_on, fixed_rollouts

def test_erils_raises_positive_and_lowers_negative_rows():
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    on, ext = int(Source.ON_POLICY), int(Source.EXTERNAL)
    # one group: on-policy rewards [1, 0, 1, 0] and external [1, 0] -> source-specific advantages +, -, +, -, +, -;
    # every row has its own digit (EOS left out of the score), so each row moves with its own advantage only
    # (external rows sharing the on-policy rows' text would let zeroed or dropped external advantages pass)
    texts = [d * 8 for d in "123456"]
    ro = fixed_rollouts(policy, [on, on, on, on, ext, ext], [1.0, 0.0, 1.0, 0.0, 1.0, 0.0], texts)
    before = dllm_scores(policy, ro, text_only=True)
    module = ERILSModule(
        policy, surrogate=SPGSurrogate(num_t=2, block_length=8, mask_id=policy.mask_id, p_mask_prompt=0.0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3), updates_per_batch=4, grad_clip=None,
    )
    fit_on(module, ro, steps=8)
    delta = dllm_scores(policy, ro, text_only=True) - before  # (6,)
    positive = torch.tensor([True, False, True, False, True, False])
    assert (delta[positive] > 0).all() and (delta[~positive] < 0).all(), delta


@torch.no_grad()
def _ar_scores(policy: TinyCausalLM, ro: RolloutBatch) -> torch.Tensor:
    logp = policy.token_logprobs(ro.input_ids, ro.attention_mask, ro.prompt_len)  # (N, L)
    return (logp * ro.completion_mask).sum(-1)


def test_grpo_raises_positive_and_lowers_negative_rows():
    torch.manual_seed(0)
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    on = int(Source.ON_POLICY)
    ro = fixed_rollouts(policy, [on] * 4, [1.0, 0.0, 1.0, 0.0])
    before = _ar_scores(policy, ro)
    module = DoubleRolloutGRPO(
        policy, double_rollout=DoubleRolloutSettings(enabled=False),
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3), updates_per_batch=2, grad_clip=None,
    )
    fit_on(module, ro, steps=6)
    delta = _ar_scores(policy, ro) - before  # (4,)
    assert (delta[[0, 2]] > 0).all() and (delta[[1, 3]] < 0).all(), delta
