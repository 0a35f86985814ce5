"""Chain sums: a tiny-model task with a real thinking trace, for the double-rollout testbed.

A prompt lists ``k`` digits (``Sum: 3 5 2 8``); the expected completion writes the running sums as its
thinking trace, then the total as its answer::

    <reasoning>3+5=8 8+2=10 10+8=18</reasoning>
    <answer>18</answer>

The answer is a function of the trace's last step, so the trace carries the work and the outcome reward
(answer == total) judges it: a slip in step ``j`` propagates to the answer. Difficulty is ``k`` (more steps,
more chances to slip, larger partial sums). Sampled at T = 1 a tiny causal LM makes exactly the two errors
the double-rollout paper describes: wrong answers after a nearly right trace (a late slip), and correct
answers unsupported by the trace (the scripted teacher of :func:`chainsum_completion` writes some of
those on purpose). Cutting at ρ of the trace (delimiter ``</reasoning>``) leaves the last steps and the
answer to the continuations, whose mean reward measures how good the kept prefix is.

**Guessable answers** (``answer_mod``): the answer is the total modulo ``answer_mod`` (``Sum: 3 5 2 4 mod 2``
-> ``...10+4=14</reasoning>\n<answer>0</answer>``); the trace is the same running sum. With ``answer_mod: 2``
a guess is right half the time, so correct answers after a wrong or unfinished trace (lucky guesses, the
outcome noise double rollout removes) are common. The teacher's ``guess_rate`` stops the trace early and
guesses, the paper's "guess based on an inconclusive chain of thought".

Training and evaluation sets are generated from ``seed`` (the same on every machine); no training problem is
an evaluation problem. :func:`trace_correct` checks a trace step by step (the premise statistics: correct
answers whose trace is wrong).
"""

from __future__ import annotations

import random
import re
from typing import Any

from lit_rl.errors import FieldError
from lit_rl.tasks.base import EvalScore, Example, Task, record_fields
from lit_rl.tasks.parsing import last_answer_block

_INT = re.compile(r"^\s*(-?\d{1,6})\s*$")
_NUMBERS = re.compile(r"Sum:\s*((?:\d\s*){1,32})")


def parse_int_answer(completion: str) -> int | None:
    """The integer inside the last ``<answer>...</answer>`` block, or ``None`` (never raises)."""
    block = last_answer_block(completion if isinstance(completion, str) else "")
    if block is None:
        return None
    m = _INT.match(block)
    return int(m.group(1)) if m else None


_TRACE = re.compile(r"<reasoning>(.*?)</reasoning>", re.S)
_STEP = re.compile(r"^(\d{1,4})\+(\d{1,4})=(\d{1,5})$")


def trace_correct(completion: str, numbers: list[int]) -> bool:
    """Whether the completion's ``<reasoning>`` trace is exactly the running-sum trace of ``numbers``
    (every step ``a+b=c`` right and in order); a missing or malformed trace is not correct. Never raises."""
    m = _TRACE.search(completion if isinstance(completion, str) else "")
    if m is None:
        return False
    want = running_sums(list(numbers))
    steps, current = [], None
    for text in m.group(1).split():
        if text.startswith("=") and current is not None:  # a restatement (the verbose teacher) must be right
            if text[1:] != str(current):
                return False
            continue
        steps.append(text)
        got = _STEP.match(text)
        current = int(got.group(3)) if got else None
    if len(steps) != len(want):
        return False
    for text, (a, b, c) in zip(steps, want):
        got = _STEP.match(text)
        if got is None or tuple(int(x) for x in got.groups()) != (a, b, c):
            return False
    return True


def trace_steps(completion: str) -> list[str]:
    """The steps of the completion's ``<reasoning>`` trace (restatements ``=c`` left out); ``[]`` without a trace."""
    m = _TRACE.search(completion if isinstance(completion, str) else "")
    return [t for t in m.group(1).split() if not t.startswith("=")] if m else []


def running_sums(numbers: list[int]) -> list[tuple[int, int, int]]:
    """The trace's steps ``(partial, next, partial + next)`` for ``numbers`` (``k - 1`` steps)."""
    steps, acc = [], numbers[0]
    for n in numbers[1:]:
        steps.append((acc, n, acc + n))
        acc += n
    return steps


