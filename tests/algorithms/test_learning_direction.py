"""Direction of learning through a real Lightning loop: a few updates on one fixed rollout batch raise the
likelihood of the positive-advantage rows and lower that of the negative ones, for ERILS (SPG surrogate,
source-specific advantages, on-policy and external rows) and for the GRPO loss of DoubleRolloutGRPO.

"Weights changed" (the fit tests) also holds with a flipped advantage sign or dropped advantages; these
tests do not (mutation-checked: negating the loss in spg_loss / clipped_pg_loss, or zeroing the advantages,
fails them)."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_rl.algorithms.double_rollout import DoubleRolloutGRPO, DoubleRolloutSettings
from lit_rl.algorithms.erils import ERILSModule
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import TinyCausalLM
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source

PROMPT = [{"role": "user", "content": "1200003400120034"}]
# rows i use COMPLETIONS[i % 4]; positive rows (even i) and negative rows (odd i) share no token, so a row's
# likelihood moves with its own advantage, not with tokens it shares with rows of the other sign
COMPLETIONS = ["11111111", "33333333", "12121212", "34343434"]


class _Fixed(IterableDataset):
    def __init__(self, ro: RolloutBatch) -> None:
        self.ro = ro

    def __iter__(self):
        step = 0
        while True:
            yield PromptBatch(examples=[], step=step, rollouts=self.ro)
            step += 1


class _TaskDM(L.LightningDataModule):
    """Only what the module reads from its DataModule (the GRPO path asks for the task's correct reward)."""

    def __init__(self, ro: RolloutBatch) -> None:
        super().__init__()
        self.ro = ro
        self.task = type("T", (), {"correct_reward": 1.0})()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Fixed(self.ro), batch_size=None)


def _rollouts(policy, sources: list[int], rewards: list[float]) -> RolloutBatch:
    n = len(rewards)
    prompt_ids, prompt_mask = policy.encode_prompts([PROMPT])
    comp, lengths = policy.encode_completions([COMPLETIONS[i % len(COMPLETIONS)] for i in range(n)], 24)
    P = prompt_ids.shape[1]
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids.expand(n, -1), comp], 1),
        attention_mask=torch.cat([prompt_mask.expand(n, -1), torch.ones_like(comp)], 1),
        prompt_len=P, completion_mask=torch.arange(24)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.tensor(rewards), source=torch.tensor(sources), group=torch.zeros(n, dtype=torch.long),
        texts=[""] * n, prompt_ids=["p"] * n, hit_limit=torch.zeros(n, dtype=torch.bool),
    )


def _fit(module: L.LightningModule, ro: RolloutBatch, steps: int) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=_TaskDM(ro))
    assert trainer.global_step == steps


@torch.no_grad()
def _dllm_scores(policy: TinyDiffusionLM, ro: RolloutBatch) -> torch.Tensor:
    """Mean log-prob of each row's completion tokens with the whole completion masked. ``(N,)``"""
    policy.eval()
    ids = ro.input_ids.clone()
    ids[:, ro.prompt_len:] = torch.where(ro.completion_mask, policy.mask_id, ids[:, ro.prompt_len:])
    logp = torch.log_softmax(policy(ids, ro.attention_mask)[:, ro.prompt_len:].float(), -1)
    tok = logp.gather(-1, ro.completion_ids[..., None]).squeeze(-1)  # (N, L)
    return (tok * ro.completion_mask).sum(-1) / ro.completion_mask.sum(-1)


def test_erils_raises_positive_and_lowers_negative_rows():
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    on, ext = int(Source.ON_POLICY), int(Source.EXTERNAL)
    # one group: on-policy rewards [1, 0, 1, 0] and external [1, 0] -> source-specific advantages +, -, +, -, +, -
    ro = _rollouts(policy, [on, on, on, on, ext, ext], [1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    before = _dllm_scores(policy, ro)
    module = ERILSModule(
        policy, surrogate=SPGSurrogate(num_t=2, block_length=8, mask_id=policy.mask_id, p_mask_prompt=0.0),
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3), updates_per_batch=4, grad_clip=None,
    )
    _fit(module, ro, steps=8)
    delta = _dllm_scores(policy, ro) - before  # (6,)
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
    ro = _rollouts(policy, [on] * 4, [1.0, 0.0, 1.0, 0.0])
    before = _ar_scores(policy, ro)
    module = DoubleRolloutGRPO(
        policy, double_rollout=DoubleRolloutSettings(enabled=False),
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3), updates_per_batch=2, grad_clip=None,
    )
    _fit(module, ro, steps=6)
    delta = _ar_scores(policy, ro) - before  # (4,)
    assert (delta[[0, 2]] > 0).all() and (delta[[1, 3]] < 0).all(), delta
