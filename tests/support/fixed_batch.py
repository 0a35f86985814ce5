"""One fixed rollout batch trained on by a real Lightning loop, and per-row likelihood scores (the
direction-of-learning tests of the RL and SFT modules)."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import PromptBatch, RolloutBatch

PROMPT = [{"role": "user", "content": "1200003400120034"}]
# rows i use COMPLETIONS[i % 4]; positive rows (even i) and negative rows (odd i) share no token, so a row's
# likelihood moves with its own advantage, not with tokens it shares with rows of the other sign
COMPLETIONS = ["11111111", "33333333", "22222222", "44444444"]


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


def fixed_rollouts(policy, sources: list[int], rewards: list[float],
                   completions: list[str] | None = None) -> RolloutBatch:
    """One prompt group; row ``i`` completes with ``completions[i]`` (default ``COMPLETIONS[i % 4]``)."""
    n = len(rewards)
    prompt_ids, prompt_mask = policy.encode_prompts([PROMPT])
    texts = completions if completions is not None else [COMPLETIONS[i % len(COMPLETIONS)] for i in range(n)]
    comp, lengths = policy.encode_completions(texts, 24)
    P = prompt_ids.shape[1]
    return RolloutBatch(
        input_ids=torch.cat([prompt_ids.expand(n, -1), comp], 1),
        attention_mask=torch.cat([prompt_mask.expand(n, -1), torch.ones_like(comp)], 1),
        prompt_len=P, completion_mask=torch.arange(24)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.tensor(rewards), source=torch.tensor(sources), group=torch.zeros(n, dtype=torch.long),
        texts=[""] * n, prompt_ids=["p"] * n, hit_limit=torch.zeros(n, dtype=torch.bool),
    )


def fit_on(module: L.LightningModule, ro: RolloutBatch, steps: int) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=_TaskDM(ro))
    assert trainer.global_step == steps


@torch.no_grad()
def dllm_scores(policy: TinyDiffusionLM, ro: RolloutBatch, text_only: bool = False) -> torch.Tensor:
    """Mean log-prob of each row's completion tokens (``text_only``: EOS excluded) with the whole completion
    masked. ``(N,)``"""
    policy.eval()
    ids = ro.input_ids.clone()
    ids[:, ro.prompt_len:] = torch.where(ro.completion_mask, policy.mask_id, ids[:, ro.prompt_len:])
    logp = torch.log_softmax(policy(ids, ro.attention_mask)[:, ro.prompt_len:].float(), -1)
    tok = logp.gather(-1, ro.completion_ids[..., None]).squeeze(-1)  # (N, L)
    scored = ro.completion_mask & (ro.completion_ids != policy.eos_id) if text_only else ro.completion_mask
    return (tok * scored).sum(-1) / scored.sum(-1)
