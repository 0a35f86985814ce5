"""Double-rollout reward estimation as a processor (docs/double_rollout.md; Qian et al. 2026,
"Double-Rollout Reinforcement Learning with Sampling-based Reward Estimation", §2).

The second stage's generation and scoring run in the data stage (:mod:`lit_rl.algorithms.dr_stage`:
:class:`~lit_rl.algorithms.dr_stage.DoubleRolloutSettings`, the continuations, the stage the DataModule runs);
what is here is a pure function of the batch:

* :func:`estimate_from`: rows + their :class:`~lit_rl.batch.Continuations` -> :class:`Estimate` (revised rewards,
  GRPO advantages, one-sided replacement, length terms), calling the pure math of :mod:`lit_rl.core.double_rollout`;
  :func:`estimate_rewards` chains both halves in one call (tests, scripts);
* :class:`DoubleRolloutEstimate`: the processor that applies it to the batch's rows (and declares the
  :class:`~lit_rl.algorithms.dr_stage.ContinuationStage` the DataModule runs), and :func:`estimate_metrics`
  (``train/dr/*``, ``train/on_policy/*``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.algorithms.processors import GroupBaseline, Processor
from lit_rl.core.advantages import frac_reward_zero_std
from lit_rl.core.double_rollout import (
    length_bonus,
    length_penalty_az,
    one_sided_replacement,
    revised_rewards,
)
from lit_rl.algorithms.dr_stage import ContinuationStage, DoubleRolloutSettings, sample_continuations
from lit_rl.errors import FieldError
from lit_rl.batch import Continuations, PromptBatch, RolloutBatch, Source

__all__ = ["DoubleRolloutEstimate", "DoubleRolloutSettings", "Estimate", "estimate_metrics", "estimate_rewards"]


# -- double-rollout reward estimation -------------------------------------------------------------------
@dataclass
class Estimate:
    """Result of :func:`estimate_rewards` (all tensors aligned with the input rows, ``B`` of them).

    Attributes:
        rollouts: the rows to train on: replaced rows rebuilt (``Source.CONTINUATION``), ``rewards`` = the
            final reward (revised + length bonus); ``advantages`` are the revised rewards' with the bonus
            added after the baseline (``length_bonus_in_baseline``: recomputed from the final reward).
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


