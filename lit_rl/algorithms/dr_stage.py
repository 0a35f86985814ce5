"""Double rollout's second stage as a rollout stage: generation and scoring in the data stage, not in a processor.

A processor that needs new rows generated from the batch's rows declares a :class:`RolloutStage` (its ``stage``
attribute); the module lists them (:meth:`~lit_rl.algorithms.rl_module.RLModule.rollout_stages`) and the
DataModule runs them right after the first stage, with the generation engine that produced the rows (it holds
the current weights). The stage's output travels typed in the batch (:class:`~lit_rl.batch.Continuations`), and
the processor that reads it (:class:`~lit_rl.algorithms.dr_estimate.DoubleRolloutEstimate`) is a pure function
of the batch. One rollout batch of double-rollout GRPO::

    DataModule  first stage (G rollouts per prompt)  ->  ContinuationStage.run (N continuations per cut)
    module      DoubleRolloutEstimate.process (revised rewards, advantages, replacement)  ->  the loss
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import torch
from torch import Tensor

from lit_rl import rng
from lit_rl.batch import Continuations, PromptBatch, RolloutBatch, Source
from lit_rl.core.double_rollout import continuation_budget, cut_index, split_thinking

__all__ = ["ContinuationStage", "DoubleRolloutSettings", "RolloutStage", "sample_continuations"]


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
            ``true``: the advantages are recomputed from the bonus-revised rewards (the earlier rule:
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


def sample_continuations(
    rollouts: RolloutBatch,
    backend: Any,
    score: Callable[[Sequence[str], Sequence[int]], Sequence[float]],
    decode: Callable[[Tensor], list[str]],
    delimiter_ids: Sequence[int],
    eos_id: int,
    settings: DoubleRolloutSettings,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> Continuations:
    """Double rollout's second stage for one rollout batch (DR §2, steps 1-2): the trace, cut and budget of each
    rollout, ``N`` continuations of every prefix ``x ⊕ t_i[:cut]`` in one backend call, each scored as
    ``R(x, t_i[:cut] ⊕ c_ij)``. Generation and scoring only:
    :func:`~lit_rl.algorithms.dr_estimate.estimate_from` does the rest, purely.

    Args:
        rollouts: first-stage rows (left-padded prompt ⊕ EOS-filled completion).
        backend: generates the continuations (``continue_from``).
        score: ``score(texts, groups) -> rewards``, the task verifier for completions of prompt groups.
        decode: ids ``(R, W)`` (EOS-filled) → completion texts.
        delimiter_ids: token ids that close the thinking trace.
        eos_id: end-of-sequence id.
        settings: ρ, N, buffer, missing rule, budget cap.
        max_new_tokens: first-stage generation limit (caps the budgets, see the module docstring).
        temperature, top_p: continuation sampling (resolved by the caller).
        seed: seed of the continuation sampling.
    """
    t0 = time.perf_counter()
    device = rollouts.rewards.device
    B = len(rollouts)
    N = settings.num_continuations
    P = rollouts.prompt_len
    group = rollouts.group
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
    return Continuations(
        row=rollouts.row.clone(), bodies=bodies, cuts=cuts, budgets=budgets, tokens=cont_tokens,
        rewards=cont_rewards.to(device), lengths=cont_len.to(device), continued=has_cont.to(device),
        tokens_generated=stage2_tokens, seconds=time.perf_counter() - t0,
    )




class RolloutStage:
    """A stage that makes rows (or scores new samples) from the batch's first-stage rows, run by the DataModule."""

    def run(self, batch: PromptBatch, rollouts: RolloutBatch, policy: torch.nn.Module, engine: Any) -> None:
        """Generate and score from ``rollouts`` with ``engine`` (the DataModule's generation engine: an AR backend
        or a dLLM's :class:`~lit_rl.generation.continuations.DiffusionContinuations`); store the typed result in
        ``batch`` and the stage's metrics in ``batch.stats``."""
        raise NotImplementedError


class ContinuationStage(RolloutStage):
    """Double rollout's second stage (DR §2 steps 1-2, :func:`sample_continuations`):
    ``N`` continuations of each rollout's cut trace, scored with the batch's task, into ``batch.continuations``.

    Args:
        settings: ρ, N, buffer, delimiter, missing rule, budget cap, sampling.
        seed: the module's seed (the continuations draw from ``seed_for(seed, CONTINUATION, rank, step)``).
        rows: ``"all"`` or ``"on_policy"`` (only the ``ON_POLICY`` rows; ERILS's mixed groups, whose pool rows
            the policy must not continue).
    """

    def __init__(self, settings: DoubleRolloutSettings, seed: int = 0, rows: str = "all") -> None:
        self.settings, self.seed, self.rows = settings, seed, rows

    def delimiter_ids(self, policy: torch.nn.Module) -> list[int]:
        s = self.settings
        delim = s.delimiter if s.delimiter is not None else getattr(policy, "think_end", None)
        if delim is None:
            raise ValueError(f"model.double_rollout.delimiter: {type(policy).__name__} has no think_end; "
                             "set the text that closes the thinking trace (e.g. '</reasoning>')")
        return list(policy.tokenizer(delim, add_special_tokens=False)["input_ids"])

    def run(self, batch: PromptBatch, rollouts: RolloutBatch, policy: torch.nn.Module, engine: Any) -> None:
        if not self.settings.active:
            return
        task, gen, examples = batch.task, batch.generation, batch.examples
        if task is None or engine is None:
            raise RuntimeError("the continuation stage needs the batch's task and a generation engine: use "
                               "datamodules.ar_rollouts.ARRolloutDataModule or datamodules.RolloutDataModule")
        mine = rollouts.source == int(Source.ON_POLICY) if self.rows == "on_policy" else None  # (N,)
        seen = rollouts if mine is None else rollouts.select(mine)

        def score(texts: Sequence[str], groups: Sequence[int]) -> list[float]:  # one reward call per batch
            return task.total_rewards(texts, [examples[g] for g in groups]).totals

        s = self.settings
        conts = sample_continuations(
            seen, engine, score, policy.decode_completions, self.delimiter_ids(policy), policy.eos_id, s,
            max_new_tokens=int(getattr(gen, "max_new_tokens", seen.completion_ids.shape[1])),
            temperature=s.temperature if s.temperature is not None else float(getattr(gen, "temperature", 1.0)),
            top_p=s.top_p if s.top_p is not None else float(getattr(gen, "top_p", 1.0)),
            seed=rng.seed_for(self.seed, rng.Stream.CONTINUATION, rank=batch.rank, step=batch.step),
        )
        batch.put(conts)
        stats = {"train/cost/tokens_stage2": conts.tokens_generated / max(len(examples), 1),
                 "time/stage2_s": conts.seconds}
        t1 = batch.stats.get("time/stage1_s") or batch.stats.get("time/generation_s")  # AR | dLLM first stage
        if t1:
            stats["time/stage2_over_stage1"] = conts.seconds / t1
        batch.stats.update(stats)
