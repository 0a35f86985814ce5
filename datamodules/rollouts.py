"""The rollout DataModule: a seeded prompt stream whose batches become rollout groups at batch start.

1. **Prompt stream.** The training prompts (those with ``G_ext`` usable external records when
   ``G_ext > 0``) are permuted with ``seed`` (a new permutation per pass, ``seed + pass``); batch ``s`` of
   the stream holds prompts ``[s·B·W + r·B, s·B·W + (r+1)·B)`` of that sequence for rank ``r`` of ``W``
   (each rank sees its own prompts, with their external rollouts). The order is written to
   ``prompt_order.jsonl`` in the run folder on the first batch, and the stream cursor is saved in every
   checkpoint, so a resumed run continues with the next unseen batch: nothing skipped, nothing repeated.
2. **External rollouts.** Each prompt's first ``G_ext`` usable records from the pool file (keyed by prompt
   id, :mod:`lit_rl.rollouts.pool`) travel with the prompt.
3. **On-policy rollouts** are produced at the start of each training batch (``on_after_batch_transfer``,
   the DataModule hook Lightning calls after the batch reaches the device and right before
   ``on_train_batch_start``): ``G_on`` completions per prompt from the *current* policy with the training
   decoder, seeded by ``(seed, step)`` so a resumed run draws the same rollouts. Every completion, on-policy
   and external, is scored with the task's verifier, and the batch carries a source-tagged
   :class:`~lit_rl.rollouts.types.RolloutBatch`.
4. **Validation batches** are decoded greedily (T=0) and scored with the task's evaluation rule.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_rl.generation.settings import DecodeSettings
from lit_rl.rollouts.pool import load_pool
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source
from lit_rl.tasks.base import Example, Task


def _step_seed(seed: int, step: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + step * 7_919 + salt * 104_729) % (2**63 - 1)


class _PromptStream(IterableDataset):
    """Endless stream of :class:`PromptBatch` from ``start`` (one batch per item)."""

    def __init__(self, dm: "RolloutDataModule", start: int) -> None:
        self.dm, self.start = dm, start

    def __iter__(self) -> Iterator[PromptBatch]:
        step = self.start
        while True:
            yield self.dm.prompt_batch(step)
            step += 1


class _EvalSet(torch.utils.data.Dataset):
    def __init__(self, examples: list[Example], batch_size: int) -> None:
        self.batches = [examples[i:i + batch_size] for i in range(0, len(examples), batch_size)]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> PromptBatch:
        return PromptBatch(examples=self.batches[i], step=-1 - i)


def _identity(items: list[PromptBatch]) -> PromptBatch:
    return items[0]


class RolloutDataModule(L.LightningDataModule):
    """Prompt groups with external rollouts attached and on-policy rollouts generated per batch.

    Args:
        task: the task (prompts, verifier, eval metric).
        pool_path: external rollout pool (JSONL); required when ``g_ext > 0``.
        prompts_per_batch: prompt groups per device per rollout batch (paper 6).
        g_on: on-policy rollouts per prompt (paper 4).
        g_ext: external rollouts per prompt (paper 2).
        generation: training rollout decoding (paper: L_gen 256, block 32, steps 128, T 1.0).
        eval_generation: decoding of the periodic greedy evaluation (T must be 0 for greedy).
        max_prompt_len: prompts are cut to their last ``max_prompt_len`` tokens (paper 200).
        max_external_len: external completions are cut to this many policy tokens (plus EOS).
        eval_size: evaluate on the first ``eval_size`` prompts of the task's eval set (``None``: all).
        eval_batch_size: prompts per validation batch.
        seed: seed of the prompt order and of rollout sampling.
        num_train_prompts: use only the first N training prompts (before shuffling); ``None``: all.
        output_dir: where ``prompt_order.jsonl`` goes (default: the trainer's log dir).
    """

    def __init__(
        self,
        task: Task,
        pool_path: str | None = None,
        prompts_per_batch: int = 6,
        g_on: int = 4,
        g_ext: int = 2,
        generation: DecodeSettings | None = None,
        eval_generation: DecodeSettings | None = None,
        max_prompt_len: int = 200,
        max_external_len: int = 512,
        eval_size: int | None = 128,
        eval_batch_size: int = 32,
        seed: int = 42,
        num_train_prompts: int | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__()
        if prompts_per_batch <= 0:
            raise ValueError(f"data.prompts_per_batch must be positive, got {prompts_per_batch}")
        if g_on < 0 or g_ext < 0 or g_on + g_ext == 0:
            raise ValueError(f"data.g_on ({g_on}) and data.g_ext ({g_ext}) must be >= 0 with g_on + g_ext > 0")
        if g_ext > 0 and not pool_path:
            raise ValueError("data.pool_path is required when data.g_ext > 0 (the external rollout pool file)")
        self.task = task
        self.pool_path = pool_path
        self.prompts_per_batch = prompts_per_batch
        self.g_on, self.g_ext = g_on, g_ext
        self.generation = generation or DecodeSettings()
        self.eval_generation = eval_generation or DecodeSettings(
            gen_length=self.generation.gen_length,
            block_length=self.generation.block_length,
            steps=self.generation.steps,
            temperature=0.0,
        )
        self.max_prompt_len = max_prompt_len
        self.max_external_len = max_external_len
        self.eval_size = eval_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.num_train_prompts = num_train_prompts
        self.output_dir = output_dir
        self.cursor = 0  # next stream step to train on (saved in checkpoints)
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None
        self._pool: dict[str, list[Any]] = {}
        self._orders: dict[int, list[int]] = {}
        self.last_stats: dict[str, float] = {}

    # -- data ----------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._train is None:
            train = self.task.train_examples()
            if self.num_train_prompts is not None:
                train = train[: self.num_train_prompts]
            if self.g_ext > 0:
                self._pool = load_pool(self.pool_path, self.g_ext, valid_ids=[e.id for e in self.task.train_examples()], task=self.task.name)
                train = [e for e in train if e.id in self._pool]
            if not train:
                raise ValueError(
                    f"data: no training prompts for task {self.task.name!r}"
                    + (f" with {self.g_ext} usable external rollouts in {self.pool_path}" if self.g_ext else "")
                )
            self._train = train
        if self._eval is None:
            ev = self.task.eval_examples()
            self._eval = ev[: self.eval_size] if self.eval_size is not None else ev
            if not self._eval:
                raise ValueError(f"data: the eval set of task {self.task.name!r} is empty")

    @property
    def train_examples(self) -> list[Example]:
        assert self._train is not None, "call setup() first"
        return self._train

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            idx = list(range(len(self.train_examples)))
            random.Random(self.seed + epoch).shuffle(idx)
            self._orders = {epoch: idx}  # keep one pass in memory
        return self._orders[epoch]

    def stream_positions(self, step: int, rank: int = 0, world: int = 1) -> list[int]:
        """Positions (in the endless shuffled sequence) of the prompts of batch ``step`` on ``rank``."""
        b = self.prompts_per_batch
        start = step * b * world + rank * b
        return list(range(start, start + b))

    def prompt_batch(self, step: int) -> PromptBatch:
        """The prompts (and their external rollouts) of stream batch ``step`` for this rank."""
        rank, world = self._world()
        n = len(self.train_examples)
        examples = []
        for pos in self.stream_positions(step, rank, world):
            epoch, i = divmod(pos, n)
            examples.append(self.train_examples[self._order(epoch)[i]])
        external = [self._pool.get(e.id, [])[: self.g_ext] for e in examples] if self.g_ext else [[] for _ in examples]
        return PromptBatch(examples=examples, step=step, external=external)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_PromptStream(self, self.cursor), batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        assert self._eval is not None
        return DataLoader(_EvalSet(self._eval, self.eval_batch_size), batch_size=1, collate_fn=_identity, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    # -- checkpointed state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "seed": self.seed, "num_train": len(self._train or [])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"data.seed ({self.seed}) differs from the checkpoint's ({state['seed']}): the prompt order would change")
        self.cursor = int(state["cursor"])

    # -- rollouts at batch start -------------------------------------------------------------------
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Prompt batches hold text only; rollouts are built directly on the policy's device."""
        if isinstance(batch, PromptBatch):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = getattr(self, "trainer", None)
        if not isinstance(batch, PromptBatch) or trainer is None:
            return batch
        policy = trainer.lightning_module.policy
        if trainer.training:
            self._write_order_file()
            batch.rollouts = self.produce_rollouts(batch, policy)
            self.cursor = batch.step + 1
        else:
            batch.rollouts = self.evaluate_batch(batch, policy)
        return batch

    def produce_rollouts(self, batch: PromptBatch, policy: torch.nn.Module) -> RolloutBatch:
        """On-policy generation + external rollouts of ``batch``, all scored by the task verifier."""
        device = next(policy.parameters()).device
        examples = batch.examples
        prompt_ids, prompt_mask = policy.encode_prompts([self.task.messages(e) for e in examples], self.max_prompt_len)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)  # (B_p, P)
        P = prompt_ids.shape[1]
        L_gen = self.generation.gen_length
        rows_ids, rows_src, rows_grp, texts, pids, rewards, hit = [], [], [], [], [], [], []
        t0 = time.perf_counter()
        # 1. on-policy: G_on samples per prompt, seeded by (seed, step)
        if self.g_on:
            on_prompt = prompt_ids.repeat_interleave(self.g_on, 0)  # (B_p*G_on, P)
            on_mask = prompt_mask.repeat_interleave(self.g_on, 0)
            comp = policy.generate(on_prompt, on_mask, self.generation, _step_seed(self.seed, batch.step))  # (B_p*G_on, L_gen)
            on_texts = policy.decode_completions(comp)
            for k, text in enumerate(on_texts):
                g = k // self.g_on
                rows_ids.append(comp[k])
                rows_src.append(int(Source.ON_POLICY))
                rows_grp.append(g)
                texts.append(text)
                pids.append(examples[g].id)
                rewards.append(self.task.total_reward(text, examples[g]))
                hit.append(bool((comp[k] != policy.eos_id).all()))
        gen_time = time.perf_counter() - t0
        # 2. external: the pool's first G_ext usable records, re-scored by this run's verifier
        ext_texts = [(g, r.completion) for g, recs in enumerate(batch.external) for r in recs]
        width = L_gen
        ext_ids = None
        if ext_texts:
            longest = max(policy.count_tokens(t) for _, t in ext_texts) + 1
            width = max(L_gen, min(longest, self.max_external_len + 1))
            ext_ids, _ = policy.encode_completions([t for _, t in ext_texts], width)
            ext_ids = ext_ids.to(device)
        comps = [torch.cat([r, r.new_full((width - r.shape[0],), policy.eos_id)]) for r in rows_ids]
        for j, (g, text) in enumerate(ext_texts):
            comps.append(ext_ids[j])
            rows_src.append(int(Source.EXTERNAL))
            rows_grp.append(g)
            texts.append(text)
            pids.append(examples[g].id)
            rewards.append(self.task.total_reward(text, examples[g]))
            hit.append(False)
        completion = torch.stack(comps)  # (N, L)
        lengths = policy.completion_lengths(completion)  # (N,)
        L_w = completion.shape[1]
        grp = torch.tensor(rows_grp, device=device)
        input_ids = torch.cat([prompt_ids[grp], completion], dim=1)  # (N, P+L)
        attention_mask = torch.cat([prompt_mask[grp], torch.ones_like(completion)], dim=1)
        completion_mask = torch.arange(L_w, device=device)[None, :] < lengths[:, None]  # (N, L)
        self.last_stats = {"time/generation_s": gen_time}
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            prompt_len=P,
            completion_mask=completion_mask,
            lengths=lengths,
            rewards=torch.tensor(rewards, dtype=torch.float32, device=device),
            source=torch.tensor(rows_src, dtype=torch.long, device=device),
            group=grp,
            texts=texts,
            prompt_ids=pids,
            hit_limit=torch.tensor(hit, dtype=torch.bool, device=device),
        )

    def evaluate_batch(self, batch: PromptBatch, policy: torch.nn.Module) -> RolloutBatch:
        """Greedy (``eval_generation``) completions of eval prompts, with eval scores in ``rewards``.

        ``rewards`` holds the evaluation score's ``correct`` and ``eval_total`` its ``total`` (Sudoku:
        blank cells), so pooled accuracy is ``sum(rewards) / sum(eval_total)``.
        """
        device = next(policy.parameters()).device
        prompt_ids, prompt_mask = policy.encode_prompts([self.task.messages(e) for e in batch.examples], self.max_prompt_len)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        comp = policy.generate(prompt_ids, prompt_mask, self.eval_generation, _step_seed(self.seed, 0, salt=1))
        texts = policy.decode_completions(comp)
        scores = [self.task.evaluate(t, e) for t, e in zip(texts, batch.examples)]
        lengths = policy.completion_lengths(comp)
        B = len(texts)
        return RolloutBatch(
            input_ids=torch.cat([prompt_ids, comp], 1),
            attention_mask=torch.cat([prompt_mask, torch.ones_like(comp)], 1),
            prompt_len=prompt_ids.shape[1],
            completion_mask=torch.arange(comp.shape[1], device=device)[None] < lengths[:, None],
            lengths=lengths,
            rewards=torch.tensor([s.correct for s in scores], dtype=torch.float32, device=device),
            source=torch.zeros(B, dtype=torch.long, device=device),
            group=torch.arange(B, device=device),
            texts=texts,
            prompt_ids=[e.id for e in batch.examples],
            hit_limit=(comp != policy.eos_id).all(-1),
            eval_total=torch.tensor([s.total for s in scores], dtype=torch.float32, device=device),
        )

    # -- recorded order ----------------------------------------------------------------------------
    def _order_path(self) -> Path | None:
        base = self.output_dir
        trainer = getattr(self, "trainer", None)
        if base is None and trainer is not None:
            base = trainer.log_dir or trainer.default_root_dir
        return Path(base) / "prompt_order.jsonl" if base else None

    def _write_order_file(self) -> None:
        """Record the prompt order of the first pass (rank 0): one prompt id per line, atomically."""
        rank, _ = self._world()
        p = self._order_path()
        if rank != 0 or p is None or p.exists():
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        order = self._order(0)
        with tmp.open("w") as fh:
            fh.write(json.dumps({"seed": self.seed, "prompts_per_batch": self.prompts_per_batch, "num_prompts": len(order)}) + "\n")
            for i in order:
                fh.write(json.dumps(self.train_examples[i].id) + "\n")
        tmp.replace(p)
