"""Rollout sources: what adds rows to a training batch, configured as a list (``data.init_args.sources``).

Each source produces the rows of one kind for every prompt group of the batch; the DataModule stacks them
(source order, prompt-major within a source), scores every row with the task's verifier in one call and
hands one :class:`~lit_rl.batch.RolloutBatch` on::

    sources:
      - class_path: datamodules.sources.DiffusionOnPolicy     # G_on rollouts per prompt from the dLLM
        init_args: {num: 2, generation: {gen_length: 48, block_length: 16, steps: 12}}
      - class_path: datamodules.sources.ExternalPool           # G_ext rows per prompt from a pool file
        init_args: {num: 2, pool_path: data/pools/sudoku_grid.jsonl.gz, min_width: 48}

* :class:`DiffusionOnPolicy`: the dLLM's own rollouts (``policy.generate``), seeded by ``(seed, step, rank)``;
* :class:`AROnPolicy`: a causal LM's rollouts through the run's engine (HF or vLLM, which holds the policy's
  current weights);
* :class:`ExternalPool`: length-controlled completions of a stronger model from a pool file
  (:mod:`lit_rl.pools.pool`), re-scored by this run's verifier; the prompts without enough usable
  records leave the prompt stream.

A source returns :class:`Rows` (completion ids at its own width, lengths, the prompt index of each row, its
:class:`~lit_rl.core.sources.Source` tag, texts, whether each row hit its length limit) and its own
statistics. Rows of different widths are stacked with EOS padding outside each row's ``gen_width``.

A source sees only what it is handed (:mod:`datamodules.context`): at setup a :class:`SourceSetup` (it returns
the prompts it keeps), once the policy is known :meth:`RolloutSource.connect`, and per batch a
:class:`RolloutContext` whose engine samples (:class:`lit_rl.generation.engine.Engine`). A new source is a
subclass with ``num`` and :meth:`RolloutSource.rows`.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from datamodules.context import RolloutContext, SourceSetup
from lit_rl.core.sources import Source
from lit_rl.generation.diffusion import DecodeStats
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models.ar import SamplingSettings
from lit_rl.errors import ConfigError, FieldError
from lit_rl.pools.pool import iter_pool, load_pool
from lit_rl.batch import PromptBatch
from lit_rl.tasks.parsing import last_answer_block

__all__ = ["AROnPolicy", "DiffusionOnPolicy", "ExternalPool", "RolloutSource", "Rows", "keep_usable_prompts",
           "rows_per_prompt"]


@dataclass
class Rows:
    """One source's rows for a batch (``R`` of them, width ``W``).

    Attributes:
        completion: ``(R, W)`` completion ids, EOS-filled after each row's end.
        lengths: ``(R,)`` tokens up to and including the first EOS (at most the row's width).
        group: ``R`` prompt indices (into ``batch.examples``).
        source: the rows' :class:`~lit_rl.core.sources.Source`.
        texts: ``R`` completion texts (what the verifier scores).
        hit_limit: ``R`` bools, the row filled its width without an EOS.
        gen_width: each row's own width (``W`` for every row when ``None``).
        stats: the source's per-batch metrics.
    """

    completion: torch.Tensor
    lengths: torch.Tensor
    group: list[int]
    source: Source
    texts: list[str]
    hit_limit: list[bool]
    gen_width: int | None = None
    stats: dict[str, float] = field(default_factory=dict)


class RolloutSource:
    """Base of the sources. ``width`` (after :meth:`rows`) is what the next source's ``min_width`` may need."""

    #: rows per prompt group
    num: int = 0
    #: the source samples from the run's engine (``ctx.engine``); one that does not (a pool file) spares its start
    needs_engine: bool = True

    @staticmethod
    def check_args(num: int = 0) -> None:
        """Every source's rule on its ``num`` (each constructor calls it; so does the config preflight,
        :mod:`lit_rl.config.classes`, with the source's own default)."""
        if num < 1:
            raise FieldError("num", f"must be >= 1, got {num}")

    def setup(self, prompts: SourceSetup) -> list[Any] | None:
        """Once, before the first batch: the training prompts this source keeps (e.g. those a pool file has
        records for), or ``None`` to keep them all."""
        return None

    def connect(self, policy: Any) -> None:
        """Once the policy is known (the LightningModule's setup): checks that need it."""

    def attach(self, batch: PromptBatch) -> None:
        """Add what the source carries with each prompt batch (e.g. its external records)."""

    def rows(self, batch: PromptBatch, ctx: RolloutContext) -> Rows | None:
        """This source's rows for ``batch`` (``ctx.prompt_ids (B_p, P)`` left-padded on the policy's device)."""
        raise NotImplementedError


class DiffusionOnPolicy(RolloutSource):
    """``num`` (G_on) rollouts per prompt from the current dLLM, decoded with ``generation`` by the run's engine,
    seeded by the batch's ``(seed, step, rank)`` (rank-specific, so a resumed run redraws the same rollouts).

    Stats: ``time/generation_s``, ``train/on_policy/format_rate`` (share with an ``<answer>`` block),
    ``train/on_policy/forward_passes`` (model passes per rollout: the schedule's steps; with a threshold fewer
    where the model is sure, and more early in RL under ``threshold_floor: one``) and
    ``train/on_policy/confidence_mean`` (the revealed tokens' mean confidence when revealed: the quantity
    whose inflation during RL makes threshold decoding reveal more per step, the d1 repository's issue 25).

    Args:
        num: rollouts per prompt (G_on).
        generation: decoding settings (L_gen, block, steps, temperature, cache, threshold).
    """

    def __init__(self, num: int = 4, generation: DecodeSettings | None = None) -> None:
        RolloutSource.check_args(num=num)
        self.num = num
        self.generation = generation or DecodeSettings()

    def rows(self, batch, ctx) -> Rows:
        t0 = time.perf_counter()
        policy, stats = ctx.policy, DecodeStats()
        comp = ctx.engine.sample(ctx.prompt_ids, ctx.prompt_mask, self.generation, n=self.num, seed=ctx.seed,
                                 stats=stats)  # (B_p*G_on, L_gen) prompt-major
        texts = policy.decode_completions(comp)
        lengths = policy.completion_lengths(comp)  # (R,) at most L_gen
        gen_time = time.perf_counter() - t0
        format_rate = sum(last_answer_block(t) is not None for t in texts) / len(texts)
        return Rows(
            completion=comp, lengths=lengths, group=[k // self.num for k in range(len(texts))], source=Source.ON_POLICY,
            texts=texts, hit_limit=(comp != policy.eos_id).all(-1).tolist(), gen_width=comp.shape[1],
            stats={"time/generation_s": gen_time, "train/on_policy/format_rate": format_rate,
                   "train/on_policy/forward_passes": stats.passes_per_row(),
                   "train/on_policy/confidence_mean": stats.confidence_mean()},
        )


class AROnPolicy(RolloutSource):
    """``num`` (G) first-stage rollouts per prompt from a causal LM through the run's engine (HF or vLLM, synced
    to the policy's current weights), seeded by the batch's ``(seed, step, rank)``.

    Stats: ``time/stage1_s``, ``train/tokens_per_problem`` (mean completion length of one rollout, EOS
    included: DR Fig. 3's x-axis), ``train/cost/tokens_stage1`` (generated tokens per prompt).

    Args:
        num: rollouts per prompt (G).
        generation: sampling (``max_new_tokens``, ``temperature``, ``top_p``).
    """

    def __init__(self, num: int = 8, generation: SamplingSettings | None = None) -> None:
        RolloutSource.check_args(num=num)
        self.num = num
        self.generation = generation or SamplingSettings()

    def rows(self, batch, ctx) -> Rows:
        policy = ctx.policy
        t0 = time.perf_counter()
        comp = ctx.engine.sample(ctx.prompt_ids, ctx.prompt_mask, self.generation, n=self.num,
                                 seed=ctx.seed).to(ctx.prompt_ids.device)  # (B_p*G, L) prompt-major
        stage1 = time.perf_counter() - t0
        lengths = policy.completion_lengths(comp)  # (R,)
        return Rows(
            completion=comp, lengths=lengths, group=[k // self.num for k in range(comp.shape[0])],
            source=Source.ON_POLICY, texts=policy.decode_completions(comp),
            hit_limit=(comp != policy.eos_id).all(-1).tolist(),
            stats={
                "time/stage1_s": stage1,
                "train/tokens_per_problem": float(lengths.float().mean()),
                "train/cost/tokens_stage1": float(lengths.float().sum()) / len(batch.examples),
            },
        )


def keep_usable_prompts(task: Any, examples: Sequence[Any], pool_path: str, num: int
                        ) -> tuple[list[Any], dict[str, list[Any]]]:
    """The training prompts of ``examples`` that have ``num`` usable records in ``pool_path``, in their order (the
    stream then shuffles the kept list with its seed), and those records by prompt id.

    ERILS's :class:`ExternalPool` filters its stream this way; an on-policy baseline that names the same pool
    and ``num`` (``data.prompt_order_pool``) keeps the same prompts in the same order (ERILS App. B-E)."""
    valid = [e.id for e in task.train_examples()]
    pool = load_pool(pool_path, num, valid_ids=valid, task=task.name)
    kept = [e for e in examples if e.id in pool]
    if not kept:
        raise ValueError(
            f"data: no training prompts of task {task.name!r} have {num} usable external rollouts in {pool_path}"
        )
    return kept, pool


class ExternalPool(RolloutSource):
    """``num`` (G_ext) external rollouts per prompt: each prompt's first usable records in a pool file (keyed
    by prompt id), re-scored by this run's verifier. Training prompts without ``num`` usable records leave the
    stream. A record longer than the rows' width is cut for training (no EOS in frame, ``hit_limit``) and
    rewarded on its cut text, the text that is trained on (``train/external/cut_frac``).

    Args:
        num: external rows per prompt (G_ext).
        pool_path: the pool file (JSONL or JSONL.gz, :mod:`lit_rl.pools.pool`).
        max_external_len: longest external completion kept, in policy tokens (plus EOS).
        min_width: the rows' width is at least this (so that every row of a batch has one width when the pool's
            completions are shorter); ``null``: the DataModule's generation length (dLLM ``gen_length``, AR
            ``max_new_tokens``), as the ``g_ext`` shorthand's rows.

    Several pools may be listed: each keeps its own records (``batch.external`` holds them all, in source
    order, for sample tables).
    """

    needs_engine = False

    @staticmethod
    def check_args(pool_path: str | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        ``num``'s is :meth:`RolloutSource.check_args`."""
        if not pool_path:
            raise FieldError("pool_path", "required: the external rollout pool file")

    def __init__(self, num: int = 2, pool_path: str | None = None, max_external_len: int = 512,
                 min_width: int | None = None) -> None:
        RolloutSource.check_args(num=num)
        ExternalPool.check_args(pool_path=pool_path)
        self.num, self.pool_path, self.max_external_len, self.min_width = num, pool_path, max_external_len, min_width
        self._pool: dict[str, list[Any]] = {}
        self._fits_checked = False
        self._prompts: SourceSetup | None = None  # the prompt set it kept (what check_fits measures)

    def setup(self, prompts: SourceSetup) -> list[Any]:
        if self.min_width is None:
            self.min_width = prompts.gen_width
        kept, self._pool = keep_usable_prompts(prompts.task, prompts.examples, self.pool_path, self.num)
        self._prompts = SourceSetup(prompts.task, kept, prompts.max_prompt_len, prompts.gen_width)
        return kept

    def connect(self, policy: Any) -> None:
        self.check_fits(policy)

    def check_fits(self, policy: Any) -> None:
        """Refuse, at load, a record whose row cannot fit the policy's positions (``policy.max_positions``, where it
        has one), with the pool's file:line: the longest training prompt (at most ``max_prompt_len`` tokens) plus
        the record's width (its tokens + EOS, at most ``max_external_len + 1``, at least ``min_width``) must fit.
        Without this the first update that meets the record fails on an ``IndexError`` in the position embedding.
        """
        if self._prompts is None:  # not set up yet: the check runs at setup's connect or at the first rows
            return
        self._fits_checked = True
        max_pos = getattr(policy, "max_positions", None)
        if not isinstance(max_pos, int) or not self._pool:
            return
        task, examples = self._prompts.task, self._prompts.examples
        prompt_ids, _ = policy.encode_prompts([task.messages(e) for e in examples], self._prompts.max_prompt_len)
        P = prompt_ids.shape[1]  # the longest training prompt, in policy tokens
        for recs in self._pool.values():
            for r in recs[: self.num]:
                n = policy.count_tokens(r.completion)
                width = max(self.min_width or 0, min(n + 1, self.max_external_len + 1))
                if P + width > max_pos:
                    raise ConfigError(
                        f"{self._where(r)}: the external completion of prompt {r.prompt_id!r} is {n} policy tokens: "
                        f"with the longest training prompt ({P} tokens) its row needs {P + width} positions, the "
                        f"policy has max_positions = {max_pos}; set max_external_len <= {max_pos - P - 1} (longer "
                        "completions are cut for training), or raise max_positions"
                    )

    def _where(self, record: Any) -> str:
        """``pool:line`` of ``record`` (read again: only an error needs it)."""
        _, records = iter_pool(self.pool_path, with_lines=True)
        for lineno, r in records:
            if r.prompt_id == record.prompt_id and r.index == record.index:
                return f"{self.pool_path}:{lineno}"
        return str(self.pool_path)

    def attach(self, batch: PromptBatch) -> None:
        mine = [self._pool.get(e.id, [])[: self.num] for e in batch.examples]
        batch.records[id(self)] = mine
        batch.external = [old + new for old, new in zip(batch.external, mine)] if batch.external else mine

    def rows(self, batch, ctx) -> Rows | None:
        policy, prompt_ids = ctx.policy, ctx.prompt_ids
        mine = batch.records.get(id(self), batch.external)  # own records (a batch built by hand: .external)
        ext = [(g, r.completion) for g, recs in enumerate(mine) for r in recs]
        if not ext:
            return None
        if not self._fits_checked:
            self.check_fits(policy)
        n_tok = [policy.count_tokens(t) for _, t in ext]
        width = max(self.min_width, min(max(n_tok) + 1, self.max_external_len + 1))
        # (E, width)
        ids = policy.encode_completions([t for _, t in ext], width + 1)[0][:, :width].to(prompt_ids.device)
        cut = [n >= width for n in n_tok]
        cut_rows = [j for j, c in enumerate(cut) if c]
        cut_texts = dict(zip(cut_rows, policy.decode_completions(ids[cut_rows]))) if cut_rows else {}
        return Rows(
            completion=ids, lengths=policy.completion_lengths(ids), group=[g for g, _ in ext], source=Source.EXTERNAL,
            texts=[cut_texts.get(j, t) for j, (_, t) in enumerate(ext)], hit_limit=cut, gen_width=width,
            stats={"train/external/cut_frac": sum(cut) / len(ext)},
        )


def rows_per_prompt(sources: Sequence[Any]) -> tuple[int, int] | None:
    """``(G_on, G_ext)``: the rows per prompt that ``sources`` add (``ExternalPool`` rows are external, every other
    source's on-policy). The sources are built objects, or their config mappings (``class_path`` and
    ``init_args``; a ``num`` left out is the constructor's default), as the config preflight sees them. ``None``
    when a count cannot be told (a short or unknown class name, a ``num`` that is not an integer)."""
    on = ext = 0
    for s in sources:
        if not isinstance(s, Mapping):  # a built source
            cls, num = type(s), s.num
        elif isinstance(s.get("class_path"), str) and "." in s["class_path"]:
            module, _, name = s["class_path"].rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                return None
            if not (isinstance(cls, type) and issubclass(cls, RolloutSource)):
                return None
            args = s.get("init_args") if isinstance(s.get("init_args"), Mapping) else {}
            default = inspect.signature(cls).parameters.get("num")
            num = args.get("num", default.default if default is not None else None)
            if not isinstance(num, int) or isinstance(num, bool):
                return None
        else:
            return None
        if issubclass(cls, ExternalPool):
            ext += num
        else:
            on += num
    return on, ext
