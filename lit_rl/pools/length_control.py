"""Rollout length control (ERILS §IV-A, App. B-B) and completion-length counting (App. B-C).

Modes, chosen per task in the build config (``length_control.mode``):

* ``"none"``: the task prompt as is (the "uncontrolled-length external rollouts" variant);
* ``"instruction"``: the length-control instruction ``P_len`` is appended to the task prompt ``P_task``
  (paper: Countdown, MATH500) and the reply is the final completion;
* ``"two_stage"``: the policy answers ``P_task``; then a rewrite prompt holding ``P_task``, that first
  completion and ``P_len`` asks the same policy to rewrite it compactly, keeping the final answer (paper:
  Sudoku). Only the rewrite enters the pool; the builder re-runs the verifier on it and keeps the first
  stage's text and reward in ``meta["stage1"]`` for analysis (never as the record's reward).

``{target_total_tokens}`` in the texts is the dLLM's generation length L_gen (256): a length to aim at,
not a truncation point. The paper's exact texts are not public in our copy; the defaults below are ours
and every config can replace them.

Lengths are counted over the completion only (no prompt, no special tokens) with the external model's
tokenizer (:func:`resolve_length_counter`); counting characters is a fallback that is recorded in the pool
header (``length_unit: "chars"``) and warned about, because it overstates token counts ~3-4x.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from lit_rl.tasks.base import Example, Task, fill_template

MODES = ("none", "instruction", "two_stage")

DEFAULT_INSTRUCTION = (
    "Length requirement: your whole response, reasoning and answer together, must be about "
    "{target_total_tokens} tokens long. Reason concisely: write only the steps that are needed to reach the "
    "answer, without restating the problem, repeating checks or adding commentary. Still finish with the "
    "required format: <reasoning> ... </reasoning> followed by <answer> ... </answer>."
)

DEFAULT_REWRITE_PROMPT = (
    "Below are a task and a solution that was written for it. Rewrite the solution into a compact version.\n\n"
    "### Task\n{task_prompt}\n\n"
    "### Original solution\n{completion}\n\n"
    "### Rewrite rules\n"
    "- Keep the final answer exactly as it is in the original solution. Do not solve the task again and do not "
    "change the answer, even if you think it is wrong.\n"
    "- Keep only the reasoning steps that lead to that answer; drop repetitions, re-checks, alternatives that "
    "were abandoned and commentary.\n"
    "- Output only the rewritten solution in the format <reasoning> ... </reasoning>\n<answer> ... </answer>, "
    "with nothing before or after it."
)


@dataclass(frozen=True)
class LengthControl:
    """Length control of one build.

    Attributes:
        mode: ``"none"``, ``"instruction"`` or ``"two_stage"`` (module docstring).
        target_total_tokens: the length to aim at (ERILS: L_gen = 256).
        instruction: ``P_len``; ``{target_total_tokens}`` is filled in.
        rewrite_prompt: the second-stage prompt; ``{task_prompt}`` and ``{completion}`` are filled in and
            ``P_len`` is appended after a blank line.
    """

    mode: str = "instruction"
    target_total_tokens: int = 256
    instruction: str = DEFAULT_INSTRUCTION
    rewrite_prompt: str = DEFAULT_REWRITE_PROMPT

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"length_control.mode={self.mode!r}: expected one of {MODES}")
        if (not isinstance(self.target_total_tokens, int) or isinstance(self.target_total_tokens, bool)
                or self.target_total_tokens < 1):
            raise ValueError(f"length_control.target_total_tokens={self.target_total_tokens!r}: "
                             "must be an integer >= 1")
        for key in ("instruction", "rewrite_prompt"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"length_control.{key}: expected a text, got {type(getattr(self, key)).__name__}")
        if self.mode == "two_stage":
            for key in ("{task_prompt}", "{completion}"):
                if key not in self.rewrite_prompt:
                    raise ValueError(f"length_control.rewrite_prompt must contain {key}")

    @property
    def two_stage(self) -> bool:
        return self.mode == "two_stage"

    def length_instruction(self) -> str:
        """``P_len`` with the target filled in."""
        return fill_template(self.instruction, target_total_tokens=self.target_total_tokens).strip()

    def first_stage_messages(self, task: Task, example: Example) -> list[dict[str, str]]:
        """``P_task`` (``none``, ``two_stage``) or ``P_task || P_len`` (``instruction``) as chat messages."""
        messages = [dict(m) for m in task.messages(example)]
        if self.mode == "instruction":
            messages[-1]["content"] = messages[-1]["content"].rstrip() + "\n\n" + self.length_instruction()
        return messages

    def rewrite_messages(self, task: Task, example: Example, completion: str) -> list[dict[str, str]]:
        """The second-stage prompt for ``completion`` (one user message)."""
        task_prompt = "\n\n".join(m["content"].strip() for m in task.messages(example))
        body = fill_template(self.rewrite_prompt, task_prompt=task_prompt, completion=completion.strip()).rstrip()
        return [{"role": "user", "content": body + "\n\n" + self.length_instruction()}]


class LengthCounter:
    """Counts completion lengths: tokens of a tokenizer (no special tokens) or characters.

    Attributes:
        name: what the pool header and records store as ``tokenizer`` (``"chars"`` for the fallback).
        unit: ``"tokens"`` or ``"chars"``.
        fallback: True when no tokenizer was available and characters are counted instead.
    """

    def __init__(self, tokenizer: Any | None, name: str, fallback: bool = False) -> None:
        self.tokenizer, self.name, self.fallback = tokenizer, name, fallback
        self.unit = "chars" if tokenizer is None else "tokens"

    def __call__(self, text: str) -> int:
        return self.count([text])[0]

    def count(self, texts: Sequence[str]) -> list[int]:
        if self.tokenizer is None:
            return [len(t) for t in texts]
        enc = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in enc]


def resolve_length_counter(spec: str | None, backend: Any | None = None) -> LengthCounter:
    """The length counter for ``length_tokenizer: spec``.

    * a HF tokenizer name or path (e.g. ``Qwen/Qwen3-30B-A3B-Instruct-2507``): loaded with
      ``AutoTokenizer``; failing to load it is an error (lengths in the wrong unit would silently change
      which completions are usable);
    * ``"lit_rl/char"``: the built-in character tokenizer of the tiny models;
    * ``"chars"``: count characters (explicit; still marked as a fallback in the header);
    * ``"auto"`` or ``None``: the backend's own tokenizer; without one, characters, with a warning.
    """
    if spec in (None, "", "auto"):
        tok = backend.length_tokenizer() if backend is not None else None
        if tok is not None:
            return LengthCounter(tok, _tok_name(tok))
        warnings.warn(
            "length_tokenizer: the backend has no tokenizer and none is configured, so completion lengths are "
            "counted in CHARACTERS (recorded in the pool header as length_unit='chars'); set length_tokenizer to "
            "the external model's tokenizer (e.g. Qwen/Qwen3-30B-A3B-Instruct-2507) for the paper's 500-token filter",
            stacklevel=2,
        )
        return LengthCounter(None, "chars", fallback=True)
    if spec == "chars":
        warnings.warn("length_tokenizer: 'chars' counts characters, not tokens of the external model "
                      "(ERILS App. B-C counts tokens)", stacklevel=2)
        return LengthCounter(None, "chars", fallback=True)
    if spec == "lit_rl/char":
        from lit_rl.models.tokenizer import build_char_tokenizer

        return LengthCounter(build_char_tokenizer(), "lit_rl/char")
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(spec)
    except Exception as e:
        raise ValueError(
            f"length_tokenizer={spec!r} could not be loaded ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); "
            "download it first (huggingface-cli download ...), point to a local copy, or set length_tokenizer: chars "
            "to count characters instead"
        ) from None
    return LengthCounter(tok, spec)


def _tok_name(tok: Any) -> str:
    return str(getattr(tok, "name_or_path", "") or type(tok).__name__)
