"""Typed rollout containers shared by both algorithms: the only things that flow between the stages.

The DataModule's sources fill a :class:`PromptBatch` (prompts, the task, the generation settings and
generator, its own per-batch statistics) and its :class:`RolloutBatch`; the processors set the rows'
``advantages`` and ``keep`` (and may replace rows) and put named results in ``diagnostics``; the loss and
the callbacks read the same objects. No stage reaches into another through the trainer.

Layout of every rollout tensor: the prompt is LEFT-padded to a common width ``P`` and the completion
occupies the last ``L`` positions, so ``input_ids[:, P:]`` is the completion of every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import torch

from lit_rl.core.sources import Source  # noqa: F401  (the rollout containers' source tag)
from lit_rl.tasks.base import Example, Task

_T = TypeVar("_T")


@dataclass
class Continuations:
    """What a continuation stage (double rollout's second stage, :mod:`lit_rl.algorithms.dr_stage`) produced for
    the rows it continued, run by the DataModule after the first stage: generation and scoring done, so the
    processors that read it are pure functions of the batch. Indices ``i`` are rows of the sub-batch the stage
    saw (all rows, or the on-policy ones; ``row`` names them).

    Attributes:
        row: ``(B,)`` the ``RolloutBatch.row`` ids of the rows it continued, in order (a processor checks that
            it reads the continuations of the rows it has).
        bodies: each row's completion tokens without its EOS.
        cuts: ``{i: cut}`` kept trace tokens of each continued row.
        budgets: ``{i: budget}`` each continued row's continuation budget.
        tokens: ``{(i, j): (tokens, ended)}`` continuation ``j`` of row ``i`` up to its EOS, and whether it
            ended with one.
        rewards: ``(B, N)`` each continuation's reward ``R(x, t_i[:cut] ⊕ c_ij)`` (0 where none).
        lengths: ``(B, N)`` each continuation's token count.
        continued: ``(B,)`` bool, continuations were sampled for the row.
        tokens_generated: continuation tokens generated (EOS included).
        seconds: wall time of the stage (generation + scoring).
    """

    row: torch.Tensor
    bodies: list[list[int]]
    cuts: dict[int, int]
    budgets: dict[int, int]
    tokens: dict[tuple[int, int], tuple[list[int], bool]]
    rewards: torch.Tensor
    lengths: torch.Tensor
    continued: torch.Tensor
    tokens_generated: int = 0
    seconds: float = 0.0


@dataclass
class Inpainted:
    """What the inpainting stage (IGPO, :mod:`lit_rl.algorithms.inpaint`) produced: new rows for the groups whose
    on-policy rows were all wrong, decoded by the policy around hint chunks of a reference trace and scored. The
    processor that reads it (:class:`~lit_rl.algorithms.inpaint.InpaintReplace`) only chooses and copies rows.

    Attributes:
        row: ``(N,)`` the ``RolloutBatch.row`` ids of the rows the stage saw (the processor checks it has them).
        triggered: ``(B_p,)`` bool, the group's on-policy rows were all wrong.
        no_reference: ``(B_p,)`` bool, a triggered group without a reference trace (left as it was).
        group: ``(M,)`` long, each new row's prompt group.
        completion: ``(M, L_gen)`` long, the decoded canvases (hints included).
        hint: ``(M, L_gen)`` bool, positions held fixed (a reference token) inside the row's completion.
        lengths: ``(M,)`` completion lengths (tokens up to and including the first EOS).
        rewards: ``(M,)`` the task's rewards.
        correct: ``(M,)`` bool, ``rewards >= threshold``.
        texts: ``M`` decoded completions.
        hit_limit: ``(M,)`` bool, no EOS in the canvas.
        tokens_decoded: masked positions the stage decoded (the hints excluded).
        seconds: wall time of the stage (hints, decoding, scoring).
    """

    row: torch.Tensor
    triggered: torch.Tensor
    no_reference: torch.Tensor
    group: torch.Tensor
    completion: torch.Tensor
    hint: torch.Tensor
    lengths: torch.Tensor
    rewards: torch.Tensor
    correct: torch.Tensor
    texts: list[str]
    hit_limit: torch.Tensor
    tokens_decoded: int = 0
    seconds: float = 0.0


@dataclass
class PromptBatch:
    """What the prompt stream yields: a batch of prompt groups and their external rollouts.

    Attributes:
        examples: the ``B_p`` prompts of this batch.
        step: index of this batch in the recorded prompt stream (for exact resume and logging).
        external: for each prompt, its external completion records (``PoolRecord``), ``G_ext`` each (every
            pool's, in source order).
        records: each external source's own records per prompt, by source (``id(source)``).
        rollouts: filled at the start of the training batch by the DataModule (on-policy generation), then
            replaced by the processed rows (with ``advantages`` and ``keep``).
        task: the task whose verifier scored the rows.
        generation: the rollout sampling / decoding settings the rows were generated with
            (:class:`~lit_rl.generation.settings.DecodeSettings` or :class:`~lit_rl.models.ar.SamplingSettings`).
        outputs: what the dependent stages produced, one typed value per type (:meth:`put`, :meth:`get`): a new
            stage stores its own output class here without a field in this class. ``continuations`` (double
            rollout's second stage) and ``inpainted`` (IGPO's hinted rows) read the two shipped ones (``None``
            without that stage).
        rank: the data-parallel rank that produced the batch (seeds of rank-specific draws).
        stats: the DataModule's per-batch metrics (generation time, format rate, reward functions, ...).
        diagnostics: what processors report beyond advantages, by name (``"double_rollout"``: the
            :class:`~lit_rl.algorithms.double_rollout.Estimate`), for metrics and callbacks.
    """

    examples: list[Example]
    step: int
    external: list[list[Any]] = field(default_factory=list)
    records: dict[int, list[list[Any]]] = field(default_factory=dict)
    rollouts: "RolloutBatch | None" = None
    task: "Task | None" = None
    generation: Any = None  # DecodeSettings (dLLM) | SamplingSettings (AR): the containers import neither
    outputs: dict[type, Any] = field(default_factory=dict)
    rank: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def put(self, output: Any) -> None:
        """Store a stage's typed output under its type (replacing an earlier one of that type)."""
        self.outputs[type(output)] = output

    def get(self, kind: type[_T]) -> _T | None:
        """The stage output of type ``kind`` or a subclass of it (``None`` when no stage produced one)."""
        if kind in self.outputs:
            return self.outputs[kind]
        return next((v for k, v in self.outputs.items() if issubclass(k, kind)), None)

    @property
    def continuations(self) -> Continuations | None:
        """Double rollout's second stage (:class:`Continuations`), run by the DataModule after the first."""
        return self.get(Continuations)

    @continuations.setter
    def continuations(self, value: Continuations | None) -> None:
        self.outputs.pop(Continuations, None) if value is None else self.put(value)

    @property
    def inpainted(self) -> Inpainted | None:
        """IGPO's hinted rows (:class:`Inpainted`)."""
        return self.get(Inpainted)

    @inpainted.setter
    def inpainted(self, value: Inpainted | None) -> None:
        self.outputs.pop(Inpainted, None) if value is None else self.put(value)


@dataclass
class RolloutBatch:
    """Source-tagged rollouts of ``B_p`` prompt groups, ``N`` rows in all.

    Attributes:
        input_ids: ``(N, P + L)`` prompt (left-padded) followed by the completion (EOS-filled).
        attention_mask: ``(N, P + L)`` 1 on real tokens (prompt padding is 0, the completion is 1).
        prompt_len: ``P``, the padded prompt width.
        completion_mask: ``(N, L)`` bool, True on completion tokens up to and including the first EOS.
        lengths: ``(N,)`` completion lengths (tokens up to and including the first EOS).
        rewards: ``(N,)`` float rewards from the task verifier.
        source: ``(N,)`` long, a :class:`Source` per row.
        group: ``(N,)`` long, index of the row's prompt in the batch.
        texts: ``N`` decoded completions.
        prompt_ids: ``N`` prompt ids (``Example.id``).
        hit_limit: ``(N,)`` bool, the completion filled the whole generation budget without an EOS.
        eval_total: ``(N,)`` optional evaluation units per row (validation batches: ``rewards`` holds
            the evaluation score's ``correct`` and this its ``total``, e.g. Sudoku blank cells).
        row: ``(N,)`` long, the row's index in the batch as produced (kept by :meth:`select` and
            :meth:`slice_rows`): with the step and rank it seeds the row's own random draws, so they do
            not depend on how the batch is filtered or split. Default ``arange(N)``.
        gen_width: ``(N,)`` long, the width of the row's own completion (on-policy rows: ``L_gen``).
            Positions at or after it are padding added to stack rows of different widths: outside
            ``completion_mask`` and ``attention_mask``, never scored. Default ``L`` for every row.
        kept_prefix: ``(N,)`` long, completion tokens a ``CONTINUATION`` row kept from its first-stage rollout
            (the cut trace; the rest was re-decoded by double rollout's second stage); 0 on other rows.
        hint_mask: ``(N, L)`` bool, completion positions held fixed while the row was decoded (inpainting hints
            taken from a reference trace, IGPO); all False on other rows (the default).
        advantages: ``(N,)`` set by the processors (``None`` before them).
        keep: ``(N,)`` bool, the rows the loss trains on (processors drop rows by setting it False).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    completion_mask: torch.Tensor
    lengths: torch.Tensor
    rewards: torch.Tensor
    source: torch.Tensor
    group: torch.Tensor
    texts: list[str]
    prompt_ids: list[str]
    hit_limit: torch.Tensor
    eval_total: torch.Tensor | None = None
    row: torch.Tensor | None = None
    gen_width: torch.Tensor | None = None
    kept_prefix: torch.Tensor | None = None
    hint_mask: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    keep: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n, device = int(self.input_ids.shape[0]), self.input_ids.device
        if self.row is None:
            self.row = torch.arange(n, device=device)
        if self.gen_width is None:
            self.gen_width = torch.full((n,), self.input_ids.shape[1] - self.prompt_len, dtype=torch.long,
                                        device=device)
        if self.kept_prefix is None:
            self.kept_prefix = torch.zeros(n, dtype=torch.long, device=device)
        if self.hint_mask is None:
            self.hint_mask = torch.zeros(n, self.input_ids.shape[1] - self.prompt_len, dtype=torch.bool, device=device)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len:]  # (N, L)

    def with_advantages(self, advantages: torch.Tensor, keep: torch.Tensor | None = None) -> "RolloutBatch":
        """A copy of the batch (tensors shared) whose rows carry ``advantages (N,)`` and ``keep (N,)``
        (default: every row)."""
        keep = torch.ones_like(advantages, dtype=torch.bool) if keep is None else keep.bool()
        return RolloutBatch(**{f.name: getattr(self, f.name) for f in fields(self)}
                            | {"advantages": advantages, "keep": keep})

    def to(self, device: torch.device | str) -> "RolloutBatch":
        moved = {
            f.name: (getattr(self, f.name).to(device) if isinstance(getattr(self, f.name), torch.Tensor)
                     else getattr(self, f.name))
            for f in fields(self)
        }
        return RolloutBatch(**moved)

    def select(self, keep: torch.Tensor) -> "RolloutBatch":
        """Rows where ``keep (N,)`` is True (the completion width is unchanged)."""
        idx = keep.nonzero(as_tuple=True)[0]
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx.tolist()]
            else:
                out[f.name] = v
        return RolloutBatch(**out)

    def trim_completion(self, width: int) -> "RolloutBatch":
        """The batch with only the first ``width`` completion columns, ``(N, P + width)``: for a causal policy,
        whose logits at a position never read a later one, the columns after the last scored token are dead
        weight in a loss pass (generation stops when every row has ended, but rows are EOS-filled to the full
        budget). ``gen_width`` is clipped to ``width``; ``width`` at least 1 and at most ``L``."""
        L = self.input_ids.shape[1] - self.prompt_len
        if not 1 <= width <= L:
            raise ValueError(f"trim_completion: width must be in [1, {L}], got {width}")
        if width == L:
            return self
        cut = self.prompt_len + width
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out |= {"input_ids": self.input_ids[:, :cut], "attention_mask": self.attention_mask[:, :cut],
                "completion_mask": self.completion_mask[:, :width], "hint_mask": self.hint_mask[:, :width],
                "gen_width": self.gen_width.clamp(max=width), "kept_prefix": self.kept_prefix.clamp(max=width)}
        return RolloutBatch(**out)

    def scatter(self, where: torch.Tensor, rows: "RolloutBatch") -> "RolloutBatch":
        """A copy of the batch whose rows at ``where (N,)`` (bool, True on ``len(rows)`` rows) are replaced by
        ``rows`` in order: the inverse of :meth:`select` for a sub-batch a processor rewrote. The widths
        must match (``rows`` of another width would need re-padding, which no caller does)."""
        idx = where.nonzero(as_tuple=True)[0]
        if len(idx) != len(rows) or rows.input_ids.shape[1] != self.input_ids.shape[1] \
                or rows.prompt_len != self.prompt_len:
            raise ValueError(f"scatter: {len(rows)} rows of width {tuple(rows.input_ids.shape[1:])} into {len(idx)} "
                             f"slots of width {tuple(self.input_ids.shape[1:])} (prompt {self.prompt_len})")
        out = {}
        for f in fields(self):
            v, new = getattr(self, f.name), getattr(rows, f.name)
            if isinstance(v, torch.Tensor) and isinstance(new, torch.Tensor):
                v = v.clone()
                v[idx] = new.to(v.dtype)
            elif isinstance(v, list):
                v = list(v)
                for i, x in zip(idx.tolist(), new):
                    v[i] = x
            elif v is not None and f.name != "prompt_len":
                raise ValueError(f"scatter: field {f.name} is set on the batch but not on the rows")
            out[f.name] = v
        return RolloutBatch(**out)

    def slice_rows(self, sl: slice) -> "RolloutBatch":
        """The consecutive rows ``sl`` (a micro-batch), as :meth:`select` makes them."""
        keep = torch.zeros(len(self), dtype=torch.bool, device=self.input_ids.device)
        keep[sl] = True
        return self.select(keep)
