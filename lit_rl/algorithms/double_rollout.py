"""Double-rollout GRPO for autoregressive policies (docs/double_rollout.md; Qian et al. 2026, "Double-Rollout
Reinforcement Learning with Sampling-based Reward Estimation", §2).

One training step consumes one rollout batch: ``G`` first-stage rollouts per prompt, produced by
:class:`datamodules.ar_rollouts.ARRolloutDataModule` at batch start (its generator holds the current
weights) and scored by the task verifier. In the shared pipeline (:mod:`lit_rl.algorithms.rl_module`) the
parts are ``processors: [DoubleRolloutEstimate]`` (:mod:`lit_rl.algorithms.dr_estimate`) and ``loss_fn:
ClippedPGLoss`` (:mod:`lit_rl.algorithms.losses`). Then::

    1. double-rollout reward estimation: the continuations are sampled and scored by the DataModule right after
       the first stage (the estimate's ``ContinuationStage``, :mod:`lit_rl.algorithms.dr_stage`), the rest is
       the processor's pure :func:`~lit_rl.algorithms.dr_estimate.estimate_from` (the math of
       :mod:`lit_rl.core.double_rollout`):
         T_i = thinking-trace tokens of y_i; keep t_i[:floor(ρ·T_i)]; N continuations from x ⊕ t_i[:cut]
         with max_new_tokens = ceil((1-ρ)·T_i) + buffer; r̂_i = mean_j R(x, t_i[:cut] ⊕ c_ij);
         A = GRPO group advantage of r̂; one-sided replacement (A_i > 0 and y_i wrong → t_i[:cut] ⊕ c_ij
         for a correct j); optional upward length bonus on {A_i > 0}, added after the baseline;
    2. loss mask: completion tokens (EOS included); completions that hit the generation limit are masked
       (DAPO overlong filtering, ``loss.mask_truncated``);
    3. π_old (and π_ref when ``kl_beta > 0``) log-probs of the final rows, once, before any update;
    4. μ optimizer updates (``updates_per_batch``) of the token-level clipped policy-gradient loss
       (:func:`lit_rl.core.pg.clipped_pg_loss`, ε_low / ε_high clip-higher, optional k3 KL);
    5. the next batch's generator syncs the updated weights before it samples (a no-op for the HF backend,
       which shares the policy's modules; vLLM loads them, LoRA merged).

``trainer.global_step`` counts optimizer updates (μ per rollout batch), as in the ERILS module.

Baselines from the same module: vanilla GRPO (``double_rollout.enabled: false``, or
``num_continuations: 1`` — the paper's N = 1 row of Table 3 *is* its vanilla GRPO run, AIME 2026 91.5% in
both tables, so N = 1 means "no second stage" here), and GRPO with a large rollout (``enabled: false`` with
``G·N`` first-stage rollouts per prompt, ``conf/grpo_large.yaml``). Data profiling (drop prompts with 0% or
100% pass rate under the initial policy) lives in the DataModule.

Paper details this implementation had to decide (the paper is silent or ambiguous):

* **Thinking trace.** The completion tokens before the FIRST occurrence of the delimiter token ids
  (``</think>`` for Qwen3 / Nemotron thinking models, the atomic ``</reasoning>`` for the tiny model;
  ``double_rollout.delimiter`` overrides the policy's ``think_end``). The completion's EOS and anything
  after it are never part of the trace. Matching is in token space.
* **Rollouts without a delimiter** (``double_rollout.missing``): ``"whole"`` (default) treats the whole
  completion as the trace, so every rollout of a group gets a continuation-based reward and truncated but
  on-track rollouts can earn credit; ``"skip"`` samples no continuations and keeps the verifier reward.
* **ρ cut rounding.** ``cut = floor(ρ·T)`` (never more than ρ·T kept, no one-token minimum; see
  :func:`~lit_rl.core.double_rollout.cut_index`), and the continuation budget is
  ``T - cut + buffer = ceil((1-ρ)·T) + buffer`` exactly. With ``double_rollout.cap_to_generation_limit``
  (default) the budget is also capped at ``max_new_tokens - cut`` so a replacement row (kept prefix +
  continuation) never exceeds the first-stage length limit — a replacement is then comparable to the
  rollouts it competes with, and the rollout tensors keep their width.
* **"Correct".** A rollout or continuation is correct when its verifier reward is at least
  ``double_rollout.correct_threshold`` (default: the task's ``correct_reward``: 1.0 for Sudoku and Countdown,
  whose 0.1 format credit is not "correct"; 2.0 for MATH, a correct answer whatever its format credit). Used by the
  one-sided replacement and the reliability metrics.
* **Continuation reward.** ``q_ij = R(x, t_i[:cut] ⊕ c_ij)``: the verifier scores the kept trace plus the
  continuation as one completion (a continuation cut by its budget is scored as it stands).
* **Replacement.** The replaced row is ``t_i[:cut] ⊕ c_ij`` (plus its EOS); it keeps the rollout's
  revised reward and advantage, is tagged ``Source.CONTINUATION``, and its π_old is recomputed with the
  current policy like every other row. Choice among correct continuations: ``"first"`` (default; i.i.d.
  samples, so distributed like a random one), ``"random"``, ``"shortest"``, or ``"off"``.
* **Length bonus L.** Tokens of the FINAL completion (after replacement), counted up to and including
  its EOS (``RolloutBatch.lengths``) — the sequence that is trained on; thinking and answer tokens both
  count. S = {A_i > 0} is taken from the advantages of the revised reward (before the bonus); z uses the
  population std over S (|S| = 1 or equal lengths: no bonus). The bonus is added to r̂ *after* the group
  baseline and std of r̂ are taken, A_i = (r̂_i + bonus_i − b_i)/σ_i: no row's advantage goes down, so a
  replaced row (which needed A > 0) never ends with A ≤ 0 and its correct continuation is never pushed
  down, whatever λ — the paper's "we do not apply any length-based downward revision" (DR §2).
  ``double_rollout.length_bonus_in_baseline: true`` recomputes the advantages from the bonus-revised
  rewards instead (the earlier rule; the bonus then raises the baseline of every row:
  :func:`~lit_rl.core.double_rollout.length_bonus`).
* **Length penalty (the Fig. 3 comparator).** ``double_rollout.length_penalty`` = α of Arora & Zanette
  (arXiv 2502.04463): correct rollouts' rewards times ``1 - α·σ(z)``, z the length z-score among the
  group's correct rollouts (population std), incorrect ones unchanged, on the verifier rewards; GRPO only
  (refused with the second stage on, where DR's own term is the bonus).
* **Tokens per problem** (``train/tokens_per_problem``): the mean number of completion tokens of one
  first-stage rollout (EOS included) — what the policy spends to answer a problem once, the x-axis of the
  paper's accuracy-efficiency frontier (measured there on AIME; ``val/.../length_mean`` is the same count
  on the eval set). The generation *cost* per prompt is logged separately: ``train/cost/tokens_stage1``
  (G rollouts) and ``train/cost/tokens_stage2`` (G·N continuations, generated tokens only).
* **π_old.** Log-probs of the final rows under the policy before the first update of the batch (with the
  HF backend these are the rollout-time log-probs up to float round-off; with vLLM they are recomputed by
  the trainer, as TRL and NeMo-RL do, so the sampler's numerics do not enter the ratio).
* **Zero-advantage rows** are left out of the loss (``skip_zero_advantage``, default on when
  ``kl_beta = 0``): they carry no policy gradient, and dropping them keeps the token-mean over informative
  tokens (DAPO's dynamic-sampling filter without resampling). A batch with no informative row still makes
  its μ zero-gradient updates (``train/uninformative_batches``), so ``max_steps`` always ends the run.
* **The GRPO baseline.** The paper (§4) says only that variants of GRPO (Dr. GRPO, DAPO, GSPO) "are already
  included in the baseline GRPO implementation used in Section 3 by NeMo-RL": "There have been several
  variants of GRPO that propose improvements on different aspects of the algorithm (Liu et al. 2025b; Yu et
  al. 2025; Zheng et al. 2025), some of which are already included in the baseline GRPO implementation used in
  Section 3 by NeMo-RL (Contributors 2025)." It does not say which, nor that the std division is off.
  NeMo-RL's GRPO configs (``examples/configs/grpo_math_1B.yaml``, the base of its Nemotron-3-Nano recipes)
  set ``normalize_rewards: true`` and ``use_leave_one_out_baseline: true``: the leave-one-out mean as the
  baseline, divided by the sample std of those same other rewards (+ 1e-6, rows where it is 0 left
  undivided; ``calculate_baseline_and_std_per_prompt`` and ``GRPOAdvantageEstimator``). The paper configs
  (``conf/paper/*``) use that rule: ``loss.scale_std: true``, ``leave_one_out: true``, ``std_of: baseline``,
  ``std_eps: 1e-6`` (:func:`lit_rl.core.advantages.group_centered`). The defaults, and the embedded and
  chain-sum configs, stay mean-centred only (``scale_std: false``, Dr. GRPO); ``scale_std: true`` with
  ``std_of: group`` is DeepSeekMath / TRL GRPO.

Metrics (``train/...``): first-stage reward (``train/on_policy/reward_mean``), original vs revised vs
final reward (``train/dr/reward_original|revised|final``), replaced rows (``train/dr/replaced``,
``replaced_frac``), per-rollout continuation reward spread (``train/dr/cont_reward_std``: std over the N
continuations of a rollout, averaged over rollouts; ``cont_mixed_frac``: rollouts whose continuations
disagree), the reliability study (``train/dr/cont_acc_given_correct|wrong``: continuation accuracy given
the original's correctness, DR Fig. 1-2), length-bonus stats (``train/dr/length_bonus_mean|max|frac``),
``train/tokens_per_problem``, and stage times (``time/stage1_s``, ``time/stage2_s``,
``time/stage2_over_stage1``).
"""

