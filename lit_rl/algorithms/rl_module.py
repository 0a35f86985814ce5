"""The training step every RL module shares (ERILS, SPG, double-rollout GRPO, GRPO, the SFT baseline).

Every module consumes one rollout batch per training step and makes ``μ`` optimizer updates on it with
manual optimisation (``trainer.global_step`` counts updates, so ``max_steps`` is the paper's step count).
:meth:`RLModule.training_step` is the same five steps for all of them; a module is its parts::

    1. rollouts   batch.rollouts, produced by the DataModule's sources at batch start
    2. processors rewards -> advantages (and replaced rows): the chain ``self.processors``
    3. metrics    the batch's statistics (the DataModule's, the processors', the module's own)
    4. prepare    ``self.loss_fn.prepare``: the rows trained on, masks, π_old / π_ref, once per batch
    5. updates    μ x ``optimizer_update(loss_backward)``: the loss's micro-batches, ``manual_backward`` each

The loss gets typed arguments (:class:`~lit_rl.algorithms.loss_api.LossContext`), never the module; the module
owns micro-batching (one ``micro_batch_size``), ``manual_backward`` and logging.

What else they share lives here and nowhere else:

* the constructor checks and the injected optimizer / scheduler factories (LightningCLI builds them);
* :meth:`RLModule.optimizer_update`: one update = zero grads → the loss over micro-batches
  (:meth:`RLModule.loss_backward`) → NaN guard (a non-finite loss or gradient skips the update, weights and
  optimizer state unchanged, ``train/skipped_updates`` counts it; ``max_consecutive_skips`` in a row raise
  :class:`NonFiniteUpdateError`) → grad-norm clipping → step → LR schedule → ``train/loss``, ``train/lr``
  and the loss's own statistics;
* the periodic greedy evaluation (``val/<task>/greedy/accuracy`` pooled over DDP ranks, the sanity-check
  pass logged as the curve's first point);
* :meth:`RLModule.configure_model`: FSDP2 sharding of the policy under ``ModelParallelStrategy``
  (:mod:`lit_rl.distributed`; the NaN guard then agrees over the ranks, each of which holds gradient shards).

The subclasses only choose the default parts (:class:`~lit_rl.algorithms.erils.ERILSModule`: ERILS's
advantage processor and the SPG loss; :class:`~lit_rl.algorithms.double_rollout.DoubleRolloutGRPO`: the
double-rollout estimate and the clipped policy gradient); ``processors`` and ``loss_fn`` in YAML replace them.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from typing import Any, Callable, Iterator, Sequence

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.distributed.tensor import DTensor

from lit_rl.optim import rl_adamw
from lit_rl.algorithms.loss_api import Loss, LossContext, Prepared
from lit_rl.algorithms.processors import Processor, run_processors
from lit_rl.errors import FieldError
from lit_rl.batch import PromptBatch, RolloutBatch

__all__ = ["NonFiniteUpdateError", "RLModule", "reward_summary", "warn_unused_sugar"]


def warn_unused_sugar(sugar: str, sugar_value: Any, part: str, part_value: Any) -> None:
    """A module's shortcut (``surrogate``, ``advantages``, ``double_rollout``, ``loss``) builds a default part; with
    the part itself given too (an overlay that replaces the part), the shortcut is not used: say so once."""
    if sugar_value is not None and part_value is not None:
        rank_zero_warn(f"model.init_args.{sugar} is not used: model.init_args.{part} is set and replaces the part it "
                       f"would build")


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive optimizer updates were skipped for NaN/inf (the message names the last rollout
    batch's reward range and reward functions, :func:`reward_summary`)."""


def reward_summary(rewards: Tensor, stats: dict[str, Any]) -> str:
    """``"the last rollout batch's rewards ranged from -1 to 1e+05 (reward functions: sudoku_reward, brevity)"``:
    the finite rewards' range and the functions whose ``rewards/<name>/mean`` the batch logged."""
    r = rewards.detach().float().reshape(-1)
    r = r[~torch.isnan(r)]
    names = sorted({m.group(1) for k in stats if (m := re.search(r"(?:^|/)rewards/([^/]+)/mean$", k))})
    span = f"ranged from {r.min().item():g} to {r.max().item():g}" if r.numel() else "were all NaN (no reward)"
    return f"the last rollout batch's rewards {span}" + (f" (reward functions: {', '.join(names)})" if names else "")


