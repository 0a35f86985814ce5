"""The rollout DataModule: a seeded prompt stream whose batches become rollout groups at batch start.

1. **Prompt stream.** The training prompts (those with ``G_ext`` usable external records when
   ``G_ext > 0``) are permuted with ``seed`` (a new permutation per pass, ``seed + pass``); batch ``s`` of
   the stream holds prompts ``[s·B·W + r·B, s·B·W + (r+1)·B)`` of that sequence for rank ``r`` of ``W``
   (each rank sees its own prompts, with their external rollouts). The order is written to
   ``prompt_order.jsonl`` in the run folder on the first batch, and the stream cursor is saved in every
   checkpoint, so a resumed run continues with the next unseen batch: nothing skipped, nothing repeated.
2. **External rollouts.** Each prompt's first ``G_ext`` usable records from the pool file (keyed by prompt
   id, :mod:`lit_rl.pools.pool`) travel with the prompt.
3. **On-policy rollouts** are produced at the start of each training batch (``on_after_batch_transfer``,
   the DataModule hook Lightning calls after the batch reaches the device and right before
   ``on_train_batch_start``): ``G_on`` completions per prompt from the *current* policy with the training
   decoder, seeded by ``(seed, step)`` so a resumed run draws the same rollouts. Every completion, on-policy
   and external, is scored with the task's verifier, and the batch carries a source-tagged
   :class:`~lit_rl.batch.RolloutBatch`.

Steps 3 and 2 are this DataModule's default sources, in that row order (:mod:`datamodules.sources`:
``DiffusionOnPolicy``, then ``ExternalPool``, built from ``g_on``, ``g_ext``, ``pool_path``, ``generation``);
``sources`` in YAML gives any list instead (``generation`` then defaults to its on-policy source's).
4. **Validation batches** are decoded greedily (T=0) and scored with the task's evaluation rule.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lit_rl.generation.engine import DiffusionEngine
from datamodules.sources import DiffusionOnPolicy, ExternalPool, RolloutSource, keep_usable_prompts, rows_per_prompt
from datamodules.stream import PromptStreamDataModule, step_seed
from lit_rl.errors import FieldError
from lit_rl.generation.settings import DecodeSettings
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.tasks.base import Task


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
        sources: the training rows' sources (:mod:`datamodules.sources`) instead of the ones ``g_on``,
            ``g_ext``, ``pool_path`` and ``generation`` describe.
        prompt_order_pool: an on-policy baseline's prompts and their order from an ERILS run's pool (ERILS App.
            B-E, "the same training-prompt order"): keep only the training prompts with ``prompt_order_g_ext``
            usable records in this pool file, as ERILS's external source does, so that the same ``seed`` gives
            the same prompt at every step. No external row is loaded. ``None``: every training prompt (the
            orders then differ wherever the pool has unusable prompts).
        prompt_order_g_ext: G_ext of the ERILS run whose order ``prompt_order_pool`` follows.
    """

    @staticmethod
    def check_args(g_on: int = 4, g_ext: int = 2, group_size: int | None = None, pool_path: str | None = None,
                   sources: Sequence[Any] | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`).
        A ``sources`` list says the group itself: the ``g_on`` / ``g_ext`` rules do not apply to it, and
        ``group_size`` is checked against the rows it holds (:func:`~datamodules.sources.rows_per_prompt`)."""
        if sources is not None:
            if not sources:
                raise FieldError("sources", "is empty: a rollout batch needs at least one source")
            counts = rows_per_prompt(sources)
            if group_size is not None and counts is not None and group_size != sum(counts):
                raise FieldError("group_size", f"G = {group_size} but the sources hold {sum(counts)} rows per prompt")
            return
        for name, v in (("g_on", g_on), ("g_ext", g_ext)):
            if v < 0:
                raise FieldError(name, f"must be >= 0, got {v}")
        if g_on + g_ext == 0:
            raise FieldError("g_on", "g_on + g_ext = 0: a rollout group needs at least one completion")
        if group_size is not None and group_size != g_on + g_ext:
            raise FieldError("group_size", f"G = {group_size} but g_on + g_ext = {g_on} + {g_ext} = {g_on + g_ext}")
        if g_ext > 0 and not pool_path:
            raise FieldError("pool_path", f"required when g_ext > 0 (g_ext = {g_ext}): the external rollout pool file")

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
        sources: Sequence[RolloutSource] | None = None,
        prompt_order_pool: str | None = None,
        prompt_order_g_ext: int = 2,
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
        RolloutDataModule.check_args(g_on=g_on, g_ext=g_ext, group_size=group_size, pool_path=pool_path,
                                     sources=sources)
        if sources is not None:  # the list says everything: G_on / G_ext are what it holds
            g_on, g_ext = rows_per_prompt(sources)
        self.pool_path = pool_path
        self.g_on, self.g_ext = g_on, g_ext
        if generation is None and sources is not None:  # the list's on-policy decoding is the run's
            generation = next((s.generation for s in sources if isinstance(s, DiffusionOnPolicy)), None)
        self.generation = generation or DecodeSettings()
        self.eval_generation = eval_generation or DecodeSettings(
            gen_length=self.generation.gen_length,
            block_length=self.generation.block_length,
            steps=self.generation.steps,
            temperature=0.0,
        )
        self.max_external_len = max_external_len
        if sources is None:  # ERILS's pair: G_on on-policy rows, then G_ext external rows at least L_gen wide
            sources = [DiffusionOnPolicy(g_on, self.generation)] if g_on else []
            if g_ext:
                sources.append(ExternalPool(g_ext, pool_path, max_external_len, min_width=self.generation.gen_length))
        self.sources = list(sources)
        if prompt_order_g_ext < 1:
            raise FieldError("prompt_order_g_ext", f"must be >= 1, got {prompt_order_g_ext}")
        if prompt_order_pool is not None and any(isinstance(s, ExternalPool) for s in self.sources):
            raise FieldError("prompt_order_pool", "is for a run without external rows (an on-policy baseline): "
                             "this run's external pool already sets its prompts")
        self.prompt_order_pool, self.prompt_order_g_ext = prompt_order_pool, prompt_order_g_ext
        self._engine: DiffusionEngine | None = None

    def filter_prompts(self) -> None:
        """ERILS's usable prompts (``prompt_order_pool``), where its external source filters: after the sources'
        setup, before the prompt-set check and the first shuffle."""
        if self.prompt_order_pool is not None:
            kept, _ = keep_usable_prompts(self.task, self.train_examples, self.prompt_order_pool,
                                          self.prompt_order_g_ext)
            self._set_train_examples(kept)

    def engine(self, policy: Any = None) -> DiffusionEngine:
        """The dLLM's engine (:class:`~lit_rl.generation.engine.DiffusionEngine`): the policy's own decoding for
        rollouts and evaluation, and double-rollout continuations / inpainting on the training decode's block
        schedule; built once, it runs the policy's modules (nothing to push)."""
        policy = policy if policy is not None else self._connected()
        if self._engine is None:
            self._engine = DiffusionEngine(policy, self.generation)
        self._engine.sync(policy)
        return self._engine

    def evaluate_batch(self, batch: PromptBatch, module: torch.nn.Module) -> RolloutBatch:
        """Greedy (``eval_generation``) completions of eval prompts, with eval scores in ``rewards``.

        ``rewards`` holds the evaluation score's ``correct`` and ``eval_total`` its ``total`` (Sudoku:
        blank cells), so pooled accuracy is ``sum(rewards) / sum(eval_total)``.
        """
        policy = getattr(module, "policy", module)
        device = next(policy.parameters()).device
        prompt_ids, prompt_mask = self.encode_prompts(policy, batch.examples)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        comp = self.engine(policy).sample(prompt_ids, prompt_mask, self.eval_generation,
                                          seed=step_seed(self.seed, 0, salt=1))  # (B, L_gen)
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