def estimate_from(
    rollouts: RolloutBatch,
    conts: Continuations | None,
    eos_id: int,
    settings: DoubleRolloutSettings,
    advantages: Callable[..., Tensor],
    correct_threshold: float,
    seed: int = 0,
) -> Estimate:
    """Double rollout's reward estimate from the second stage's output (DR §2, steps 3-5), a pure function of
    the rows and their :class:`~lit_rl.batch.Continuations`: revised rewards, GRPO advantages, one-sided
    replacement, the optional length bonus.

    Args:
        rollouts: first-stage rows, ``rewards`` = verifier.
        conts: :func:`sample_continuations` of the same rows (``None`` when the stage is off).
        eos_id: end-of-sequence id.
        settings: replacement rule, length terms.
        advantages: ``advantages(rewards (B,), group (B,), bonus=None) -> (B,)``, the GRPO baseline
            (:class:`~lit_rl.algorithms.processors.GroupBaseline`, :func:`~lit_rl.core.advantages.group_centered`);
            ``bonus (B,)`` is added after the baseline is taken (the length bonus, ``length_bonus_in_baseline``
            off).
        correct_threshold: reward at or above which an answer is correct.
        seed: seed of the ``"random"`` replacement rule (the continuations' own seed: a derived stream is used).

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
    if conts is None or conts.rewards.shape[0] != B:
        raise RuntimeError(f"double rollout: the batch has no continuations for its {B} rows; the DataModule runs "
                           "the module's continuation stage (RLModule.rollout_stages) after the first stage")
    if not torch.equal(conts.row.to(rollouts.row.device), rollouts.row):
        raise RuntimeError("double rollout: the continuations belong to other rows (a processor before "
                           "DoubleRolloutEstimate reordered or filtered the batch); put the estimate first")
    t0 = time.perf_counter()
    cont_rewards, cont_len, has_cont = conts.rewards, conts.lengths, conts.continued

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
    final = _rebuild(rollouts, replaced, conts.bodies, conts.cuts, conts.budgets, conts.tokens, eos_id)

    # 5. optional upward length bonus on S = {A > 0}, lengths of the final rows; then the final advantages:
    #    the bonus on top of the revised rewards' baseline (default: S keeps A > 0, replaced rows included),
    #    or (length_bonus_in_baseline) recomputed from the bonus-revised rewards
    rewards = revised
    bonus = torch.zeros_like(revised)
    if settings.length_bonus > 0:
        rewards = length_bonus(
            revised, adv, final.lengths.float(), group, settings.length_bonus,
            unbiased_std=settings.length_bonus_unbiased_std,
        )
        bonus = rewards - revised  # (B,) >= 0, > 0 only on S
        if settings.length_bonus_in_baseline:
            adv = advantages(rewards, group)
        else:
            adv = advantages(revised, group, bonus=bonus)
    final.rewards = rewards.to(final.rewards.dtype)
    correct = {"original": own_correct, "continuations": cont_correct}
    return Estimate(
        rollouts=final, advantages=adv, original=original, revised=revised, cont_rewards=cont_rewards,
        has_continuations=has_cont, replaced=replaced, bonus=bonus, stage2_tokens=conts.tokens_generated,
        stage2_seconds=conts.seconds + time.perf_counter() - t0, correct=correct,
        original_lengths=rollouts.lengths.clone(), group=group,
    )


def estimate_rewards(
    rollouts: RolloutBatch,
    backend: Any,
    score: Callable[[Sequence[str], Sequence[int]], Sequence[float]],
    decode: Callable[[Tensor], list[str]],
    delimiter_ids: Sequence[int],
    eos_id: int,
    settings: DoubleRolloutSettings,
    advantages: Callable[..., Tensor],
    correct_threshold: float,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Estimate:
    """The whole double-rollout estimate in one call: :func:`sample_continuations` (when the stage is on), then
    :func:`estimate_from` (arguments as theirs). The training pipeline runs the two halves in their own stages
    (the DataModule, then the processor)."""
    conts = None
    if settings.active:
        conts = sample_continuations(rollouts, backend, score, decode, delimiter_ids, eos_id, settings,
                                     max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    return estimate_from(rollouts, conts, eos_id, settings, advantages, correct_threshold, seed=seed)


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
    comp_width = comp.shape[1]
    L = max(comp_width, max(len(t) for t, _ in new_rows.values()))
    device = comp.device
    if L > comp.shape[1]:
        comp = torch.cat([comp, comp.new_full((comp.shape[0], L - comp.shape[1]), eos_id)], 1)  # (B, L')
    comp = comp.clone()
    lengths, hit, source, kept = ro.lengths.clone(), ro.hit_limit.clone(), ro.source.clone(), ro.kept_prefix.clone()
    texts = list(ro.texts)
    for i, (toks, ended) in new_rows.items():
        comp[i] = eos_id
        comp[i, : len(toks)] = torch.tensor(toks, dtype=torch.long, device=device)
        lengths[i] = len(toks)
        hit[i] = not ended
        source[i] = int(Source.CONTINUATION)
        kept[i] = cuts[i]
        texts[i] = ""  # filled by the caller's decode if wanted; see DoubleRolloutGRPO
    P = ro.prompt_len
    input_ids = torch.cat([ro.input_ids[:, :P], comp], 1)  # (B, P+L')
    attention_mask = torch.cat([ro.attention_mask[:, :P], torch.ones_like(comp)], 1)  # (B, P+L')
    completion_mask = torch.arange(L, device=device)[None, :] < lengths[:, None]  # (B, L')
    hint = torch.zeros(comp.shape, dtype=torch.bool, device=device)  # (B, L') hints survive on rows kept as they were
    hint[:, :comp_width] = ro.hint_mask
    hint[idx] = False
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, prompt_len=P, completion_mask=completion_mask,
        lengths=lengths, rewards=ro.rewards.clone(), source=source, group=ro.group, texts=texts,
        prompt_ids=list(ro.prompt_ids), hit_limit=hit, eval_total=ro.eval_total, row=ro.row,
        gen_width=None if L > comp_width else ro.gen_width,  # a dLLM row keeps its canvas width
        kept_prefix=kept, hint_mask=hint,
    )


class DoubleRolloutEstimate(Processor):
    """Double rollout's reward estimation as a processor (:func:`estimate_from`), a pure function of the batch:
    the continuations were sampled and scored by its ``stage`` (a
    :class:`~lit_rl.algorithms.dr_stage.ContinuationStage`, run by the DataModule after the first stage with the
    engine that sampled it) and arrive in ``batch.continuations``; the rows to train on (replacements rebuilt,
    ``Source.CONTINUATION``) carry the GRPO advantages of the revised rewards. The :class:`Estimate` goes to
    ``batch.diagnostics["double_rollout"]`` and its metrics (:func:`estimate_metrics`) to ``batch.stats``.
    With the stage off (``enabled: false`` or N = 1) this is plain GRPO (plus the Arora-Zanette penalty when
    set).

    Args:
        settings: ρ, N, buffer, delimiter, rules, length terms.
        baseline: the group baseline of the revised rewards (default: mean-centring only, no std division;
            :class:`~lit_rl.algorithms.double_rollout.DoubleRolloutGRPO` builds it from its ``loss`` settings).
        seed: seed of the continuation sampling (``seed_for(seed, CONTINUATION, rank, step)``) and of the
            ``"random"`` replacement rule.
        rows: which rows the estimate revises: ``"all"`` (default; double rollout's own groups) or
            ``"on_policy"`` (the ``ON_POLICY`` rows only, each group's on-policy rows as the estimate's group:
            for ERILS's mixed groups, where pool rows are another model's text that the policy must not
            continue). With ``"on_policy"`` the other rows keep their rewards and get advantage 0, so an
            advantage processor must follow (e.g. ``SourceSpecific``: Eq. 9 on the revised rewards). The
            rebuilt rows must keep the batch's width (a dLLM's canvas does; an AR continuation that widens
            the batch raises in ``RolloutBatch.scatter``), and the logged ``train/advantage_*`` are the
            estimate's own on-policy advantages, before the following processor.
    """

    fsdp2_unsupported = ("ranks continue different numbers of rows from different cuts (a dLLM skips the "
                         "complete blocks before each cut; an AR loop ends per rank), so the sharded forward "
                         "passes would not line up and would hang")

    @staticmethod
    def check_args(rows: str = "all") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`);
        the settings' rules are :class:`DoubleRolloutSettings`' own."""
        if rows not in ("all", "on_policy"):
            raise FieldError("rows", f"must be 'all' or 'on_policy', got {rows!r}")

    def __init__(self, settings: DoubleRolloutSettings | None = None, baseline: GroupBaseline | None = None,
                 seed: int = 0, rows: str = "all") -> None:
        DoubleRolloutEstimate.check_args(rows=rows)
        self.rows = rows
        self.settings = settings if settings is not None else DoubleRolloutSettings()
        self.baseline = baseline if baseline is not None else GroupBaseline()
        self.seed = seed
        self.policy: Any = None

    @property
    def stage(self) -> ContinuationStage | None:  # type: ignore[override]
        """The second stage the DataModule runs before this processor (``None`` when the stage is off: no engine
        is built, nothing generated)."""
        return ContinuationStage(self.settings, seed=self.seed, rows=self.rows) if self.settings.active else None

    def bind(self, policy: torch.nn.Module) -> None:
        self.policy = policy

    def threshold(self, task: Any) -> float:
        """Reward at or above which an answer is correct (setting, else the task's ``correct_reward``)."""
        if self.settings.correct_threshold is not None:
            return float(self.settings.correct_threshold)
        return float(getattr(task, "correct_reward", 1.0))

    def process(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        if self.rows == "all":
            return self._estimate(rollouts, batch)
        mine = rollouts.source == int(Source.ON_POLICY)  # (B,)
        est = self._estimate(rollouts.select(mine), batch)
        adv = torch.zeros(len(rollouts), dtype=est.advantages.dtype, device=est.advantages.device)
        adv[mine.to(adv.device)] = est.advantages
        return rollouts.scatter(mine, est).with_advantages(adv)

    def _estimate(self, rollouts: RolloutBatch, batch: PromptBatch) -> RolloutBatch:
        if self.policy is None:
            raise RuntimeError("DoubleRolloutEstimate.bind(policy) was not called (the module binds its processors)")
        s = self.settings
        threshold = self.threshold(batch.task)
        est = estimate_from(
            rollouts, batch.continuations if s.active else None, self.policy.eos_id, s, self.baseline,
            correct_threshold=threshold,
            seed=rng.seed_for(self.seed, rng.Stream.CONTINUATION, rank=batch.rank, step=batch.step),
        )
        replaced = (est.replaced >= 0).nonzero().squeeze(-1).tolist()
        if replaced:  # texts of the replaced rows, for sample tables
            texts = self.policy.decode_completions(est.rollouts.completion_ids[replaced])
            for i, t in zip(replaced, texts):
                est.rollouts.texts[i] = t
        batch.diagnostics["double_rollout"] = est
        batch.stats.update(estimate_metrics(est, rollouts, batch, threshold, s))
        return est.rollouts.with_advantages(est.advantages)

    def __repr__(self) -> str:
        return (f"DoubleRolloutEstimate({self.settings}, baseline={self.baseline!r}, seed={self.seed}, "
                f"rows={self.rows!r})")


def estimate_metrics(est: Estimate, first_stage: RolloutBatch, batch: PromptBatch, threshold: float,
                     settings: DoubleRolloutSettings) -> dict[str, float]:
    """Once per rollout batch: first-stage and revised rewards, replacements, continuation spread, bonus and
    cost (the metric names are in :mod:`lit_rl.algorithms.double_rollout`'s docstring); NaNs left out."""
    ro = est.rollouts
    m: dict[str, float] = {
        "train/on_policy/reward_mean": float(est.original.mean()),
        "train/on_policy/reward_std": float(est.original.std(unbiased=False)),
        "train/on_policy/accuracy": float((est.original >= threshold).float().mean()),
        "train/on_policy/frac_reward_zero_std": frac_reward_zero_std(est.original, first_stage.group),
        "train/on_policy/length_mean": float(first_stage.lengths.float().mean()),
        "train/on_policy/hit_limit_frac": float(first_stage.hit_limit.float().mean()),
        "train/advantage_mean": float(est.advantages.mean()),
        "train/advantage_std": float(est.advantages.std(unbiased=False)),
        "train/advantage_nonzero_frac": float((est.advantages != 0).float().mean()),
    }
    m["train/dr/reward_original"] = float(est.original.mean())
    m["train/dr/reward_revised"] = float(est.revised.mean())
    m["train/dr/reward_final"] = float(ro.rewards.float().mean())
    if settings.active:
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
    if settings.length_bonus > 0:
        got = est.bonus > 0  # (B,) rows whose reward was revised upward
        m["train/dr/length_bonus_mean"] = float(est.bonus[got].mean()) if got.any() else 0.0
        m["train/dr/length_bonus_max"] = float(est.bonus.max())
        m["train/dr/length_bonus_frac"] = float(got.float().mean())
    m["train/length_mean"] = float(ro.lengths.float().mean())
    return {k: v for k, v in m.items() if not math.isnan(v)}