def _local(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (FSDP2), else ``t``."""
    return t.to_local() if isinstance(t, DTensor) else t



class RLModule(L.LightningModule):
    """Base of the RL LightningModules: μ manual optimizer updates per rollout batch, greedy evaluation.

    Args:
        policy: the policy (a module with ``parameters()``; generation lives in the DataModule).
        optimizer: optimizer factory.
        scheduler: LR scheduler factory, stepped every optimizer update (``None``: constant).
        updates_per_batch: μ, optimizer updates per rollout batch.
        micro_batch_size: rollouts per forward/backward within one update (gradient accumulation);
            ``None`` = the whole rollout batch at once.
        grad_clip: max gradient norm; ``None`` disables clipping.
        max_consecutive_skips: stop after this many non-finite updates in a row.
        seed: seed of the subclass's randomness (mask draws, continuation sampling).
        processors: the advantage chain (:mod:`lit_rl.algorithms.processors`).
        loss_fn: the loss (:mod:`lit_rl.algorithms.losses`).
    """

    @staticmethod
    def check_args(updates_per_batch: int = 1, micro_batch_size: int | None = None, grad_clip: float | None = 1.0,
                   max_consecutive_skips: int = 10) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        if updates_per_batch < 1:
            raise FieldError("updates_per_batch", f"must be >= 1, got {updates_per_batch}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise FieldError("micro_batch_size", f"must be >= 1 or null, got {micro_batch_size}")
        if grad_clip is not None and not grad_clip > 0:
            raise FieldError("grad_clip", f"must be > 0 or null (no clipping), got {grad_clip}")
        if max_consecutive_skips < 1:
            raise FieldError("max_consecutive_skips", f"must be >= 1, got {max_consecutive_skips}")

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer: OptimizerCallable = rl_adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 1,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 1.0,
        max_consecutive_skips: int = 10,
        seed: int = 0,
        processors: Sequence[Processor] | None = None,
        loss_fn: Loss | None = None,
    ) -> None:
        super().__init__()
        RLModule.check_args(updates_per_batch=updates_per_batch, micro_batch_size=micro_batch_size,
                            grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips)
        self.automatic_optimization = False
        self.policy = policy
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.updates_per_batch = updates_per_batch
        self.micro_batch_size = micro_batch_size
        self.grad_clip = grad_clip
        self.max_consecutive_skips = max_consecutive_skips
        self.seed = seed
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.processors: list[Processor] = list(processors or [])
        self.loss_fn: Loss | None = loss_fn
        for part in (*self.processors, self.loss_fn):
            if part is not None:
                part.bind(policy)
        for p in self.processors:  # a processor built with seed None (InpaintReplace) draws from the module's seed
            if hasattr(p, "seed") and p.seed is None:
                p.seed = seed
        self._val_correct, self._val_total = 0.0, 0.0
        self._val_len: list[Tensor] = []
        self.reference: torch.nn.Module | None = None  # frozen copy of the policy (a KL loss, reference "copy")

    # -- checkpoints ------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The frozen 4-bit base stays out of checkpoints (:mod:`lit_rl.models.frozen_state`)."""
        from lit_rl.models.frozen_state import drop_frozen_4bit

        drop_frozen_4bit(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lit_rl.models.frozen_state import expect_frozen_4bit

        # a resumed run restores the KL reference saved with the checkpoint (strict loading needs the module)
        if self.reference is None and any(k.startswith("reference.") for k in checkpoint.get("state_dict", {})):
            self._make_reference()

        state = getattr(self._trainer, "state", None) if self._trainer is not None else None
        expect_frozen_4bit(self, checkpoint, resuming_fit=getattr(state, "fn", None) == "fit")

    # -- the rollout side's parts, handed over once ----------------------------------------------------
    def setup(self, stage: str) -> None:
        """Hand the DataModule what its rollouts need, once (:meth:`datamodules.stream.PromptStreamDataModule
        .connect`): the policy, the dependent rollout stages (:meth:`rollout_stages`), the weight version the
        engine pushes by (the optimizer step count) and the forward context of the training step (precision)."""
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "connect"):
            trainer = self.trainer
            dm.connect(self.policy, self.rollout_stages(), version=lambda: trainer.global_step,
                       forward_context=trainer.precision_plugin.forward_context)

    # -- sharding --------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """FSDP2: shard ``policy.model`` over the data-parallel mesh of ``ModelParallelStrategy``
        (:func:`lit_rl.distributed.shard_policy_fsdp2`; bf16 gathers with fp32 gradient reduction when
        ``trainer.precision`` is ``bf16-mixed``). Without a device mesh (DDP, one device) it does nothing;
        Lightning calls it again for every fit/validate/test, and an already sharded policy is left as is."""
        mesh = self.device_mesh
        if mesh is None:
            return
        from lit_rl.distributed import shard_policy_fsdp2

        names = mesh.mesh_dim_names or ()
        if "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                "lit_rl shards with FSDP2 only: set trainer.strategy.init_args.tensor_parallel_size: 1 "
                f"(got {mesh['tensor_parallel'].size()})"
            )
        for part in (*self.processors, self.loss_fn):
            why = getattr(part, "fsdp2_unsupported", None)
            if why:
                raise ValueError(f"{type(part).__name__} does not support FSDP2 sharding (trainer.strategy: "
                                 f"ModelParallelStrategy): {why}; use trainer.strategy: ddp")
        if self._reference_mode() == "copy":
            raise ValueError(
                f"{type(self.loss_fn).__name__}'s KL reference would be a deep copy of the FSDP2-sharded policy, "
                "which lit_rl does not support: use a LoRA policy (policy.lora; the reference is the policy with "
                "its adapter disabled), set the loss's KL coefficient to 0, or trainer.strategy: ddp"
            )
        dp_mesh = mesh["data_parallel"] if "data_parallel" in names else mesh
        shard_policy_fsdp2(self.policy.model, dp_mesh, mixed_precision=self.trainer.precision == "bf16-mixed")

    # -- optimisation ----------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model.policy has no trainable parameters (LoRA targets matched nothing?)")
        opt = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return opt
        sched = self.scheduler_factory(opt)
        if getattr(sched, "total_steps", 0) is None and hasattr(sched, "set_total_steps"):
            sched.set_total_steps(self.trainer.max_steps)  # a schedule that ends with the run (WarmupCosine)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- the training step ------------------------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> Tensor:
        # 1. rollouts: produced by the DataModule's sources at the start of this batch
        ro = batch.rollouts
        if ro is None:
            raise RuntimeError(f"training batch has no rollouts: {type(self).__name__} needs a rollout DataModule "
                               "(datamodules)")
        # 2. processors: rewards -> advantages (and rows kept or replaced)
        ro = run_processors(self.processors, ro, batch)
        batch.rollouts = ro  # callbacks (RolloutTracker, ...) see the rows that are trained on, with their advantages
        self.last_rewards = reward_summary(ro.rewards, batch.stats)  # named if the updates go non-finite
        # 3. metrics of this rollout batch: the DataModule's and the processors' (batch.stats), the module's own
        self.log_batch_metrics(ro, batch)
        # 4. the loss's fixed part, once per batch (rows trained on, masks, π_old / π_ref)
        if self.loss_fn is None:
            raise RuntimeError(f"{type(self).__name__} has no loss")
        prepared = self.loss_fn.prepare(ro, self.loss_context())
        self.log_loss_metrics(prepared)
        # 5. μ optimizer updates on this rollout batch
        loss = torch.zeros((), device=self.device)
        for k in range(self.updates_per_batch):
            loss = self.optimizer_update(lambda: self.loss_backward(prepared, k), self.loss_fn.stats_prefix)
        self.log_step_axis(batch)
        return loss

    def loss_context(self, update: int = 0, step: int | None = None) -> LossContext:
        """What the loss is given (:class:`~lit_rl.algorithms.loss_api.LossContext`): the policy, this update's
        step (default ``global_step``) and index, the micro-batch size, the mask seeds' inputs, the reference."""
        return LossContext(
            policy=self.policy, device=self.device, step=self.global_step if step is None else step, update=update,
            updates_per_batch=self.updates_per_batch, micro_batch_size=self.micro_batch_size, seed=self.seed,
            rank=self.global_rank, reference=self.reference_policy if self._reference_mode() else None,
        )

    def loss_backward(self, prepared: Prepared, update: int, step: int | None = None
                      ) -> tuple[Tensor, dict[str, Tensor]]:
        """One update's forward and backward passes: the loss over micro-batches of ``micro_batch_size`` rows,
        each through ``manual_backward``; returns ``(loss, stats)`` (stats: the last micro-batch's and the
        update's own, :meth:`~lit_rl.algorithms.loss_api.Loss.finish_update`)."""
        ctx = self.loss_context(update, step)
        loss_sum = torch.zeros((), device=self.device)
        stats: dict[str, Tensor] = {}
        for sl in ctx.slices(len(prepared.rows)):
            loss, stats = self.loss_fn.micro_batch_loss(prepared, sl, ctx)
            self.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
        stats = {**stats, **self.loss_fn.finish_update(prepared, ctx)}
        self.log_loss_metrics(prepared)
        return loss_sum, stats

    def log_loss_metrics(self, prepared: Prepared) -> None:
        """Log and empty the loss's metric mailbox (``prepared.metrics``, full names)."""
        for k, v in prepared.metrics.items():
            self.log(k, v, on_step=True, batch_size=1)
        prepared.metrics.clear()

    def rollout_stages(self) -> list[Any]:
        """The dependent rollout stages the processors need (:attr:`Processor.stage`, e.g. double rollout's
        continuations), in chain order: the DataModule runs them after the first stage."""
        return [p.stage for p in self.processors if getattr(p, "stage", None) is not None]

    @property
    def uninformative_batches(self) -> int:
        """Batches the loss found nothing to learn from (``ClippedPGLoss``); checkpointed by ``ExactResume``."""
        return getattr(self.loss_fn, "uninformative_batches", 0)

    @uninformative_batches.setter
    def uninformative_batches(self, value: int) -> None:
        if hasattr(self.loss_fn, "uninformative_batches"):
            self.loss_fn.uninformative_batches = int(value)

    # -- the KL reference -------------------------------------------------------------------------------
    def _reference_mode(self) -> str | None:
        """How the loss's KL reference is kept (``loss_fn.reference_mode``): ``None`` (the loss has no KL
        term), ``"adapter"`` (the policy with its LoRA adapter disabled) or ``"copy"`` (a frozen copy of the
        policy taken when training starts); ``"auto"`` picks ``"adapter"`` for a LoRA policy."""
        mode = getattr(self.loss_fn, "reference_mode", None)
        if mode is None:
            return None
        has_adapter = hasattr(getattr(self.policy, "model", None), "disable_adapter")
        if mode == "auto":
            mode = "adapter" if has_adapter else "copy"
        if mode == "adapter" and not has_adapter:
            raise ValueError(f"{type(self.loss_fn).__name__}: reference 'adapter' (model.init_args.loss.reference, or "
                             "model.init_args.loss_fn.init_args.reference) needs a LoRA policy (policy.lora)")
        return mode

    def _make_reference(self) -> None:
        ref = copy.deepcopy(self.policy)
        for p in ref.parameters():
            p.requires_grad_(False)
        self.reference = ref.eval()

    def on_train_start(self) -> None:
        # after the warm-up callbacks (on_fit_start): the reference is the policy RL starts from
        if self._reference_mode() == "copy" and self.reference is None:
            self._make_reference()

    @contextlib.contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The KL reference as a policy (same calls as ``self.policy``): the policy with its adapter disabled,
        or the frozen copy on the policy's device."""
        mode = self._reference_mode()
        if mode is None:
            raise RuntimeError(f"{type(self).__name__}.loss_fn has no KL term (no reference_mode)")
        if mode == "adapter":
            with self.policy.model.disable_adapter():
                yield self.policy
            return
        if self.reference is None:
            self._make_reference()
        yield self.reference.to(self.device)

    def batch_metrics(self, ro: RolloutBatch, batch: PromptBatch) -> dict[str, float]:
        """The module's own per-batch metrics of the processed rows (subclasses; default none)."""
        return {}

    def log_batch_metrics(self, ro: RolloutBatch, batch: PromptBatch) -> None:
        """Step 3: ``batch.stats`` (DataModule, processors) and :meth:`batch_metrics`, once per batch; NaNs
        (e.g. a reward function that returned None everywhere) are left out."""
        bs = len(batch.examples) or 1
        for k, v in {**self.batch_metrics(ro, batch), **batch.stats}.items():
            v = float(v)
            if not math.isnan(v):
                self.log(k, v, on_step=True, batch_size=bs, prog_bar=k == "train/on_policy/reward_mean")

    def optimizer_update(self, backward: Callable[[], tuple[Tensor, dict[str, Tensor]]], stats_prefix: str) -> Tensor:
        """One optimizer update around ``backward()``, which runs the loss over micro-batches (calling
        ``self.manual_backward``) and returns ``(loss_sum, stats)``; steps in the module docstring."""
        opt = self.optimizers()
        sched = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        loss_sum, stats = backward()
        params = [p for p in self.policy.parameters() if p.requires_grad]
        finite = bool(torch.isfinite(loss_sum))
        finite = finite and all(p.grad is None or torch.isfinite(_local(p.grad)).all() for p in params)
        if any(isinstance(p, DTensor) for p in params):
            # FSDP2: a rank sees only its own gradient shards (and loss), so skip on every rank or on none
            flag = torch.tensor(float(finite), device=loss_sum.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            finite = bool(flag)
        if not finite:
            opt.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            self.log("train/skipped_updates", float(self.skipped_updates), on_step=True, batch_size=1)
            if self.consecutive_skips >= self.max_consecutive_skips:
                raise NonFiniteUpdateError(
                    f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                    f"(model.max_consecutive_skips = {self.max_consecutive_skips}); last loss {loss_sum.item()}"
                    + (f"; {self.last_rewards}" if getattr(self, "last_rewards", None) else "")
                )
            return loss_sum
        self.consecutive_skips = 0
        # every update, not only on a skip (see DoubleRolloutGRPO: a value logged once is re-emitted later)
        self.log("train/skipped_updates", float(self.skipped_updates), on_step=True, batch_size=1)
        grads = [p.grad for p in params if p.grad is not None]
        if grads and not any(isinstance(g, DTensor) for g in grads):  # TRL's grad_norm: before clipping
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            self.log("train/grad_norm", norm, on_step=True, batch_size=1)
        if self.grad_clip is not None:
            self.clip_gradients(opt, gradient_clip_val=self.grad_clip, gradient_clip_algorithm="norm")
        opt.step()
        if sched is not None:
            sched.step()
        self.log("train/loss", loss_sum, on_step=True, prog_bar=True, batch_size=1)
        self.log("train/lr", opt.param_groups[0]["lr"], on_step=True, batch_size=1)
        for k, v in stats.items():  # the loss's own statistics (of the last micro-batch)
            self.log(f"{stats_prefix}/{k}", v.float(), on_step=True, batch_size=1)
        return loss_sum

    def log_step_axis(self, batch: PromptBatch) -> None:
        """One x-axis for every metric: ``global_step`` (optimizer updates), as the callbacks, TRL and Lightning's
        automatic optimisation use. With μ manual updates per batch Lightning would log a batch's metrics at
        the number of batches so far, unless a metric named ``step`` is logged (``LoggerConnector.log_metrics``
        takes it as the step); so each ``training_step`` ends with this. The batch's metrics then sit at the
        update after its last one (per-update values: the last update's); the rollout batch is a metric of its
        own, ``train/rollout_batch`` (batches trained so far)."""
        self.log("step", float(self.global_step), on_step=True, batch_size=1)
        self.log("train/rollout_batch", float(batch.step + 1), on_step=True, batch_size=1)

    # -- periodic greedy evaluation --------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_correct, self._val_total, self._val_len = 0.0, 0.0, []

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        ro = batch.rollouts
        self._val_correct += float(ro.rewards.sum())
        self._val_total += float(ro.eval_total.sum())
        self._val_len.append(ro.lengths.float())

    def on_validation_epoch_end(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        task = getattr(getattr(dm, "task", None), "name", "task")
        lengths = torch.cat(self._val_len).float() if self._val_len else torch.zeros(0)
        # [correct, total, length sum, completions] pooled over DDP ranks (each evaluates its own shard)
        sums = torch.tensor([self._val_correct, self._val_total, float(lengths.sum()), float(lengths.numel())],
                            device=self.device)
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum") if self.trainer.world_size > 1 else sums
        metrics = {f"val/{task}/greedy/accuracy": (sums[0] / sums[1].clamp(min=1)).item()}
        if sums[3] > 0:
            metrics[f"val/{task}/greedy/length_mean"] = (sums[2] / sums[3]).item()
        if self.trainer.sanity_checking:
            # Lightning drops metrics logged during the sanity check; the starting policy's score is the
            # first point of the learning curve, so write it to the loggers directly (step 0).
            if self.trainer.is_global_zero and self.trainer.global_step == 0:
                for logger in self.trainer.loggers:
                    logger.log_metrics(metrics, step=0)
            return
        # already pooled, the same on every rank: rank_zero_only makes sync_dist a no-op (no collective);
        # sync_dist=True only says so to Lightning, which otherwise warns that epoch metrics are unsynced
        for k, v in metrics.items():
            self.log(k, v, prog_bar=k.endswith("accuracy"), rank_zero_only=True, sync_dist=True)
        self.log("step", float(self.global_step), rank_zero_only=True, sync_dist=True)  # the x-axis (log_step_axis)

    test_step = validation_step
    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end

    # -- predict: the evaluation set's completions (callbacks.predictions writes them) ------------------
    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[dict[str, Any]]:
        """One record per evaluation completion, in the JSONL layout ``lit_rl score`` reads
        (:func:`lit_rl.score.prediction_record`), with the evaluation's correct / total."""
        from lit_rl.score import prediction_record

        ro = batch.rollouts
        n = len(ro) // max(len(batch.examples), 1)  # completions per prompt (prompt-major rows)
        total = ro.eval_total.tolist() if ro.eval_total is not None else [1.0] * len(ro)
        return [
            prediction_record(batch.examples[i // n], text, correct, t)
            for i, (text, correct, t) in enumerate(zip(ro.texts, ro.rewards.tolist(), total))
        ]