from __future__ import annotations

from typing import Sequence

from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from lit_rl.optim import grpo_adamw
from lit_rl.algorithms.dr_estimate import (  # noqa: F401  (re-exported: the estimate's public names)
    DoubleRolloutEstimate,
    DoubleRolloutSettings,
    Estimate,
    estimate_metrics,
    estimate_rewards,
)
from lit_rl.algorithms.losses import ClippedPGLoss, GRPOLossSettings, Loss
from lit_rl.algorithms.processors import GroupBaseline, Processor
from lit_rl.algorithms.rl_module import RLModule, warn_unused_sugar
from lit_rl.models.ar import CausalPolicy

__all__ = [
    "DoubleRolloutGRPO",
    "DoubleRolloutEstimate",
    "DoubleRolloutSettings",
    "Estimate",
    "GRPOLossSettings",
    "estimate_rewards",
]



class DoubleRolloutGRPO(RLModule):
    """Double-rollout GRPO (and vanilla / large-rollout GRPO) for a causal LM policy.

    The training step is :class:`~lit_rl.algorithms.rl_module.RLModule`'s; this class chooses the parts (the
    double-rollout estimate with the GRPO baseline of ``loss``, and the clipped policy gradient); the KL
    reference is the base class's (:meth:`RLModule.reference_policy`).

    Args:
        policy: the causal LM (``TinyCausalLM``, ``PretrainedCausalLM``).
        double_rollout: reward-estimation settings (ρ, N, buffer, delimiter, rules, length bonus).
        loss: GRPO advantage and loss settings (clip range, KL, aggregation, truncation mask).
        optimizer: optimizer factory (default AdamW lr 1e-6).
        scheduler: LR scheduler factory, stepped every optimizer update (default constant).
        updates_per_batch: μ, optimizer updates per rollout batch (π_old = the policy before the first).
        micro_batch_size: rows per forward/backward within one update (gradient accumulation); ``null``:
            all rows at once.
        grad_clip: max gradient norm; ``null`` disables clipping.
        max_consecutive_skips: stop after this many non-finite updates in a row.
        seed: seed of the continuation sampling.
        processors: a whole advantage chain instead of the double-rollout estimate.
        loss_fn: another loss instead of the clipped policy gradient of ``loss``.

    The generation backend (HF or vLLM) belongs to the DataModule (``data.init_args.backend``), which syncs
    the policy's weights into it before each batch's rollouts.
    """

    def __init__(
        self,
        policy: CausalPolicy,
        double_rollout: DoubleRolloutSettings | None = None,
        loss: GRPOLossSettings | None = None,
        optimizer: OptimizerCallable = grpo_adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 1,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 1.0,
        max_consecutive_skips: int = 10,
        seed: int = 0,
        processors: Sequence[Processor] | None = None,
        loss_fn: Loss | None = None,
    ) -> None:
        # double_rollout / loss are sugar for the parts: processors [DoubleRolloutEstimate(double_rollout, the
        # GRPO baseline of loss)], loss_fn ClippedPGLoss(loss)
        warn_unused_sugar("double_rollout", double_rollout, "processors", processors)
        if processors is not None and loss_fn is not None:
            warn_unused_sugar("loss", loss, "loss_fn", loss_fn)
        dr = double_rollout if double_rollout is not None else DoubleRolloutSettings()
        settings = loss if loss is not None else GRPOLossSettings()
        baseline = GroupBaseline(scale_std=settings.scale_std, leave_one_out=settings.leave_one_out,
                                 eps=settings.std_eps, std_of=settings.std_of)
        super().__init__(
            policy, optimizer=optimizer, scheduler=scheduler, updates_per_batch=updates_per_batch,
            micro_batch_size=micro_batch_size, grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips,
            seed=seed,
            processors=processors if processors is not None else [DoubleRolloutEstimate(dr, baseline, seed=seed)],
            loss_fn=loss_fn if loss_fn is not None else ClippedPGLoss(settings),
        )

    @property
    def dr(self) -> DoubleRolloutSettings | None:
        """The double-rollout settings of the processors' estimate (``None`` when no processor is one)."""
        return next((p.settings for p in self.processors if isinstance(p, DoubleRolloutEstimate)), None)

    # -- setup -----------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Refuses FSDP2 sharding (``ModelParallelStrategy``): the HF generation loop stops early per rank
        (ranks would run different numbers of collective forward passes and hang), the vLLM weight sync
        reads ``state_dict()`` of DTensors, and the KL reference is a deep copy of the policy. DDP works."""
        if self.device_mesh is not None:
            raise ValueError(
                "DoubleRolloutGRPO does not support FSDP2 sharding (trainer.strategy: ModelParallelStrategy): "
                "its generation loop ends per rank, which would hang the sharded forward passes; use "
                "trainer.strategy: ddp (or a LoRA / 4-bit policy to fit memory)"
            )

