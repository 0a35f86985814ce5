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

import time
from typing import Any

import torch

from lit_rl.generation.settings import DecodeSettings
from lit_rl.rollouts.pool import load_pool
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source
from lit_rl.tasks.base import Task
from lit_rl.tasks.parsing import last_answer_block
from lit_rl.tasks.rewards import completion_id_lists

from datamodules.stream import PromptStreamDataModule, step_seed


class RolloutDataModule(PromptStreamDataModule):
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
        max_external_len: external completions are cut to this many policy tokens (plus EOS) when they are
            longer than ``L_gen``; a cut row has no EOS in frame, is rewarded on its cut text and is counted
            in ``train/external/cut_frac``.
        eval_size: evaluate on the first ``eval_size`` prompts of the task's eval set (``None``: all).
        eval_batch_size: prompts per validation batch.
        seed: seed of the prompt order and of rollout sampling.
        num_train_prompts: use only the first N training prompts (before shuffling); ``None``: all.
        output_dir: where ``prompt_order.jsonl`` goes (default: the trainer's log dir).
        group_size: G, rollouts per prompt group; when set it must equal ``g_on + g_ext`` (a guard for
            sweeps and configs that vary one of them).
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
        group_size: int | None = None,
    ) -> None:
        super().__init__(
            task,
            prompts_per_batch=prompts_per_batch,
            max_prompt_len=max_prompt_len,
            eval_size=eval_size,
            eval_batch_size=eval_batch_size,
            seed=seed,
            num_train_prompts=num_train_prompts,
            output_dir=output_dir,
        )
        if g_on < 0 or g_ext < 0 or g_on + g_ext == 0:
            raise ValueError(f"data.g_on ({g_on}) and data.g_ext ({g_ext}) must be >= 0 with g_on + g_ext > 0")
        if group_size is not None and group_size != g_on + g_ext:
            raise ValueError(f"data.group_size (G = {group_size}) must equal data.g_on + data.g_ext = {g_on} + {g_ext} = {g_on + g_ext}")
        if g_ext > 0 and not pool_path:
            raise ValueError("data.pool_path is required when data.g_ext > 0 (the external rollout pool file)")
        self.pool_path = pool_path
        self.g_on, self.g_ext = g_on, g_ext
        self.generation = generation or DecodeSettings()
        self.eval_generation = eval_generation or DecodeSettings(
            gen_length=self.generation.gen_length,
            block_length=self.generation.block_length,
            steps=self.generation.steps,
            temperature=0.0,
        )
        self.max_external_len = max_external_len
        self._pool: dict[str, list[Any]] = {}

    # -- data ----------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        first = self._train is None
        super().setup(stage)
        if first and self.g_ext > 0:
            valid = [e.id for e in self.task.train_examples()]
            self._pool = load_pool(self.pool_path, self.g_ext, valid_ids=valid, task=self.task.name)
            kept = [e for e in self.train_examples if e.id in self._pool]
            if not kept:
                raise ValueError(
                    f"data: no training prompts of task {self.task.name!r} have {self.g_ext} usable external "
                    f"rollouts in {self.pool_path}"
                )
            self._set_train_examples(kept)

    def prompt_batch(self, step: int) -> PromptBatch:
        """The prompts of stream batch ``step`` for this rank, each with its first ``G_ext`` external records."""
        batch = super().prompt_batch(step)
        batch.external = [self._pool.get(e.id, [])[: self.g_ext] if self.g_ext else [] for e in batch.examples]
        return batch

    # -- rollouts at batch start (called by the base class's on_after_batch_transfer) ---------------
    def produce_rollouts(self, batch: PromptBatch, module: torch.nn.Module) -> RolloutBatch:
        """On-policy generation + external rollouts of ``batch``, all scored by the task verifier.

        ``module`` is the LightningModule (its ``policy`` is used) or a policy.
        """
        policy = getattr(module, "policy", module)
        device = next(policy.parameters()).device
        examples = batch.examples
        prompt_ids, prompt_mask = policy.encode_prompts([self.task.messages(e) for e in examples], self.max_prompt_len)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)  # (B_p, P)
        P = prompt_ids.shape[1]
        L_gen = self.generation.gen_length
        rows_ids, rows_src, rows_grp, texts, pids, rewards, hit = [], [], [], [], [], [], []
        lengths = []  # per part, each measured on the part's own width (never on the padding)
        t0 = time.perf_counter()
        # 1. on-policy: G_on samples per prompt, seeded by (seed, step)
        if self.g_on:
            on_prompt = prompt_ids.repeat_interleave(self.g_on, 0)  # (B_p*G_on, P)
            on_mask = prompt_mask.repeat_interleave(self.g_on, 0)
            comp = policy.generate(on_prompt, on_mask, self.generation, self.generation_seed(batch.step))  # (B_p*G_on, L_gen)
            on_texts = policy.decode_completions(comp)
            lengths.append(policy.completion_lengths(comp))  # (B_p*G_on,) at most L_gen
            for k, text in enumerate(on_texts):
                g = k // self.g_on
                rows_ids.append(comp[k])
                rows_src.append(int(Source.ON_POLICY))
                rows_grp.append(g)
                texts.append(text)
                pids.append(examples[g].id)
                hit.append(bool((comp[k] != policy.eos_id).all()))
        gen_time = time.perf_counter() - t0
        # 2. external: the pool's first G_ext usable records, re-scored by this run's verifier. A record
        #    longer than the width is cut for training (no EOS in frame, like an on-policy row that hit
        #    L_gen: hit_limit True) and rewarded on the cut text, the text that is trained on.
        ext = [(g, r.completion) for g, recs in enumerate(batch.external) for r in recs]
        width = L_gen
        ext_ids = None
        cut: list[bool] = []
        if ext:
            n_tok = [policy.count_tokens(t) for _, t in ext]
            width = max(L_gen, min(max(n_tok) + 1, self.max_external_len + 1))
            ext_ids = policy.encode_completions([t for _, t in ext], width + 1)[0][:, :width].to(device)  # (E, width)
            cut = [n >= width for n in n_tok]
            lengths.append(policy.completion_lengths(ext_ids))  # (E,)
        cut_rows = [j for j, c in enumerate(cut) if c]
        cut_texts = dict(zip(cut_rows, policy.decode_completions(ext_ids[cut_rows]))) if cut_rows else {}
        # on-policy rows keep their own width L_gen: lengths, completion and attention masks end there
        comps = [torch.cat([r, r.new_full((width - r.shape[0],), policy.eos_id)]) for r in rows_ids]
        gen_width = [L_gen] * len(rows_ids)
        for j, (g, text) in enumerate(ext):
            text = cut_texts.get(j, text)
            comps.append(ext_ids[j])
            gen_width.append(width)
            rows_src.append(int(Source.EXTERNAL))
            rows_grp.append(g)
            texts.append(text)
            pids.append(examples[g].id)
            hit.append(cut[j])
        completion = torch.stack(comps)  # (N, L)
        L_w = completion.shape[1]
        own = torch.tensor(gen_width, device=device)  # (N,)
        pos = torch.arange(L_w, device=device)[None, :]  # (1, L)
        lengths = torch.cat(lengths)  # (N,)
        grp = torch.tensor(rows_grp, device=device)
        input_ids = torch.cat([prompt_ids[grp], completion], dim=1)  # (N, P+L)
        attention_mask = torch.cat([prompt_mask[grp], (pos < own[:, None]).to(prompt_mask.dtype)], dim=1)  # padding not attended
        completion_mask = pos < lengths[:, None]  # (N, L)
        n_ext = len(ext)
        # every row's reward in one call per reward function, as TRL calls them (token ids up to the first EOS)
        ids = completion_id_lists(completion, lengths) if self.task.extra_reward_funcs else None
        scores = self.task.total_rewards(texts, [examples[g] for g in rows_grp], completion_ids=ids)
        rewards = scores.totals
        self.last_stats = {"time/generation_s": gen_time, **scores.metrics()}
        if self.g_on:  # share of on-policy completions with an <answer> block: the format holds (or is lost)
            on = texts[: len(rows_ids)]
            self.last_stats["train/on_policy/format_rate"] = sum(last_answer_block(t) is not None for t in on) / len(on)
        if n_ext:
            self.last_stats["train/external/cut_frac"] = sum(cut) / n_ext
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
            gen_width=own,
        )

    def evaluate_batch(self, batch: PromptBatch, module: torch.nn.Module) -> RolloutBatch:
        """Greedy (``eval_generation``) completions of eval prompts, with eval scores in ``rewards``.

        ``rewards`` holds the evaluation score's ``correct`` and ``eval_total`` its ``total`` (Sudoku:
        blank cells), so pooled accuracy is ``sum(rewards) / sum(eval_total)``.
        """
        policy = getattr(module, "policy", module)
        device = next(policy.parameters()).device
        prompt_ids, prompt_mask = policy.encode_prompts([self.task.messages(e) for e in batch.examples], self.max_prompt_len)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        comp = policy.generate(prompt_ids, prompt_mask, self.eval_generation, step_seed(self.seed, 0, salt=1))
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