class ChainSumTask(Task):
    """Sum ``k`` digits with a running-sum trace (module docstring).

    Args:
        num_train: training prompts.
        num_eval: evaluation prompts.
        min_terms, max_terms: range of ``k`` (inclusive), drawn uniformly per prompt.
        max_digit: the numbers are drawn from 1..max_digit.
        answer_mod: the answer is the total modulo this (``None``: the total itself); the prompt ends with
            ``mod <answer_mod>``.
        seed: generator seed.
        **kwargs: prompt/reward options of :class:`~lit_rl.tasks.base.Task`.
    """

    name = "chainsum"
    max_reward = 1.0
    SYSTEM_PROMPTS = {"d1_train": "", "d1_eval": ""}
    QUESTION_TEMPLATES = {"d1_train": "Sum: {numbers}", "d1_eval": "Sum: {numbers}"}

    @staticmethod
    def check_args(num_train: int = 2000, num_eval: int = 256, min_terms: int = 3, max_terms: int = 6,
                   max_digit: int = 9, answer_mod: int | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`); the
        prompt options' are :meth:`Task.check_args`."""
        if not 1 <= max_digit <= 9:
            raise FieldError("max_digit", f"must be in 1..9, got {max_digit}")
        if not 2 <= min_terms <= max_terms <= 16:
            field = "min_terms" if not 2 <= min_terms <= max_terms else "max_terms"
            raise FieldError(field, f"min_terms = {min_terms}, max_terms = {max_terms}: need 2 <= min_terms <= "
                             "max_terms <= 16")
        if answer_mod is not None and not 2 <= answer_mod <= 1000:
            raise FieldError("answer_mod", f"must be null or in 2..1000, got {answer_mod}")
        for name, v in (("num_train", num_train), ("num_eval", num_eval)):
            if v < 0:
                raise FieldError(name, f"must be >= 0, got {v}")

    def __init__(
        self, num_train: int = 2000, num_eval: int = 256, min_terms: int = 3, max_terms: int = 6, max_digit: int = 9,
        seed: int = 0, answer_mod: int | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        ChainSumTask.check_args(num_train=num_train, num_eval=num_eval, min_terms=min_terms, max_terms=max_terms,
                                max_digit=max_digit, answer_mod=answer_mod)
        self.max_digit, self.answer_mod = max_digit, answer_mod
        self.num_train, self.num_eval, self.seed = num_train, num_eval, seed
        self.min_terms, self.max_terms = min_terms, max_terms
        self._cache: dict[str, list[Example]] = {}

    def _example(self, split: str, i: int) -> Example:
        rng = random.Random(f"lit_rl/chainsum/{self.seed}/{split}/{i}")
        numbers = [rng.randint(1, self.max_digit) for _ in range(rng.randint(self.min_terms, self.max_terms))]
        return self._from_numbers(f"chainsum-{split}-{i}", numbers)

    def _from_numbers(self, id: str, numbers: list[int]) -> Example:
        text = " ".join(map(str, numbers))
        meta: dict[str, Any] = {"numbers": list(numbers), "terms": len(numbers)}
        question, answer = self.format_question(numbers=text), sum(numbers)
        if self.answer_mod is not None:
            question, answer = f"{question} mod {self.answer_mod}", answer % self.answer_mod
            meta["answer_mod"] = self.answer_mod
        return Example(id=id, question=question, answer=answer, meta=meta)

    def train_examples(self) -> list[Example]:
        """``num_train`` problems, none of which is an evaluation problem (same numbers in the same order):
        with 1-5 and 3-5 terms there are only 3,875 problems, and independent draws put 65% of the first
        128 evaluation problems among 2,000 training prompts."""
        if "train" not in self._cache:
            held_out = {tuple(e.meta["numbers"]) for e in self.eval_examples()}
            space = sum(self.max_digit**k for k in range(self.min_terms, self.max_terms + 1))
            if self.num_train and space - len(held_out) <= 0:
                raise ValueError(f"chainsum: every one of the {space} problems is an evaluation problem; "
                                 "lower num_eval")
            out, i = [], 0
            while len(out) < self.num_train:
                ex = self._example("train", i)
                i += 1
                if tuple(ex.meta["numbers"]) not in held_out:
                    out.append(ex)
            self._cache["train"] = out
        return self._cache["train"]

    def eval_examples(self) -> list[Example]:
        if "eval" not in self._cache:
            self._cache["eval"] = [self._example("eval", i) for i in range(self.num_eval)]
        return self._cache["eval"]

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"chainsum-record-{index}")
        m = _NUMBERS.search(question)
        if m is None:
            raise ValueError("no 'Sum: <digits>' in 'question'")
        numbers = [int(x) for x in m.group(1).split()]
        try:
            total = int(ground_truth)
        except (TypeError, ValueError):
            raise ValueError(f"ground_truth {ground_truth!r} is not an integer") from None
        want = sum(numbers) if self.answer_mod is None else sum(numbers) % self.answer_mod
        if total != want:
            of = "the sum" if self.answer_mod is None else f"the sum mod {self.answer_mod}"
            raise ValueError(f"ground_truth {total} is not {of} of {numbers}")
        return self._from_numbers(rid, numbers)

    def reward(self, completion: str, example: Example) -> float:
        got = parse_int_answer(completion)
        return 1.0 if got is not None and got == int(example.answer) else 0.0

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        return EvalScore(self.reward(completion, example), 1.0)

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        self._check_parser(parser)
        got = parse_int_answer(completion)
        return None if got is None else str(got)


def chainsum_completion(example: Example, rng: random.Random, error_rate: float = 0.0, restate: float = 0.0,
                        guess_rate: float = 0.0) -> str:
    """The scripted teacher: the running-sum trace and the total.

    With probability ``error_rate`` one random step's result is off by 1 or 2; the later steps continue
    from the wrong value. Half of those traces then answer their own (wrong) last value, the other half
    the TRUE total: a correct answer that the trace does not support.

    With ``restate > 0`` each step is followed, with that probability, by a redundant restatement of the
    running sum (``8+2=10 =10``): correct solutions of one problem then differ in length (1-4 extra tokens
    per restatement), so length terms (DR's bonus, the Arora-Zanette penalty) have something to trade.

    On a task with ``answer_mod`` (``example.meta["answer_mod"]``) every answer is taken modulo it, and with
    ``guess_rate > 0`` a trace (after any slip) is, with that probability, stopped after a uniform number of
    its steps, fewer than all (an inconclusive trace, possibly empty), and the answer is a uniform guess in
    ``0..answer_mod-1``. Random draws are only added when ``guess_rate > 0``, so the other teachers' streams
    are unchanged.
    """
    numbers = list(example.meta["numbers"])
    steps = running_sums(numbers)
    answer = sum(numbers)
    mod = example.meta.get("answer_mod")
    if guess_rate and mod is None:
        raise ValueError("chainsum_completion: guess_rate needs a task with answer_mod (a guessable answer)")
    if steps and rng.random() < error_rate:
        bad = rng.randrange(len(steps))
        acc, out = numbers[0], []
        for j, n in enumerate(numbers[1:]):
            res = acc + n + (rng.choice((-2, -1, 1, 2)) if j == bad else 0)
            out.append((acc, n, res))
            acc = res
        steps = out
        if rng.random() < 0.5:
            answer = acc
    if mod is not None:
        answer %= mod
    if guess_rate and steps and rng.random() < guess_rate:
        steps = steps[: rng.randrange(len(steps))]
        answer = rng.randrange(mod)
    parts = []
    for a, b, c in steps:
        parts.append(f"{a}+{b}={c}")
        if restate and rng.random() < restate:
            parts.append(f"={c}")
    return f"<reasoning>{' '.join(parts)}</reasoning>\n<answer>{answer}</answer>"


def chainsum_guessing_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """The teacher that guesses: :func:`chainsum_completion` with ``guess_rate`` :data:`GUESS_RATE` (needs a task
    with ``answer_mod``)."""
    return chainsum_completion(example, rng, error_rate=error_rate, guess_rate=GUESS_RATE)


#: the guessing teacher's share of inconclusive traces with a guessed answer
GUESS_RATE = 0.4


def chainsum_verbose_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """The teacher with restatements after half of the steps (:func:`chainsum_completion`, ``restate=0.5``)."""
    return chainsum_completion(example, rng, error_rate=error_rate, restate=0.5)


__all__ = ["ChainSumTask", "chainsum_completion", "parse_int_answer", "running_sums", "trace_correct",
           "chainsum_verbose_completion", "chainsum_guessing_completion", "GUESS_RATE", "trace_steps"]
