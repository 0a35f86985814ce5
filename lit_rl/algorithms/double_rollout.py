"""Double-rollout GRPO for autoregressive policies (docs/double_rollout.md; Qian et al. 2026, "Double-Rollout
Reinforcement Learning with Sampling-based Reward Estimation", §2).

One training step consumes one rollout batch: ``G`` first-stage rollouts per prompt, produced by
:class:`datamodules.ar_rollouts.ARRolloutDataModule` at batch start and scored by the task verifier. Then::

    1. double-rollout reward estimation (:func:`estimate_rewards`, calling the pure math of
       :mod:`lit_rl.core.double_rollout`):
         T_i = thinking-trace tokens of y_i; keep t_i[:floor(ρ·T_i)]; N continuations from x ⊕ t_i[:cut]
         with max_new_tokens = ceil((1-ρ)·T_i) + buffer; r̂_i = mean_j R(x, t_i[:cut] ⊕ c_ij);
         A = GRPO group advantage of r̂; one-sided replacement (A_i > 0 and y_i wrong → t_i[:cut] ⊕ c_ij
         for a correct j); optional upward length bonus on {A_i > 0}, then A recomputed;
    2. loss mask: completion tokens (EOS included); completions that hit the generation limit are masked
       (DAPO overlong filtering, ``loss.mask_truncated``);
    3. π_old (and π_ref when ``kl_beta > 0``) log-probs of the final rows, once, before any update;
    4. μ optimizer updates (``updates_per_batch``) of the token-level clipped policy-gradient loss
       (:func:`lit_rl.core.pg.clipped_pg_loss`, ε_low / ε_high clip-higher, optional k3 KL);
    5. the updated weights are pushed to the generation backend (a no-op for the HF backend, which shares
       the policy's modules; vLLM loads them, LoRA merged).

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
  whose 0.1 format credit is not "correct"; 2.0 for MATH, a correct answer whatever its format credit). Used by the one-sided replacement and the reliability
  metrics.
* **Continuation reward.** ``q_ij = R(x, t_i[:cut] ⊕ c_ij)``: the verifier scores the kept trace plus the
  continuation as one completion (a continuation cut by its budget is scored as it stands).
* **Replacement.** The replaced row is ``t_i[:cut] ⊕ c_ij`` (plus its EOS); it keeps the rollout's
  revised reward and advantage, is tagged ``Source.CONTINUATION``, and its π_old is recomputed with the
  current policy like every other row. Choice among correct continuations: ``"first"`` (default; i.i.d.
  samples, so distributed like a random one), ``"random"``, ``"shortest"``, or ``"off"``.
* **Length bonus L.** Tokens of the FINAL completion (after replacement), counted up to and including
  its EOS (``RolloutBatch.lengths``) — the sequence that is trained on; thinking and answer tokens both
  count. S = {A_i > 0} is taken from the advantages of the revised reward (before the bonus); z uses the
  population std over S (|S| = 1 or equal lengths: no bonus); the bonus is added to r̂ and all the
  group's advantages are recomputed.
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
* **Std scaling.** GRPO advantages are mean-centred only by default (``loss.scale_std: false``, the paper's
  NeMo-RL baseline follows Dr. GRPO); set ``scale_std: true`` for DeepSeekMath GRPO.

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

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lit_rl.core.advantages import group_centered
from lit_rl import rng
from lit_rl.core.double_rollout import (
    continuation_budget,
    cut_index,
    length_bonus,
    length_penalty_az,
    one_sided_replacement,
    revised_rewards,
    split_thinking,
)
from lit_rl.core.pg import AGGREGATIONS, clipped_pg_loss, truncation_mask
from lit_rl.algorithms.advantages import frac_reward_zero_std
from lit_rl.core.entropy import masked_entropy_mean, token_entropy
from lit_rl.algorithms.rl_module import RLModule
from lit_rl.generation.ar import ARBackend, HFBackend
from lit_rl.models.ar import CausalPolicy, logprobs_of
from lit_rl.rollouts.types import PromptBatch, RolloutBatch, Source

__all__ = [
    "DoubleRolloutGRPO",
    "DoubleRolloutSettings",
    "Estimate",
    "GRPOLossSettings",
    "estimate_rewards",
]


@dataclass
class DoubleRolloutSettings:
    """Reward estimation of double-rollout GRPO (DR §2). ``enabled: false`` (or N = 1) is vanilla GRPO.

    Attributes:
        enabled: run the second rollout stage; ``false`` trains on the verifier rewards (vanilla GRPO).
        rho: fraction of the thinking trace kept, ρ ∈ (0, 1] (paper 0.9).
        num_continuations: N continuations per rollout (paper 8); 1 means no second stage (vanilla GRPO).
        buffer: extra continuation tokens beyond the removed part of the trace (paper: math 1024, code 4096).
        delimiter: text that closes the thinking trace; ``null`` uses the policy's ``think_end``.
        missing: rollouts without the delimiter: ``"whole"`` (whole completion is the trace) or ``"skip"``
            (keep the verifier reward).
        replacement: which correct continuation replaces a positive-advantage wrong rollout:
            ``"first"``, ``"random"``, ``"shortest"``, or ``"off"`` (no replacement).
        length_bonus: λ of the upward-only length bonus on positive-advantage rollouts (0: off; paper up
            to 3).
        length_bonus_unbiased_std: divide the length variance over S by |S|-1 instead of |S|.
        length_penalty: α of Arora & Zanette's penalty (``double_rollout_math.length_penalty_az``; 0: off;
            paper 0.05-0.4), the comparator of DR Fig. 3: each correct rollout's verifier reward times
            ``1 - α·σ(z)``, z its length's z-score among the group's correct rollouts. GRPO only (second
            stage off): DR's own length term is ``length_bonus``.
        correct_threshold: reward at or above which an answer counts as correct; ``null``: the task's
            ``correct_reward`` (MATH 2.0, others 1.0).
        cap_to_generation_limit: cap each continuation budget at ``max_new_tokens - cut``.
        temperature: continuation sampling temperature; ``null``: the first stage's.
        top_p: continuation nucleus mass; ``null``: the first stage's.
    """

    enabled: bool = True
    rho: float = 0.9
    num_continuations: int = 8
    buffer: int = 1024
    delimiter: str | None = None
    missing: Literal["whole", "skip"] = "whole"
    replacement: Literal["first", "random", "shortest", "off"] = "first"
    length_bonus: float = 0.0
    length_bonus_unbiased_std: bool = False
    length_penalty: float = 0.0
    correct_threshold: float | None = None
    cap_to_generation_limit: bool = True
    temperature: float | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.rho <= 1:
            raise ValueError(f"model.double_rollout.rho must be in (0, 1], got {self.rho}")
        if self.num_continuations < 1:
            raise ValueError(f"model.double_rollout.num_continuations must be >= 1, got {self.num_continuations}")
        if self.buffer < 0:
            raise ValueError(f"model.double_rollout.buffer must be >= 0, got {self.buffer}")
        if self.missing not in ("whole", "skip"):
            raise ValueError(f"model.double_rollout.missing must be 'whole' or 'skip', got {self.missing!r}")
        if self.replacement not in ("first", "random", "shortest", "off"):
            raise ValueError(
                f"model.double_rollout.replacement must be first|random|shortest|off, got {self.replacement!r}"
            )
        if self.length_bonus < 0:
            raise ValueError(f"model.double_rollout.length_bonus must be >= 0, got {self.length_bonus}")
        if not 0 <= self.length_penalty < 1:
            raise ValueError(f"model.double_rollout.length_penalty must be in [0, 1), got {self.length_penalty}")
        if self.length_penalty > 0 and self.length_bonus > 0:
            raise ValueError("model.double_rollout: set length_bonus or length_penalty, not both")
        if self.length_penalty > 0 and self.active:
            raise ValueError(
                "model.double_rollout.length_penalty is the GRPO comparator (DR Fig. 3) and needs the second stage "
                "off (enabled: false or num_continuations: 1); with double rollout use length_bonus"
            )

    @property
    def active(self) -> bool:
        """Whether the second stage runs (enabled and N >= 2)."""
        return self.enabled and self.num_continuations >= 2


@dataclass
class GRPOLossSettings:
    """GRPO advantages and the token-level clipped policy-gradient loss (:mod:`lit_rl.core.pg`).

    Attributes:
        eps_low: lower clip, ratio >= 1 - eps_low (PPO/DAPO 0.2).
        eps_high: upper clip, ratio <= 1 + eps_high (DAPO clip-higher 0.28; ``null``: eps_low).
        kl_beta: k3 KL coefficient to the reference policy (GRPO 0.04; DAPO / DR 0).
        reference: the KL reference: ``"auto"`` (the policy with its LoRA adapter disabled when it has
            one, else a frozen copy of the policy taken when training starts), ``"adapter"``, ``"copy"``.
        aggregation: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum-norm"``.
        mask_truncated: leave completions that hit the length limit out of the loss (DAPO overlong
            filtering); their rewards still enter the group baseline.
        scale_std: divide advantages by the group's reward std (DeepSeekMath GRPO); ``false``: Dr. GRPO.
        leave_one_out: RLOO baseline (mean of the group's other rewards).
        std_eps: added to the group std before dividing (``scale_std``; TRL's 1e-4).
        skip_zero_advantage: drop rows with advantage exactly 0 from the loss (only when ``kl_beta = 0``).
    """

    eps_low: float = 0.2
    eps_high: float | None = 0.28
    kl_beta: float = 0.0
    reference: Literal["auto", "adapter", "copy"] = "auto"
    aggregation: str = "token-mean"
    mask_truncated: bool = True
    scale_std: bool = False
    leave_one_out: bool = False
    std_eps: float = 1e-4
    skip_zero_advantage: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"model.loss.eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high is not None and self.eps_high < 0:
            raise ValueError(f"model.loss.eps_high must be >= 0 or null, got {self.eps_high}")
        if self.kl_beta < 0:
            raise ValueError(f"model.loss.kl_beta must be >= 0, got {self.kl_beta}")
        if self.reference not in ("auto", "adapter", "copy"):
            raise ValueError(f"model.loss.reference must be auto|adapter|copy, got {self.reference!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"model.loss.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")

    def advantages(self, rewards: Tensor, group: Tensor) -> Tensor:
        """GRPO group advantages ``(B,)`` of ``rewards (B,)`` under these settings."""
        return group_centered(rewards, group, scale_std=self.scale_std, leave_one_out=self.leave_one_out, eps=self.std_eps)


# -- double-rollout reward estimation -------------------------------------------------------------------
@dataclass
class Estimate:
    """Result of :func:`estimate_rewards` (all tensors aligned with the input rows, ``B`` of them).

    Attributes:
        rollouts: the rows to train on: replaced rows rebuilt (``Source.CONTINUATION``), ``rewards`` = the
            final reward (revised + length bonus) that made ``advantages``.
        advantages: ``(B,)`` final GRPO advantages.
        original: ``(B,)`` first-stage verifier rewards.
        revised: ``(B,)`` mean continuation reward (original where no continuations were sampled).
        cont_rewards: ``(B, N)`` continuation rewards (0 where none), ``N = 0`` when the stage is off.
        has_continuations: ``(B,)`` bool, continuations were sampled for the row.
        replaced: ``(B,)`` long, index of the continuation that replaced the row, or -1.
        bonus: ``(B,)`` length term added to the revised reward (the bonus, or the negative AZ penalty).
        stage2_tokens: continuation tokens generated (EOS included).
        stage2_seconds: wall time of the second stage (generation + scoring).
        correct: ``"original"`` ``(B,)`` and ``"continuations"`` ``(B, N)`` bool correctness (stage on).
        original_lengths: ``(B,)`` first-stage completion lengths (before any replacement).
        group: ``(B,)`` the rows' prompt index in the batch.
    """

    rollouts: RolloutBatch
    advantages: Tensor
    original: Tensor
    revised: Tensor
    cont_rewards: Tensor
    has_continuations: Tensor
    replaced: Tensor
    bonus: Tensor
    stage2_tokens: int = 0
    stage2_seconds: float = 0.0
    correct: dict[str, Tensor] = field(default_factory=dict)
    original_lengths: Tensor | None = None
    group: Tensor | None = None


def _body(row: Tensor, length: int, eos_id: int) -> list[int]:
    """Completion tokens of one row without its EOS (``length`` counts the EOS when there is one)."""
    toks = row[:length].tolist()
    return toks[:-1] if toks and toks[-1] == eos_id else toks


def _continuation(row: Tensor, budget: int, eos_id: int) -> tuple[list[int], bool]:
    """Tokens of one continuation row up to and including its first EOS within ``budget``; and whether it
    ended with an EOS (``False``: cut by the budget)."""
    toks = row[:budget].tolist()
    if eos_id in toks:
        return toks[: toks.index(eos_id) + 1], True
    return toks, False


def estimate_rewards(
    rollouts: RolloutBatch,
    backend: ARBackend,
    score: Callable[[Sequence[str], Sequence[int]], Sequence[float]],
    decode: Callable[[Tensor], list[str]],
    delimiter_ids: Sequence[int],
    eos_id: int,
    settings: DoubleRolloutSettings,
    advantages: Callable[[Tensor, Tensor], Tensor],
    correct_threshold: float,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Estimate:
    """Double-rollout reward estimation for one rollout batch (DR §2; steps in the module docstring).

    Args:
        rollouts: first-stage rows (left-padded prompt ⊕ EOS-filled completion), ``rewards`` = verifier.
        backend: generates the continuations (``continue_from``).
        score: ``score(texts, groups) -> rewards``, the task verifier for completions of prompt groups.
        decode: ids ``(R, W)`` (EOS-filled) → completion texts.
        delimiter_ids: token ids that close the thinking trace.
        eos_id: end-of-sequence id.
        settings: ρ, N, buffer, missing rule, replacement rule, length bonus, ...
        advantages: ``advantages(rewards (B,), group (B,)) -> (B,)``, the GRPO baseline.
        correct_threshold: reward at or above which an answer is correct.
        max_new_tokens: first-stage generation limit (caps the budgets, see the module docstring).
        temperature, top_p: continuation sampling (resolved by the caller).
        seed: seed of the continuation sampling and of the ``"random"`` replacement rule.

    Returns:
        an :class:`Estimate`. With the stage off (``not settings.active``) it is the plain GRPO
        estimate: revised = original, no replacement, no bonus.
    """
    device = rollouts.rewards.device
    B = len(rollouts)
    original = rollouts.rewards.float()  # (B,)
    group = rollouts.group  # (B,)
    none = torch.full((B,), -1, dtype=torch.long, device=device)
    if not settings.active:
        rewards = original
        if settings.length_penalty > 0:  # GRPO + Arora-Zanette, on the verifier rewards
            rewards = length_penalty_az(
                original, original >= correct_threshold, rollouts.lengths.float(), group, settings.length_penalty
            )
            rollouts.rewards = rewards.to(rollouts.rewards.dtype)
        adv = advantages(rewards, group)
        return Estimate(
            rollouts=rollouts, advantages=adv, original=original, revised=original.clone(),
            cont_rewards=original.new_zeros(B, 0), has_continuations=torch.zeros(B, dtype=torch.bool, device=device),
            replaced=none, bonus=rewards - original, original_lengths=rollouts.lengths.clone(), group=group,
        )
    t0 = time.perf_counter()
    N = settings.num_continuations
    P = rollouts.prompt_len
    comp = rollouts.completion_ids.cpu()  # (B, L)
    lengths = rollouts.lengths.cpu().tolist()
    prompt_rows = [ids[m.bool()].tolist() for ids, m in zip(rollouts.input_ids[:, :P].cpu(), rollouts.attention_mask[:, :P].cpu())]

    # 1. trace, cut and budget per rollout (token space)
    bodies = [_body(comp[i], lengths[i], eos_id) for i in range(B)]
    traces = [split_thinking(b, delimiter_ids, settings.missing) for b in bodies]  # T_i or None
    rows = [i for i in range(B) if traces[i] is not None]  # rollouts that get continuations
    cuts = {i: cut_index(traces[i], settings.rho) for i in rows}
    budgets = {}
    for i in rows:
        b = continuation_budget(traces[i], settings.rho, settings.buffer)
        if settings.cap_to_generation_limit:
            b = min(b, max_new_tokens - cuts[i])
        budgets[i] = max(1, b)

    # 2. N continuations of each prefix x ⊕ t_i[:cut], all prefixes in one backend call
    cont_rewards = torch.zeros(B, N, dtype=torch.float32)  # (B, N)
    cont_len = torch.zeros(B, N, dtype=torch.long)  # (B, N)
    cont_tokens: dict[tuple[int, int], tuple[list[int], bool]] = {}
    stage2_tokens = 0
    if rows:
        prefixes = [prompt_rows[i] + bodies[i][: cuts[i]] for i in rows]
        out = backend.continue_from(
            prefixes, n=N, max_new_tokens=[budgets[i] for i in rows], temperature=temperature, top_p=top_p, seed=seed
        )  # (R*N, W)
        texts_ids, groups = [], []
        for k, i in enumerate(rows):
            for j in range(N):
                toks, _ = cont_tokens.setdefault((i, j), _continuation(out[k * N + j], budgets[i], eos_id))
                cont_len[i, j] = len(toks)
                stage2_tokens += len(toks)
                texts_ids.append(bodies[i][: cuts[i]] + toks)
                groups.append(int(group[i]))
        # q_ij = R(x, t_i[:cut] ⊕ c_ij): decode kept trace + continuation as one completion
        width = max(len(t) for t in texts_ids) + 1
        padded = torch.full((len(texts_ids), width), eos_id, dtype=torch.long)
        for r, t in enumerate(texts_ids):
            padded[r, : len(t)] = torch.tensor(t, dtype=torch.long)
        q = score(decode(padded), groups)
        for r, (i, j) in enumerate((i, j) for i in rows for j in range(N)):
            cont_rewards[i, j] = float(q[r])
    has_cont = torch.zeros(B, dtype=torch.bool)
    has_cont[rows] = True
    cont_rewards, cont_len, has_cont = cont_rewards.to(device), cont_len.to(device), has_cont.to(device)

    # 3. revised reward r̂_i = mean_j q_ij, GRPO advantages of r̂
    revised = revised_rewards(cont_rewards, original=original, has_continuations=has_cont)  # (B,)
    adv = advantages(revised, group)  # (B,)

    # 4. one-sided replacement: A_i > 0, own answer wrong, some continuation correct
    own_correct = original >= correct_threshold  # (B,)
    cont_correct = (cont_rewards >= correct_threshold) & has_cont[:, None]  # (B, N)
    if settings.replacement == "off":
        replaced = none
    else:
        gen = rng.cpu_generator(rng.derive_seed(seed, 1))  # not the continuations' own stream
        replaced = one_sided_replacement(
            adv.cpu(), own_correct.cpu(), cont_correct.cpu(), rule=settings.replacement,
            cont_lengths=cont_len.cpu(), generator=gen,
        ).to(device)  # (B,)
    final = _rebuild(rollouts, replaced, bodies, cuts, budgets, cont_tokens, eos_id)

    # 5. optional upward length bonus on {A > 0}, lengths of the final rows; then advantages again
    rewards = revised
    bonus = torch.zeros_like(revised)
    if settings.length_bonus > 0:
        rewards = length_bonus(
            revised, adv, final.lengths.float(), group, settings.length_bonus,
            unbiased_std=settings.length_bonus_unbiased_std,
        )
        bonus = rewards - revised
        adv = advantages(rewards, group)
    final.rewards = rewards.to(final.rewards.dtype)
    correct = {"original": own_correct, "continuations": cont_correct}
    return Estimate(
        rollouts=final, advantages=adv, original=original, revised=revised, cont_rewards=cont_rewards,
        has_continuations=has_cont, replaced=replaced, bonus=bonus, stage2_tokens=stage2_tokens,
        stage2_seconds=time.perf_counter() - t0, correct=correct, original_lengths=rollouts.lengths.clone(), group=group,
    )


def _rebuild(
    ro: RolloutBatch,
    replaced: Tensor,
    bodies: list[list[int]],
    cuts: dict[int, int],
    budgets: dict[int, int],
    cont_tokens: dict[tuple[int, int], tuple[list[int], bool]],
    eos_id: int,
) -> RolloutBatch:
    """The rollout batch with each replaced row i set to ``t_i[:cut] ⊕ c_ij`` (source CONTINUATION)."""
    idx = [i for i, j in enumerate(replaced.tolist()) if j >= 0]
    if not idx:
        return RolloutBatch(**{k: getattr(ro, k) for k in ro.__dataclass_fields__})
    new_rows = {}
    for i in idx:
        toks, ended = cont_tokens[(i, int(replaced[i]))]
        new_rows[i] = (bodies[i][: cuts[i]] + toks, ended)
    comp = ro.completion_ids  # (B, L)
    L = max(comp.shape[1], max(len(t) for t, _ in new_rows.values()))
    device = comp.device
    if L > comp.shape[1]:
        comp = torch.cat([comp, comp.new_full((comp.shape[0], L - comp.shape[1]), eos_id)], 1)  # (B, L')
    comp = comp.clone()
    lengths, hit, source = ro.lengths.clone(), ro.hit_limit.clone(), ro.source.clone()
    texts = list(ro.texts)
    for i, (toks, ended) in new_rows.items():
        comp[i] = eos_id
        comp[i, : len(toks)] = torch.tensor(toks, dtype=torch.long, device=device)
        lengths[i] = len(toks)
        hit[i] = not ended
        source[i] = int(Source.CONTINUATION)
        texts[i] = ""  # filled by the caller's decode if wanted; see DoubleRolloutGRPO
    P = ro.prompt_len
    input_ids = torch.cat([ro.input_ids[:, :P], comp], 1)  # (B, P+L')
    attention_mask = torch.cat([ro.attention_mask[:, :P], torch.ones_like(comp)], 1)  # (B, P+L')
    completion_mask = torch.arange(L, device=device)[None, :] < lengths[:, None]  # (B, L')
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, prompt_len=P, completion_mask=completion_mask,
        lengths=lengths, rewards=ro.rewards.clone(), source=source, group=ro.group, texts=texts,
        prompt_ids=list(ro.prompt_ids), hit_limit=hit, old_logp=None, eval_total=ro.eval_total, row=ro.row,
    )


# -- the LightningModule --------------------------------------------------------------------------------
def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0)


BackendFactory = Callable[[nn.Module], ARBackend]


class DoubleRolloutGRPO(RLModule):
    """Double-rollout GRPO (and vanilla / large-rollout GRPO) for a causal LM policy.

    Args:
        policy: the causal LM (``TinyCausalLM``, ``PretrainedCausalLM``).
        backend: generation backend, or a factory called with the policy (YAML: ``class_path`` of
            ``HFBackend`` with its other init args); ``null``: ``HFBackend(policy)``.
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
    """

    def __init__(
        self,
        policy: CausalPolicy,
        backend: ARBackend | BackendFactory | None = None,
        double_rollout: DoubleRolloutSettings | None = None,
        loss: GRPOLossSettings | None = None,
        optimizer: OptimizerCallable = _adamw,
        scheduler: LRSchedulerCallable | None = None,
        updates_per_batch: int = 1,
        micro_batch_size: int | None = None,
        grad_clip: float | None = 1.0,
        max_consecutive_skips: int = 10,
        seed: int = 0,
    ) -> None:
        super().__init__(
            policy, optimizer=optimizer, scheduler=scheduler, updates_per_batch=updates_per_batch,
            micro_batch_size=micro_batch_size, grad_clip=grad_clip, max_consecutive_skips=max_consecutive_skips,
            seed=seed,
        )
        if backend is None:
            backend = HFBackend(policy)
        elif not isinstance(backend, ARBackend):
            backend = backend(policy)
        self.backend: ARBackend = backend
        self.dr = double_rollout if double_rollout is not None else DoubleRolloutSettings()
        self.loss_settings = loss if loss is not None else GRPOLossSettings()
        self.reference: nn.Module | None = None  # frozen copy, built when training starts (KL only)
        self.uninformative_batches = 0
        self.last_advantages: Tensor | None = None
        self.last_estimate: Estimate | None = None

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

    def _reference_mode(self) -> str:
        mode = self.loss_settings.reference
        if mode == "auto":
            mode = "adapter" if hasattr(self.policy.model, "disable_adapter") else "copy"
        if mode == "adapter" and not hasattr(self.policy.model, "disable_adapter"):
            raise ValueError("model.loss.reference='adapter' needs a LoRA policy (policy.lora)")
        return mode

    def _make_reference(self) -> None:
        ref = copy.deepcopy(self.policy)
        for p in ref.parameters():
            p.requires_grad_(False)
        self.reference = ref.eval()

    def on_train_start(self) -> None:
        # after warm-up callbacks (on_fit_start): the reference is the policy RL starts from
        if self.loss_settings.kl_beta > 0 and self._reference_mode() == "copy" and self.reference is None:
            self._make_reference()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # a resumed run restores the reference saved with the checkpoint (strict loading needs the module)
        if self.reference is None and any(k.startswith("reference.") for k in checkpoint.get("state_dict", {})):
            self._make_reference()
        super().on_load_checkpoint(checkpoint)

    # -- training --------------------------------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> Tensor:
        # 1. first-stage rollouts: G per prompt, generated and scored by the DataModule at batch start
        ro: RolloutBatch | None = batch.rollouts
        if ro is None:
            raise RuntimeError("training batch has no rollouts: use datamodules.ar_rollouts.ARRolloutDataModule")
        # 2. double-rollout reward estimation -> revised rewards, replaced rows, advantages
        est = self.estimate(ro, batch)
        self._log_estimate(est, batch, first_stage=ro)
        ro, adv = est.rollouts, est.advantages  # (B,) rows, (B,)
        self.last_estimate = est
        self.last_advantages, self.last_advantages_keep = adv.detach(), torch.ones_like(adv, dtype=torch.bool)
        batch.rollouts = ro  # callbacks (RolloutTracker) see the rows that are trained on
        # 3. loss mask: completion tokens; truncated completions out (DAPO overlong filtering)
        mask = truncation_mask(ro.completion_ids, ro.completion_mask, self.policy.eos_id, self.loss_settings.mask_truncated)
        keep = mask.any(dim=1)  # (B,)
        if self.loss_settings.skip_zero_advantage and self.loss_settings.kl_beta == 0:
            informative = keep & (adv != 0)
            if bool(informative.any()):
                keep = informative
            else:
                # nothing to learn from: still make the μ (zero-gradient) updates, so that
                # trainer.global_step advances and max_steps ends the run
                self.uninformative_batches += 1
        if not bool(keep.any()):
            keep = torch.ones_like(keep)  # every row truncated: the mask zeroes the loss anyway
        # logged every batch (not only when it grows): an on_step value logged once is re-emitted by Lightning
        # at later steps of that process only, so a resumed run's metric stream would differ
        self.log("train/uninformative_batches", float(self.uninformative_batches), on_step=True, batch_size=1)
        self.log("train/rows_trained", keep.float().sum(), on_step=True, batch_size=1)
        ro, adv, mask = ro.select(keep), adv[keep], mask[keep]  # (B',...)
        # 4. π_old (and π_ref) log-probs of the rows, before any update
        old_logp, ref_logp = self._fixed_logprobs(ro, mask)  # (B', L), (B', L) | None
        # 5. μ optimizer updates on this rollout batch
        loss = torch.zeros((), device=self.device)
        for _ in range(self.updates_per_batch):
            loss = self._update(ro, adv, mask, old_logp, ref_logp)
        # 6. the next rollouts come from the updated weights
        self.backend.push_weights(self.policy)
        self.log_step_axis(batch)
        return loss

    def estimate(self, ro: RolloutBatch, batch: PromptBatch) -> Estimate:
        """Run :func:`estimate_rewards` with this module's settings and the DataModule's task."""
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        task = getattr(dm, "task", None)
        gen = getattr(dm, "generation", None)
        examples = batch.examples
        threshold = self._threshold()

        def score(texts: Sequence[str], groups: Sequence[int]) -> list[float]:  # one reward call per batch
            return task.total_rewards(texts, [examples[g] for g in groups]).totals

        delim = self.dr.delimiter if self.dr.delimiter is not None else self.policy.think_end
        delim_ids = list(self.policy.tokenizer(delim, add_special_tokens=False)["input_ids"])
        est = estimate_rewards(
            ro,
            self.backend,
            score,
            self.policy.decode_completions,
            delim_ids,
            self.policy.eos_id,
            self.dr,
            self.loss_settings.advantages,
            correct_threshold=threshold,
            max_new_tokens=int(getattr(gen, "max_new_tokens", ro.completion_ids.shape[1])),
            temperature=self.dr.temperature if self.dr.temperature is not None else float(getattr(gen, "temperature", 1.0)),
            top_p=self.dr.top_p if self.dr.top_p is not None else float(getattr(gen, "top_p", 1.0)),
            seed=rng.seed_for(self.seed, rng.Stream.CONTINUATION, rank=self.global_rank, step=batch.step),
        )
        replaced = (est.replaced >= 0).nonzero().squeeze(-1).tolist()
        if replaced:  # texts of the replaced rows, for sample tables
            texts = self.policy.decode_completions(est.rollouts.completion_ids[replaced])
            for i, t in zip(replaced, texts):
                est.rollouts.texts[i] = t
        return est

    def _threshold(self) -> float:
        """Reward at or above which an answer is correct (setting, else the task's ``correct_reward``)."""
        if self.dr.correct_threshold is not None:
            return float(self.dr.correct_threshold)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        return float(getattr(getattr(dm, "task", None), "correct_reward", 1.0))

    @torch.no_grad()
    def _fixed_logprobs(self, ro: RolloutBatch, mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """π_old log-probs ``(B, L)`` and, when ``kl_beta > 0``, π_ref log-probs, in micro-batches; logs
        ``train/entropy``, π_old's mean token entropy over ``mask`` (TRL's ``entropy``), from the same logits."""
        size = self.micro_batch_size or len(ro)
        was_training = self.policy.training
        self.policy.eval()
        olds, refs, ents = [], [], []
        try:
            for mb in ro.micro_batches(size):
                logits = self.policy.completion_logits(mb.input_ids, mb.attention_mask, mb.prompt_len)  # (b, L, V)
                olds.append(logprobs_of(logits, mb.completion_ids))
                ents.append(token_entropy(logits))  # (b, L)
                del logits
                if self.loss_settings.kl_beta > 0:
                    refs.append(self._ref_logprobs(mb))
        finally:
            self.policy.train(was_training)
        if mask is not None:
            self.log("train/entropy", masked_entropy_mean(torch.cat(ents), mask), on_step=True, batch_size=1)
        return torch.cat(olds), (torch.cat(refs) if refs else None)

    def _ref_logprobs(self, mb: RolloutBatch) -> Tensor:
        if self._reference_mode() == "adapter":
            with self.policy.model.disable_adapter():
                return self.policy.token_logprobs(mb.input_ids, mb.attention_mask, mb.prompt_len)
        if self.reference is None:
            self._make_reference()
        return self.reference.to(self.device).token_logprobs(mb.input_ids, mb.attention_mask, mb.prompt_len)

    def _mb_weight(self, mask: Tensor, mb_mask: Tensor) -> float:
        """Share of the batch's aggregation denominator held by one micro-batch (so the micro-batch losses
        sum to the full-batch loss)."""
        agg = self.loss_settings.aggregation
        if agg == "token-mean":
            return float(mb_mask.sum()) / max(float(mask.sum()), 1.0)
        if agg == "seq-mean-token-mean":
            return float(mb_mask.any(1).sum()) / max(float(mask.any(1).sum()), 1.0)
        return mb_mask.shape[0] / max(mask.shape[0], 1)

    def _update(self, ro: RolloutBatch, adv: Tensor, mask: Tensor, old_logp: Tensor, ref_logp: Tensor | None) -> Tensor:
        """One optimizer update of the clipped PG loss (guard/clip/step in ``optimizer_update``)."""
        return self.optimizer_update(lambda: self.accumulate_gradients(ro, adv, mask, old_logp, ref_logp), "train/grpo")

    def accumulate_gradients(
        self, ro: RolloutBatch, adv: Tensor, mask: Tensor, old_logp: Tensor, ref_logp: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Backward of the clipped PG loss over micro-batches of ``micro_batch_size`` rows.

        Each micro-batch's loss is weighted by its share of the aggregation's denominator
        (:meth:`_mb_weight`), so the accumulated gradient equals the full batch's for every aggregation
        (tested). Returns ``(loss, stats of the last micro-batch)``.
        """
        s = self.loss_settings
        size = self.micro_batch_size or len(ro)
        loss_sum = torch.zeros((), device=self.device)
        stats: dict[str, Tensor] = {}
        for start in range(0, len(ro), size):
            sl = slice(start, start + size)
            logp = self.policy.token_logprobs(ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len)  # (b, L)
            loss, stats = clipped_pg_loss(
                logp, old_logp[sl], adv[sl], mask[sl], eps_low=s.eps_low, eps_high=s.eps_high,
                ref_logp=None if ref_logp is None else ref_logp[sl], kl_beta=s.kl_beta, aggregation=s.aggregation,
            )
            loss = loss * self._mb_weight(mask, mask[sl])
            self.manual_backward(loss)
            loss_sum = loss_sum + loss.detach()
        return loss_sum, stats

    # -- metrics ---------------------------------------------------------------------------------------
    def _log_estimate(self, est: Estimate, batch: PromptBatch, first_stage: RolloutBatch) -> None:
        """Once per rollout batch: first-stage and revised rewards, replacements, spread, bonus, cost."""
        bs = len(batch.examples)
        ro = est.rollouts
        m: dict[str, float] = {
            "train/on_policy/reward_mean": float(est.original.mean()),
            "train/on_policy/reward_std": float(est.original.std(unbiased=False)),
            "train/on_policy/accuracy": float((est.original >= self._threshold()).float().mean()),
            "train/on_policy/frac_reward_zero_std": frac_reward_zero_std(est.original, first_stage.group),
            "train/on_policy/length_mean": float(first_stage.lengths.float().mean()),
            "train/on_policy/hit_limit_frac": float(first_stage.hit_limit.float().mean()),
            "train/advantage_mean": float(est.advantages.mean()),
            "train/advantage_std": float(est.advantages.std(unbiased=False)),
            "train/advantage_nonzero_frac": float((est.advantages != 0).float().mean()),
        }
        dm = getattr(self.trainer, "datamodule", None)
        dm_stats = dict(getattr(dm, "last_stats", None) or {})
        m.update(dm_stats)
        m["train/dr/reward_original"] = float(est.original.mean())
        m["train/dr/reward_revised"] = float(est.revised.mean())
        m["train/dr/reward_final"] = float(ro.rewards.float().mean())
        if self.dr.active:
            has = est.has_continuations
            n_rep = int((est.replaced >= 0).sum())
            m["train/dr/replaced"] = float(n_rep)
            m["train/dr/replaced_frac"] = n_rep / max(len(ro), 1)
            m["train/dr/with_continuations_frac"] = float(has.float().mean())
            if has.any():
                cr = est.cont_rewards[has]  # (R, N)
                m["train/dr/cont_reward_std"] = float(cr.std(dim=1, unbiased=False).mean())
                cc = est.correct["continuations"][has].float()  # (R, N)
                m["train/dr/cont_mixed_frac"] = float(((cc.mean(1) > 0) & (cc.mean(1) < 1)).float().mean())
                oc = est.correct["original"][has]
                if oc.any():
                    m["train/dr/cont_acc_given_correct"] = float(cc[oc].mean())
                if (~oc).any():
                    m["train/dr/cont_acc_given_wrong"] = float(cc[~oc].mean())
            m["train/cost/tokens_stage2"] = est.stage2_tokens / max(bs, 1)
            m["time/stage2_s"] = est.stage2_seconds
            t1 = dm_stats.get("time/stage1_s")
            if t1:
                m["time/stage2_over_stage1"] = est.stage2_seconds / t1
        if self.dr.length_bonus > 0:
            got = est.bonus > 0  # (B,) rows whose reward was revised upward
            m["train/dr/length_bonus_mean"] = float(est.bonus[got].mean()) if got.any() else 0.0
            m["train/dr/length_bonus_max"] = float(est.bonus.max())
            m["train/dr/length_bonus_frac"] = float(got.float().mean())
        m["train/length_mean"] = float(ro.lengths.float().mean())
        for k, v in m.items():
            if not math.isnan(v):
                self.log(k, v, on_step=True, batch_size=bs, prog_bar=k == "train/on_policy/reward_mean")
