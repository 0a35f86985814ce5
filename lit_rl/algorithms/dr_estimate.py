"""Double-rollout reward estimation as a pipeline stage (docs/double_rollout.md; Qian et al. 2026,
"Double-Rollout Reinforcement Learning with Sampling-based Reward Estimation", §2).

* :class:`DoubleRolloutSettings`: ρ, N, buffer, delimiter and rules (the module docstring of
  :mod:`lit_rl.algorithms.double_rollout` has every choice the paper leaves open);
* :func:`estimate_rewards`: one rollout batch -> :class:`Estimate` (continuations through the generator,
  revised rewards, GRPO advantages, one-sided replacement, length terms), calling the pure math of
  :mod:`lit_rl.core.double_rollout`;
* :class:`DoubleRolloutEstimate`: the processor that runs it on the batch's rows with the batch's task,
  generator and generation settings, and :func:`estimate_metrics` (``train/dr/*``, ``train/on_policy/*``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.algorithms.processors import GroupBaseline, Processor
from lit_rl.core.advantages import frac_reward_zero_std
from lit_rl.core.double_rollout import (
    continuation_budget,
    cut_index,
    length_bonus,
    length_penalty_az,
    one_sided_replacement,
    revised_rewards,
    split_thinking,
)
from lit_rl.errors import FieldError
from lit_rl.batch import PromptBatch, RolloutBatch, Source

__all__ = ["DoubleRolloutEstimate", "DoubleRolloutSettings", "Estimate", "estimate_metrics", "estimate_rewards"]


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
        length_bonus_in_baseline: ``false`` (default): the bonus is added to the advantages of the rows it
            rewards, the baseline (and std) staying those of the revised rewards (``A = (r̂ + bonus − b)/σ``),
            so no row's advantage goes down and every row of S, a replaced row included, keeps ``A > 0``;
            ``true``: the advantages are recomputed from the bonus-revised rewards (the rule before issue 34:
            the bonus raises the group's baseline, so a long row of S, e.g. a replacement continuation, can
            end with ``A <= 0`` and be pushed down).
        length_penalty: α of Arora & Zanette's penalty (``lit_rl.core.double_rollout.length_penalty_az``; 0: off;
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
    length_bonus_in_baseline: bool = False
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
    """Double-rollout reward estimation for one rollout batch (DR §2; steps in the module docstring).

    Args:
        rollouts: first-stage rows (left-padded prompt ⊕ EOS-filled completion), ``rewards`` = verifier.
        backend: generates the continuations (``continue_from``).
        score: ``score(texts, groups) -> rewards``, the task verifier for completions of prompt groups.
        decode: ids ``(R, W)`` (EOS-filled) → completion texts.
        delimiter_ids: token ids that close the thinking trace.
        eos_id: end-of-sequence id.
        settings: ρ, N, buffer, missing rule, replacement rule, length bonus, ...
        advantages: ``advantages(rewards (B,), group (B,), bonus=None) -> (B,)``, the GRPO baseline
            (:class:`~lit_rl.algorithms.processors.GroupBaseline`, :func:`~lit_rl.core.advantages.group_centered`);
            ``bonus (B,)`` is added after the baseline is taken (the length bonus, ``length_bonus_in_baseline``
            off).
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
    prompt_rows = [ids[m.bool()].tolist()
                   for ids, m in zip(rollouts.input_ids[:, :P].cpu(), rollouts.attention_mask[:, :P].cpu())]

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
        # a dLLM canvas starts after the prompt (lit_rl.generation.continuations): tell it where
        wants_split = getattr(backend, "needs_prompt_lens", False)
        split = {"prompt_lens": [len(prompt_rows[i]) for i in rows]} if wants_split else {}
        out = backend.continue_from(
            prefixes, n=N, max_new_tokens=[budgets[i] for i in rows], temperature=temperature, top_p=top_p, seed=seed,
            **split,
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
        has_continuations=has_cont, replaced=replaced, bonus=bonus, stage2_tokens=stage2_tokens,
        stage2_seconds=time.perf_counter() - t0, correct=correct, original_lengths=rollouts.lengths.clone(),
        group=group,
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
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, prompt_len=P, completion_mask=completion_mask,
        lengths=lengths, rewards=ro.rewards.clone(), source=source, group=ro.group, texts=texts,
        prompt_ids=list(ro.prompt_ids), hit_limit=hit, eval_total=ro.eval_total, row=ro.row,
        gen_width=None if L > comp_width else ro.gen_width,  # a dLLM row keeps its canvas width
        kept_prefix=kept,
    )


class DoubleRolloutEstimate(Processor):
    """Double rollout's reward estimation as a processor (:func:`estimate_rewards`): the continuations come
    from the batch's generator (the engine that sampled the first stage, holding the current weights) and
    are scored with the batch's task; the rows to train on (replacements rebuilt, ``Source.CONTINUATION``)
    carry the GRPO advantages of the revised rewards. The :class:`Estimate` goes to
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
        task, gen, examples = batch.task, batch.generation, batch.examples
        if self.settings.active and (task is None or batch.generator is None):
            raise RuntimeError("the rollout batch has no task / generator for continuations: "
                               "use datamodules.ar_rollouts.ARRolloutDataModule")
        threshold = self.threshold(task)

        def score(texts: Sequence[str], groups: Sequence[int]) -> list[float]:  # one reward call per batch
            return task.total_rewards(texts, [examples[g] for g in groups]).totals

        s = self.settings
        delim = s.delimiter if s.delimiter is not None else getattr(self.policy, "think_end", None)
        if delim is None:
            raise ValueError(f"model.double_rollout.delimiter: {type(self.policy).__name__} has no think_end; "
                             "set the text that closes the thinking trace (e.g. '</reasoning>')")
        delim_ids = list(self.policy.tokenizer(delim, add_special_tokens=False)["input_ids"])
        est = estimate_rewards(
            rollouts, batch.generator, score, self.policy.decode_completions, delim_ids, self.policy.eos_id, s,
            self.baseline, correct_threshold=threshold,
            max_new_tokens=int(getattr(gen, "max_new_tokens", rollouts.completion_ids.shape[1])),
            temperature=s.temperature if s.temperature is not None else float(getattr(gen, "temperature", 1.0)),
            top_p=s.top_p if s.top_p is not None else float(getattr(gen, "top_p", 1.0)),
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
    bs = len(batch.examples)
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
    dm_stats = batch.stats
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
        m["train/cost/tokens_stage2"] = est.stage2_tokens / max(bs, 1)
        m["time/stage2_s"] = est.stage2_seconds
        t1 = dm_stats.get("time/stage1_s") or dm_stats.get("time/generation_s")  # AR | dLLM first stage
        if t1:
            m["time/stage2_over_stage1"] = est.stage2_seconds / t1
    if settings.length_bonus > 0:
        got = est.bonus > 0  # (B,) rows whose reward was revised upward
        m["train/dr/length_bonus_mean"] = float(est.bonus[got].mean()) if got.any() else 0.0
        m["train/dr/length_bonus_max"] = float(est.bonus.max())
        m["train/dr/length_bonus_frac"] = float(got.float().mean())
    m["train/length_mean"] = float(ro.lengths.float().mean())
    return {k: v for k, v in m.items() if not math.isnan(v)}
