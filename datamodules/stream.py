"""A seeded prompt stream with a checkpointed cursor, the base of rollout DataModules.

Shared by :class:`datamodules.rollouts.RolloutDataModule` (dLLM-ERILS: on-policy and external-pool rows)
and :class:`datamodules.ar_rollouts.ARRolloutDataModule` (double-rollout GRPO).

* The training prompts are permuted with ``seed`` (a new permutation per pass, ``seed + pass``); batch
  ``s`` holds prompts ``[s·B·W + r·B, s·B·W + (r+1)·B)`` of that sequence for rank ``r`` of ``W``.
* The order of the first pass is written to ``prompt_order.jsonl`` in the run folder on the first batch;
  the cursor (next batch) is saved in every checkpoint, so a resumed run continues with the next unseen
  batch.
* Rollouts are produced at batch start (``on_after_batch_transfer``): training rows by the DataModule's
  sources (:mod:`datamodules.sources`, stacked and scored by the task's verifier in one call,
  :meth:`produce_rollouts`), then the module's dependent stages (:meth:`run_stages`), evaluation rows by
  :meth:`evaluate_batch`, which subclasses implement.
* The LightningModule hands over its policy, its dependent stages and its weight version once, at setup
  (:meth:`PromptStreamDataModule.connect`, as litgpt's ``connect``); sources and stages get a typed
  :class:`~datamodules.context.RolloutContext` with the run's :class:`~lit_rl.generation.engine.Engine`
  (:meth:`PromptStreamDataModule.engine`) and never read the DataModule or the trainer.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import lightning as L
import torch

from torch.utils.data import DataLoader, IterableDataset

from datamodules.context import RolloutContext, SourceSetup
from lit_rl.atomic import atomic_write_text
from lit_rl.errors import ConfigError, FieldError
from lit_rl.rng import seed_for
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.tasks.base import Example, Task, check_prompt_set
from lit_rl.tasks.rewards import completion_id_lists
from lit_rl.runs import run_dir

__all__ = ["PromptStreamDataModule", "step_seed"]


def step_seed(seed: int, step: int, salt: int = 0, rank: int = 0) -> int:
    """The seed of stream batch ``step`` on DDP rank ``rank``: :func:`lit_rl.rng.seed_for` with stream
    ``salt`` (:class:`lit_rl.rng.Stream`; 0 = training generation, 1 = evaluation), so ranks never draw the
    same rollouts and a resumed run draws the same."""
    return seed_for(seed, salt, rank=rank, step=step)


class _PromptStream(IterableDataset):
    """Endless stream of :class:`PromptBatch` from ``start`` (one batch per item)."""

    def __init__(self, dm: "PromptStreamDataModule", start: int) -> None:
        self.dm, self.start = dm, start

    def __iter__(self) -> Iterator[PromptBatch]:
        step = self.start
        while True:
            yield self.dm.prompt_batch(step)
            step += 1


class _EvalSet(IterableDataset):
    """Fixed eval batches; rank ``r`` of ``W`` takes batches ``r, r+W, ...`` (no sampler padding, so no
    prompt is scored twice under DDP)."""

    def __init__(self, examples: list[Example], batch_size: int, rank: int = 0, world: int = 1) -> None:
        batches = [examples[i:i + batch_size] for i in range(0, len(examples), batch_size)]
        self.batches = [(i, b) for i, b in enumerate(batches)][rank::world]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[PromptBatch]:
        for i, b in self.batches:
            yield PromptBatch(examples=b, step=-1 - i)


class PromptStreamDataModule(L.LightningDataModule):
    """Seeded, resumable prompt stream; subclasses turn each batch into rollouts.

    Args:
        task: the task (prompts, verifier, eval metric).
        prompts_per_batch: prompt groups per device per rollout batch.
        max_prompt_len: prompts are cut to their last ``max_prompt_len`` tokens.
        eval_size: evaluate on the first ``eval_size`` prompts of the task's eval set (``None``: all).
        eval_batch_size: prompts per validation batch.
        seed: seed of the prompt order and of rollout sampling.
        num_train_prompts: use only the first N training prompts (before shuffling); ``None``: all.
        output_dir: where ``prompt_order.jsonl`` goes (default: the trainer's log dir).
    """

    #: the training rows' sources, in order (:mod:`datamodules.sources`); set by subclasses
    sources: list[Any] = []

    @staticmethod
    def check_args(prompts_per_batch: int = 8, max_prompt_len: int | None = 1024, eval_size: int | None = 128,
                   eval_batch_size: int = 32, num_train_prompts: int | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if prompts_per_batch < 1:
            raise FieldError("prompts_per_batch", f"must be >= 1, got {prompts_per_batch}")
        if eval_batch_size < 1:
            raise FieldError("eval_batch_size", f"must be >= 1, got {eval_batch_size}")
        # a negative N would silently drop the last |N| prompts (list[:N]); 0 would leave none
        if eval_size is not None and eval_size < 1:
            raise FieldError("eval_size", f"must be >= 1 or null (all), got {eval_size}: the evaluation set would "
                             "be empty")
        if num_train_prompts is not None and num_train_prompts < 1:
            raise FieldError("num_train_prompts", f"must be >= 1 or null (all), got {num_train_prompts}: the "
                             "training set would be empty")
        if max_prompt_len is not None and max_prompt_len < 1:
            raise FieldError("max_prompt_len", f"must be >= 1 or null (no cut), got {max_prompt_len}")

    def __init__(
        self,
        task: Task,
        prompts_per_batch: int = 8,
        max_prompt_len: int | None = 1024,
        eval_size: int | None = 128,
        eval_batch_size: int = 32,
        seed: int = 42,
        num_train_prompts: int | None = None,
        output_dir: str | None = None,
    ) -> None:
        super().__init__()
        PromptStreamDataModule.check_args(prompts_per_batch=prompts_per_batch, max_prompt_len=max_prompt_len,
                                          eval_size=eval_size, eval_batch_size=eval_batch_size,
                                          num_train_prompts=num_train_prompts)
        self.task = task
        self.prompts_per_batch = prompts_per_batch
        self.max_prompt_len = max_prompt_len
        self.eval_size = eval_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.num_train_prompts = num_train_prompts
        self.output_dir = output_dir
        self.cursor = 0  # next stream step to train on (saved in checkpoints)
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None
        self._orders: dict[int, list[int]] = {}
        self.last_stats: dict[str, float] = {}
        self.prompts_truncated = 0  # prompts cut to max_prompt_len in this process (training and evaluation)
        self._cut_in_last_encode = 0
        self._warned_truncation = False
        # what the LightningModule hands over once (connect): its policy, dependent stages, weight version and
        # the forward context its training step runs in (bf16-mixed autocast)
        self._policy: Any = None
        self._stages: list[Any] = []
        self._version: Callable[[], int] | None = None
        self._forward_context: Callable[[], Any] = contextlib.nullcontext
        self._bound: tuple[int, int] | None = None  # (trainer, module) the fallback bound, by id
        self._batch_engine: Any = None  # the engine this batch's sources used (its stages reuse it: one sync)

    # -- the LightningModule's parts, handed over once ---------------------------------------------------
    def connect(self, policy: Any, stages: Sequence[Any] = (), version: Callable[[], int] | None = None,
                forward_context: Callable[[], Any] | None = None) -> None:
        """Bind the module's ``policy``, its dependent rollout ``stages`` (e.g. double rollout's continuations,
        in order), ``version`` (its optimizer step count: the engine pushes weights when it changes; ``None``:
        push before every use) and the ``forward_context`` its training step runs in. The LightningModule calls
        this at setup (:class:`~lit_rl.algorithms.rl_module.RLModule`); each source may then check what needs
        the policy (:meth:`~datamodules.sources.RolloutSource.connect`)."""
        self._policy, self._stages, self._version = policy, list(stages), version
        self._forward_context = forward_context or contextlib.nullcontext
        self._bound = None  # connected by the module itself (the fallback of _connected sets it)
        self._connect_sources(policy)

    def _connect_sources(self, policy: Any) -> None:
        """Each source's checks that need the policy (:meth:`~datamodules.sources.RolloutSource.connect`), once."""
        if getattr(self, "_sources_policy", None) is not policy:
            for source in self.sources:
                source.connect(policy)
            self._sources_policy = policy

    def _connected(self) -> Any:
        """The connected policy; a module that did not call :meth:`connect` (not an ``RLModule``) is bound here from
        the trainer (its ``rollout_stages()`` if it has them), again when another trainer or module takes over."""
        if self._policy is not None and self._bound is None:  # the module connected itself: nothing to read
            return self._policy
        trainer = getattr(self, "trainer", None)
        module = trainer.lightning_module if trainer is not None else None
        if self._policy is None or self._bound != (id(trainer), id(module)):
            if module is None:
                raise RuntimeError("data: no policy connected (call connect(policy) or fit through a Trainer)")
            stages = module.rollout_stages() if hasattr(module, "rollout_stages") else []
            self.connect(getattr(module, "policy", module), stages, lambda: trainer.global_step,
                         trainer.precision_plugin.forward_context)
            self._bound = (id(trainer), id(module))
        return self._policy

    def engine(self, policy: Any = None) -> Any:
        """The run's :class:`~lit_rl.generation.engine.Engine` for ``policy`` (default: the connected one), synced
        to its current weights; subclasses build it."""
        raise NotImplementedError

    def generation_width(self) -> int:
        """The run's generation length (dLLM ``gen_length``, AR ``max_new_tokens``; 0 when there is none)."""
        gen = getattr(self, "generation", None)
        return int(getattr(gen, "gen_length", getattr(gen, "max_new_tokens", 0)) or 0)

    # -- data ----------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._train is None:
            train = self.task.train_examples()
            if self.num_train_prompts is not None:
                train = train[: self.num_train_prompts]
            if not train:
                raise ValueError(f"data: no training prompts for task {self.task.name!r}")
            self._train = list(train)
        if not getattr(self, "_sources_ready", False):
            for source in self.sources:
                kept = source.setup(SourceSetup(self.task, list(self.train_examples), self.max_prompt_len,
                                                self.generation_width()))
                if kept is not None:
                    self._set_train_examples(kept)
            self.filter_prompts()
            self._sources_ready = True
            # a fit's policy exists already: the sources' checks that need it (a pool row that cannot fit the
            # policy's positions) run now, before anything is written into the run folder
            policy = getattr(getattr(getattr(self, "trainer", None), "lightning_module", None), "policy", None)
            if policy is not None:
                self._connect_sources(policy)
            try:
                check_prompt_set(self.train_examples, self.prompts_per_batch, self._world()[1])
            except FieldError as e:
                raise ConfigError(f"data.{e.field}: {e.problem} (task {self.task.name!r})") from None
        if self._eval is None:
            ev = self.task.eval_examples()
            self._eval = ev[: self.eval_size] if self.eval_size is not None else ev
            if not self._eval:
                raise ValueError(f"data: the eval set of task {self.task.name!r} is empty")

    def filter_prompts(self) -> None:
        """Narrow the training prompts after the sources' setup and before the prompt-set check and the first
        shuffle (:meth:`_set_train_examples`); subclasses override it (default: nothing)."""

    @property
    def train_examples(self) -> list[Example]:
        """The prompts the stream draws from."""
        assert self._train is not None, "call setup() first"
        return self._train

    def _set_train_examples(self, examples: list[Example]) -> None:
        """Replace the stream's prompts (e.g. after data profiling); only before the first batch."""
        if not examples:
            raise ValueError(f"data: no training prompts left for task {self.task.name!r}")
        self._train = list(examples)
        self._orders = {}

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def generation_seed(self, step: int) -> int:
        """Seed of the training rollouts of stream batch ``step`` on this rank (rank-specific: DDP ranks draw
        different noise; evaluation seeds stay rank-free so pooled scores do not depend on the world size)."""
        return step_seed(self.seed, step, salt=0, rank=self._world()[0])

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
        """The prompts of stream batch ``step`` for this rank."""
        rank, world = self._world()
        n = len(self.train_examples)
        examples = []
        for pos in self.stream_positions(step, rank, world):
            epoch, i = divmod(pos, n)
            examples.append(self.train_examples[self._order(epoch)[i]])
        batch = PromptBatch(examples=examples, step=step, external=[[] for _ in examples])
        for source in self.sources:
            source.attach(batch)
        return batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_PromptStream(self, self.cursor), batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        assert self._eval is not None
        rank, world = self._world()
        n_batches = -(-len(self._eval) // self.eval_batch_size)
        if self._eval and n_batches < world:
            raise ValueError(
                f"data.eval_size ({len(self._eval)}) / data.eval_batch_size ({self.eval_batch_size}) gives "
                f"{n_batches} eval batch(es) for {world} ranks: every rank needs at least one "
                "(lower eval_batch_size or raise eval_size)"
            )
        return DataLoader(_EvalSet(self._eval, self.eval_batch_size, rank, world), batch_size=None, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The evaluation batches (``python -m lit_rl predict``, :mod:`callbacks.predictions`)."""
        return self.val_dataloader()

    # -- checkpointed state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "seed": self.seed, "num_train": len(self._train or [])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"data.seed ({self.seed}) differs from the checkpoint's ({state['seed']}): "
                             "the prompt order would change")
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
        policy = self._connected()
        if trainer.training:
            self._write_order_file()
            batch.rollouts = self.produce_rollouts(batch, policy)
            self.cursor = batch.step + 1
            # what later stages need travels with the batch (no stage reads the DataModule through the trainer)
            batch.task, batch.generation, batch.rank = self.task, getattr(self, "generation", None), self._world()[0]
            batch.stats = dict(self.last_stats)
            self.run_stages(batch)
        else:
            batch.rollouts = self.evaluate_batch(batch, policy)
        return batch

    def run_stages(self, batch: PromptBatch) -> None:
        """The connected dependent rollout stages (e.g. double rollout's continuations) on the batch's rows, in
        order, with the run's engine, in the module's forward context (its training step's bf16-mixed
        autocast). Generation happens here, in the rollout stage, and nowhere else."""
        if not self._stages:
            return
        engine = self._batch_engine if self._batch_engine is not None else self.engine(self._policy)
        for stage in self._stages:
            with self._forward_context():
                stage.run(batch, batch.rollouts, self._policy, engine)

    def produce_rollouts(self, batch: PromptBatch, module: Any) -> RolloutBatch:
        """Training rows of ``batch``: every source's rows (source order, prompt-major), stacked at one width
        with each row's own ``gen_width`` (padding outside it is neither attended nor scored), scored by the
        task's verifier and reward functions in one call (TRL's batched call: completion ids up to each
        row's first EOS when the task has reward functions). ``module`` is the LightningModule (its
        ``policy`` is used) or a policy. Sets ``last_stats`` (the sources' and the reward functions' metrics)."""
        policy = getattr(module, "policy", module)
        device = next(policy.parameters()).device
        examples = batch.examples
        prompt_ids, prompt_mask = self.encode_prompts(policy, examples)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)  # (B_p, P)
        cut = self._cut_in_last_encode
        rank = self._world()[0]
        # the engine is built (vLLM: started) only when a source samples (an external pool alone does not)
        engine = self.engine(policy) if any(getattr(s, "needs_engine", True) for s in self.sources) else None
        self._batch_engine = engine
        ctx = RolloutContext(policy=policy, engine=engine, task=self.task, step=batch.step, rank=rank,
                             seed=self.generation_seed(batch.step), prompt_ids=prompt_ids, prompt_mask=prompt_mask)
        parts = [r for src in self.sources if (r := src.rows(batch, ctx)) is not None]
        if not parts:
            raise RuntimeError(f"data: no rollouts for batch {batch.step} "
                               f"(sources: {[type(s).__name__ for s in self.sources]})")
        width = max(p.completion.shape[1] for p in parts)
        eos = policy.eos_id
        comps, own = [], []
        for p in parts:
            c = p.completion
            comps.append(torch.cat([c, c.new_full((c.shape[0], width - c.shape[1]), eos)], 1)
                         if c.shape[1] < width else c)
            own.append(torch.full((c.shape[0],), p.gen_width or c.shape[1], dtype=torch.long, device=device))
        completion = torch.cat(comps)  # (N, L)
        gen_width = torch.cat(own)  # (N,)
        lengths = torch.cat([p.lengths for p in parts])  # (N,)
        grp = torch.tensor([g for p in parts for g in p.group], device=device)  # (N,)
        texts = [t for p in parts for t in p.texts]
        pos = torch.arange(width, device=device)[None, :]  # (1, L)
        ids = completion_id_lists(completion, lengths) if self.task.extra_reward_funcs else None
        scores = self.task.total_rewards(texts, [examples[g] for g in grp.tolist()], completion_ids=ids)
        self.last_stats = ({k: v for p in parts for k, v in p.stats.items()} | scores.metrics() | self.extra_stats()
                           | {"train/prompts_truncated": float(cut),
                              "train/prompts_truncated_total": float(self.prompts_truncated)})
        return RolloutBatch(
            input_ids=torch.cat([prompt_ids[grp], completion], dim=1),  # (N, P+L)
            attention_mask=torch.cat([prompt_mask[grp], (pos < gen_width[:, None]).to(prompt_mask.dtype)], dim=1),
            prompt_len=prompt_ids.shape[1],
            completion_mask=pos < lengths[:, None],  # (N, L)
            lengths=lengths,
            rewards=torch.tensor(scores.totals, dtype=torch.float32, device=device),
            source=torch.tensor([int(p.source) for p in parts for _ in p.group], dtype=torch.long, device=device),
            group=grp,
            texts=texts,
            prompt_ids=[examples[g].id for g in grp.tolist()],
            hit_limit=torch.tensor([h for p in parts for h in p.hit_limit], dtype=torch.bool, device=device),
            gen_width=gen_width,
        )

    def encode_prompts(self, policy: Any, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts of ``examples`` encoded by ``policy`` (``(ids (B, P), mask (B, P))``, on the CPU), cut to
        their last ``max_prompt_len`` tokens. Cut prompts are counted (``prompts_truncated``, the
        ``train/prompts_truncated`` metrics) and the first one of the run is a warning."""
        cut: list[int] = []
        out = policy.encode_prompts([self.task.messages(e) for e in examples], self.max_prompt_len, truncated=cut)
        self._cut_in_last_encode = len(cut)
        self.prompts_truncated += len(cut)
        if cut and not self._warned_truncation:
            from lightning.pytorch.utilities import rank_zero_warn

            self._warned_truncation = True
            rank_zero_warn(
                f"data.max_prompt_len = {self.max_prompt_len}: prompt {examples[cut[0]].id!r} and {len(cut) - 1} "
                f"other(s) of this batch are longer and keep only their last {self.max_prompt_len} tokens (the "
                "start of the prompt, e.g. the instructions, is lost); raise max_prompt_len. Shown once per run; "
                "train/prompts_truncated counts them per batch"
            )
        return out

    def extra_stats(self) -> dict[str, float]:
        """The DataModule's own per-batch metrics next to the sources' (subclasses; e.g. data profiling)."""
        return {}

    def evaluate_batch(self, batch: PromptBatch, module: L.LightningModule) -> RolloutBatch:
        """Evaluation rows of ``batch``, ``rewards`` = the eval score's ``correct`` (subclasses)."""
        raise NotImplementedError

    # -- recorded order ----------------------------------------------------------------------------
    def _order_path(self) -> Path | None:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return Path(self.output_dir) / "prompt_order.jsonl" if self.output_dir else None
        return run_dir(trainer, self.output_dir) / "prompt_order.jsonl"

    def _write_order_file(self) -> None:
        """Record the prompt order of the first pass (rank 0): one prompt id per line, atomically."""
        rank, _ = self._world()
        p = self._order_path()
        if rank != 0 or p is None or p.exists():
            return
        order = self._order(0)
        head = json.dumps({"seed": self.seed, "prompts_per_batch": self.prompts_per_batch, "num_prompts": len(order)})
        atomic_write_text(p, "".join([head + "\n", *(json.dumps(self.train_examples[i].id) + "\n" for i in order)]))
