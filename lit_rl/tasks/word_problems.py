"""One- and two-step arithmetic word problems in plain English, for a real instruct model's natural output.

The task a pretrained chat model meets first (docs/real_model.md): no tags, no format to learn, a question a
person would ask and a reward that reads what the model writes::

    Leo has 5 pens. Leo buys 4 more pens. How many pens does Leo have now?
    -> "Leo buys 4 more pens, so he has 5 + 4 = 9 pens now."            reward 1 (answer 9)

Kinds (``kinds``): ``add`` (has a, buys b more), ``sub`` (has a, gives b away), ``two_step`` (has a, buys b,
gives c away). Numbers are small (``max_number``), so answers lie in 0..2·max_number and a guess is sometimes
right: the outcome noise the double-rollout paper is about (a right answer after wrong steps) arises on its own.
SmolLM2-135M-Instruct, greedy, 96 new tokens, scores 0.30 on ``add``, 0.09 on ``two_step`` (the candidates
measured in docs/real_model.md).

**Reading the answer** (:func:`final_int`, never raises): the last ``answer is N`` / ``answer: N`` / ``#### N`` if
the completion states one (``answer is 5 + 4 = 9`` states 9), else the last integer in the text (commas inside
numbers ignored). That is the lenient
GSM8K convention for an untagged model: a model that restates the answer and then rambles on about another
sum is read at its last number, and loses the reward.

**Checking the steps** (:func:`equations`, :func:`steps_verdict`): the ``x op y = z`` statements in the text,
judged by arithmetic and by what the problem allows (operands from the problem or earlier results). A correct
answer whose steps are wrong is a lucky guess (the double-rollout premise statistics).

Training and evaluation problems are drawn from ``seed`` (the same on every machine); no evaluation problem
(kind, name, item and numbers) is a training problem.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from lit_rl.errors import FieldError
from lit_rl.tasks.base import EvalScore, Example, Task, record_fields

__all__ = ["KINDS", "WordProblemTask", "equations", "final_int", "first_error_at", "steps_verdict"]

KINDS = ("add", "sub", "two_step")
NAMES = ("Sam", "Mia", "Tom", "Ana", "Leo", "Zoe", "Max", "Ivy")
ITEMS = ("apples", "pens", "books", "coins", "cards", "eggs", "stamps", "shells")

# numbers of at most 18 digits (a longer run of digits is no number here: int() of a 1 MB one would raise)
_N = r"(?<!\d)-?\d{1,18}(?!\d)"
_INT = re.compile(_N)
# "The answer is: 42 + 28 = 60" states 60: an equation after the keyword is skipped to its result
_STATED = re.compile(r"(?:answer\s+is|answer\s*:|####)\s*:?\s*\$?\s*(?:" + _N + r"\s*[+\-*x×]\s*" + _N
                     + r"\s*=\s*)?(-?\d{1,3}(?:,\d{3})+(?!\d)|" + _N + ")", re.I)
_EQ = re.compile(f"({_N})\\s*([+\\-*x×])\\s*({_N})\\s*=\\s*({_N})")
_TEMPLATES = {
    "add": "{n} has {a} {i}. {n} buys {b} more {i}. How many {i} does {n} have now?",
    "sub": "{n} has {a} {i}. {n} gives {b} {i} to a friend. How many {i} does {n} have now?",
    "two_step": "{n} has {a} {i}. {n} buys {b} more {i} and then gives {c} {i} to a friend. "
                "How many {i} does {n} have now?",
}
_FIELD = {"n": r"\w+", "i": r"\w+", "a": r"\d+", "b": r"\d+", "c": r"\d+"}


def _pattern(template: str) -> re.Pattern[str]:
    """A template as a regex: each field a named group where it first appears, a back-reference after."""
    out, seen = "^", set()
    for literal, field, _, _ in string.Formatter().parse(template):
        out += re.escape(literal)
        if field:
            out += f"(?P={field})" if field in seen else f"(?P<{field}>{_FIELD[field]})"
            seen.add(field)
    return re.compile(out + "$")


_PARSE = {k: _pattern(t) for k, t in _TEMPLATES.items()}


def _to_int(text: str) -> int | None:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None


def final_int(completion: Any) -> int | None:
    """The completion's final answer (module docstring): the last stated ``answer is N`` / ``#### N``, else the
    last integer; ``None`` when there is no number. Never raises."""
    text = completion if isinstance(completion, str) else ""
    stated = _STATED.findall(text)
    if stated:
        return _to_int(stated[-1])
    nums = _INT.findall(text.replace(",", ""))
    return int(nums[-1]) if nums else None


def equations(completion: Any) -> list[tuple[int, str, int, int]]:
    """The ``x op y = z`` statements of the text, in order (op one of ``+ - *``; ``x`` and ``×`` read as ``*``)."""
    return [eq for eq, _ in _equations_at(completion)]


def _equations_at(completion: Any) -> list[tuple[tuple[int, str, int, int], tuple[int, int, int]]]:
    """Each equation with where its ``x``, ``y`` and ``z`` start in the text."""
    text = completion if isinstance(completion, str) else ""
    out = []
    for m in _EQ.finditer(text):
        x, op, y, z = m.groups()
        out.append(((int(x), "*" if op in "x×" else op, int(y), int(z)), (m.start(1), m.start(3), m.start(4))))
    return out


def first_error_at(completion: Any, example: Example) -> int | None:
    """Character index of the first wrong token of the stated steps (:func:`steps_verdict`'s rules), ``None`` when
    every stated step is right: an operand from nowhere is wrong where it is written, a wrong result where the
    result is. Where an error sits relative to double rollout's cut is what the premise measures: a cut inside
    ``6 + 9 = 14`` before the ``14`` keeps no error."""
    known = set(int(v) for v in (example.meta.get("numbers") or []))
    for (x, op, y, z), (at_x, at_y, at_z) in _equations_at(completion):
        if x not in known:
            return at_x
        if y not in known:
            return at_y
        if _value(x, op, y) != z:
            return at_z
        known.add(z)
    return None


def _value(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def steps_verdict(completion: Any, example: Example) -> str:
    """How the completion's stated steps relate to the problem (never raises):

    * ``"supported"``: it states at least one equation, every equation is arithmetically right, every operand is a
      number of the problem or an earlier equation's result, and some equation's result is the answer;
    * ``"wrong"``: it states an equation that is arithmetically wrong or uses a number from nowhere, or none of
      its results is the answer;
    * ``"none"``: it states no equation (an answer without shown work).
    """
    eqs = equations(completion)
    if not eqs:
        return "none"
    known = set(int(v) for v in (example.meta.get("numbers") or []))
    for x, op, y, z in eqs:
        if _value(x, op, y) != z or x not in known or y not in known:
            return "wrong"
        known.add(z)
    return "supported" if any(z == int(example.answer) for *_, z in eqs) else "wrong"


class WordProblemTask(Task):
    """Arithmetic word problems for a pretrained chat model (module docstring).

    Args:
        kinds: problem kinds drawn uniformly per prompt (``add``, ``sub``, ``two_step``).
        max_number: the numbers are drawn from 2..max_number (``sub``'s second below the first; ``two_step``'s
            gift below the total).
        num_train: training prompts.
        num_eval: evaluation prompts (held out).
        seed: generator seed.
        **kwargs: prompt/reward options of :class:`~lit_rl.tasks.base.Task`.
    """

    name = "word_problems"
    max_reward = 1.0

    @staticmethod
    def check_args(kinds: list[str] | tuple[str, ...] = KINDS, max_number: int = 12, num_train: int = 2000,
                   num_eval: int = 128) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        bad = [k for k in kinds if k not in KINDS]
        if not kinds or bad:
            raise FieldError("kinds", f"must be a non-empty list of {list(KINDS)}, got {list(kinds)}")
        if not 3 <= max_number <= 99:
            raise FieldError("max_number", f"must be in 3..99, got {max_number}")
        for name, v in (("num_train", num_train), ("num_eval", num_eval)):
            if v < 0:
                raise FieldError(name, f"must be >= 0, got {v}")

    def __init__(self, kinds: list[str] | tuple[str, ...] = KINDS, max_number: int = 12, num_train: int = 2000,
                 num_eval: int = 128, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        WordProblemTask.check_args(kinds=kinds, max_number=max_number, num_train=num_train, num_eval=num_eval)
        self.kinds, self.max_number = tuple(kinds), max_number
        self.num_train, self.num_eval, self.seed = num_train, num_eval, seed
        self._cache: dict[str, list[Example]] = {}

    def _draw(self, split: str, i: int) -> Example:
        rng = random.Random(f"lit_rl/word_problems/{self.seed}/{split}/{i}")
        kind = rng.choice(self.kinds)
        n, item = rng.choice(NAMES), rng.choice(ITEMS)
        hi = self.max_number
        a = rng.randint(3 if kind == "sub" else 2, hi)
        b = rng.randint(1, a - 1) if kind == "sub" else rng.randint(2, hi)
        c = rng.randint(1, a + b - 1) if kind == "two_step" else None
        return self._build(f"word-{split}-{i}", kind, n, item, a, b, c)

    def _build(self, id: str, kind: str, n: str, item: str, a: int, b: int, c: int | None) -> Example:
        question = _TEMPLATES[kind].format(n=n, i=item, a=a, b=b, c=c)
        answer = a + b if kind == "add" else a - b if kind == "sub" else a + b - int(c)
        numbers = [a, b] if c is None else [a, b, c]
        question = self.format_question(question=question)  # the template, "{question}" unless overridden
        return Example(id=id, question=question, answer=answer, meta={"kind": kind, "numbers": numbers})

    def eval_examples(self) -> list[Example]:
        if "eval" not in self._cache:
            self._cache["eval"] = [self._draw("eval", i) for i in range(self.num_eval)]
        return self._cache["eval"]

    def train_examples(self) -> list[Example]:
        if "train" not in self._cache:
            held_out = {e.question for e in self.eval_examples()}
            out, i = [], 0
            while len(out) < self.num_train:
                ex = self._draw("train", i)
                i += 1
                if i > 50 * (self.num_train + 10):
                    raise ValueError(f"word_problems: too few problems outside the {self.num_eval} held out; raise "
                                     "max_number or lower num_train")
                if ex.question not in held_out:
                    out.append(ex)
            self._cache["train"] = out
        return self._cache["train"]

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"word-record-{index}")
        for kind, pat in _PARSE.items():
            m = pat.match(question.strip())
            if m:
                g = m.groupdict()
                ex = self._build(rid, kind, g["n"], g["i"], int(g["a"]), int(g["b"]),
                                 int(g["c"]) if g.get("c") else None)
                if _to_int(str(ground_truth)) != ex.answer:
                    raise ValueError(f"ground_truth {ground_truth!r} is not the answer {ex.answer} of {question!r}")
                return ex
        raise ValueError(f"not a word problem of kinds {list(KINDS)}: {question[:80]!r}")

    def reward(self, completion: str, example: Example) -> float:
        got = final_int(completion)
        return 1.0 if got is not None and got == int(example.answer) else 0.0

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        return EvalScore(self.reward(completion, example), 1.0)

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        self._check_parser(parser)
        got = final_int(completion)
        return None if got is None else str(got)
