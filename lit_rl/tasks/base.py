"""The task interface: prompt, dataset, training reward (verifier) and evaluation metric.

A task turns a dataset row (:class:`Example`) into a zero-shot chat prompt, scores a completion with the
*training* reward (the reference reward code, docs/tasks.md) and with the *evaluation* rule (the
reference evaluation parsers, more lenient, §5). Both scorers read untrusted model text: they never
execute it, never hang (all parsing is linear in the text length) and never raise; malformed text scores
0 (or the task's format value).

Prompts: by default d1's training prompt, which puts the "system prompt" text at the start of the single
user message (``system_role=False``); ``system_role=True`` sends it as a separate system message.
``system_prompt=""`` and a ``question_template`` such as ``"{puzzle}"`` give a compact prompt for tiny
models. Templates are filled by plain ``{field}`` substitution (not ``str.format``), so LaTeX braces such
as ``\\boxed{}`` need no escaping.

Users can add rewards with TRL-style callables ``f(prompts, completions, **kwargs) -> list[float]``; the
kwargs are the dataset columns (``answer``, ``prompt_id`` and every key of ``Example.meta``) as lists.
"""

from __future__ import annotations

import abc
import codecs
import json
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Sequence

from lit_rl.errors import FieldError
from lit_rl.tasks.rewards import (MAX_ABS_REWARD, RewardFunc, call_reward_func, completion_text, resolve_reward_funcs,
                                  reward_func_name)

#: ``eval``: the written evaluation rules (docs/tasks.md); ``reward``: the training reward's parsing;
#: ``reference``: bug-compatible with d1's ``eval/parse_and_get_acc.py`` (where the two differ: text without
#: any ``\\boxed`` is read whole, not its ``<answer>`` block), to match published tables item by item
PARSERS = ("eval", "reward", "reference")
#: packaged data files (``lit_rl/data``, see its SOURCES.md)
DATA_DIR = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class Example:
    """One dataset row.

    Attributes:
        id: stable prompt id (``"<task>-<split>-<index>"``); external pools are keyed by it.
        question: the task text shown to the model (without system prompt).
        answer: ground truth, task specific (Sudoku: 16-char solution; Countdown: ``(numbers, target)``;
            MATH: reference answer string).
        meta: extra columns (e.g. Sudoku ``puzzle``), passed to TRL-style reward callables as kwargs.
    """

    id: str
    question: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict)


class EvalScore(NamedTuple):
    """An evaluation outcome: ``correct`` out of ``total`` units.

    Countdown/MATH: one unit per problem (0 or 1). Sudoku: units are the puzzle's blank cells, so
    accuracy pooled over a set is ``sum(correct) / sum(total)`` (the reference cell accuracy).
    """

    correct: float
    total: float

    @property
    def fraction(self) -> float:
        return self.correct / self.total if self.total else 0.0


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for one-line error messages."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int past the 4300-digit limit, a deeply nested list
        return f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_utf8(path: str | Path) -> str:
    """The text of a data file (a leading BOM dropped); ``ValueError`` naming the file and line if it is
    not UTF-8. A missing file raises the usual ``OSError``."""
    data = Path(path).read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{line}: not valid UTF-8 ({e.reason})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_jsonl(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("<file>:<line>", object)`` for each non-blank line of a JSONL data file.

    Strict JSON (no ``NaN``/``Infinity``); any line that is not one JSON object, or cannot be decoded,
    raises ``ValueError`` naming the file and line.
    """
    for lineno, line in enumerate(read_utf8(path).split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None
        except ValueError as e:  # a NaN/Infinity constant, or an integer past Python's 4300-digit limit
            raise ValueError(f"{where}: not valid JSON ({str(e).split(':')[0]})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object per line, got {type(row).__name__}")
        yield where, row


def record_fields(question: Any, extra: dict[str, Any], default_id: str) -> tuple[str, str]:
    """``(id, question)`` of a generation record (:meth:`Task.example_from_record`), type checked."""
    if not isinstance(question, str):
        raise ValueError(f"'question' must be a string, got {type(question).__name__}")
    rid = extra.get("prompt_id", default_id)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise ValueError(f"'prompt_id' must be a string, got {type(rid).__name__}")
    return str(rid), question


def check_prompt_set(examples: Sequence["Example"], prompts_per_batch: int, world: int = 1) -> None:
    """The training prompts a stream draws from: ids unique (the prompt ledger, the pool and ``score --details``
    key on them) and at least one batch of them (``prompts_per_batch`` per rank; a larger batch would hold a
    prompt twice). Raises :class:`~lit_rl.errors.FieldError` (``task`` or ``prompts_per_batch``); called by the
    data modules' ``setup`` and by the config preflight."""
    seen: dict[str, int] = {}
    for i, e in enumerate(examples):
        if e.id in seen:
            raise FieldError("task", f"prompt id {e.id!r} is used twice in the training set (prompts {seen[e.id] + 1} "
                             f"and {i + 1}): ids must be unique (id_column)")
        seen[e.id] = i
    need = prompts_per_batch * world
    if need > len(examples):
        ranks = f" x {world} ranks = {need}" if world > 1 else ""
        raise FieldError("prompts_per_batch", f"{prompts_per_batch}{ranks} prompts per batch, but the training set "
                         f"has {len(examples)}: every batch would repeat prompts; lower prompts_per_batch")


#: a ``{name}`` placeholder of a question template (``\\boxed{}`` and other braces are text)
_PLACEHOLDER = re.compile(r"(?<!\\)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill_template(template: str, **fields: Any) -> str:
    """Replace each ``{name}`` in ``template`` by ``str(fields[name])``; other braces are left alone.

    >>> fill_template("Wrap it in \\\\boxed{}. {problem}", problem="1+1?")
    'Wrap it in \\\\boxed{}. 1+1?'
    """
    out = template
    for key, value in fields.items():
        out = out.replace("{" + key + "}", str(value))
    return out


@dataclass
class RewardScores:
    """Rewards of a batch of completions: ``totals`` (one per completion) and each reward function's own
    values by name (NaN where a function gave ``None``)."""

    totals: list[float]
    per_func: dict[str, list[float]]

    def metrics(self) -> dict[str, float]:
        """TRL's per-function metrics: ``rewards/<name>/mean`` and ``rewards/<name>/std`` (NaN rows skipped)."""
        out: dict[str, float] = {}
        for name, values in self.per_func.items():
            vals = [v for v in values if v == v]
            mean = sum(vals) / len(vals) if vals else float("nan")
            var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) if len(vals) > 1 else 0.0
            out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = mean, var**0.5
        return out


class Task(abc.ABC):
    """A verifiable-reward task. Subclasses: ``SudokuTask``, ``CountdownTask``, ``MathTask``.

    Args:
        reward_funcs: extra TRL-style reward callables (or ``"module.attr"`` strings, e.g.
            ``trl.rewards.think_format_reward``) added to the task reward by :meth:`total_rewards`; called once
            per rollout batch by keyword, as TRL calls them (:mod:`lit_rl.tasks.rewards`).
        reward_weights: one weight per entry of ``reward_funcs`` (TRL's ``reward_weights``; default 1 each);
            the task's own verifier always has weight 1.
        reward_completions: how completions reach ``reward_funcs``: ``"conversational"`` (TRL's form for chat
            prompts, which lit_rl's are: ``[{"role": "assistant", "content": text}]``) or ``"text"``.
        system_prompt: replaces the task's d1 system prompt (``""``: none).
        question_template: replaces the task's question template (fields are task specific, see the
            subclass docstring).
        system_role: send the system prompt as a ``system`` message instead of prefixing the user message
            (d1 prefixes).
        reward_timeout: seconds one call of a ``reward_funcs`` entry may take; a call still running then counts as
            ``None`` for its batch (adds nothing) and the first one of each function is a warning naming it
            (``null``: wait for it). A verifier never runs model text, so a slow function is a bug to fix.
    """

    name: str = "task"
    #: reward of a fully correct completion (Sudoku/Countdown 1.0, MATH 3.0)
    max_reward: float = 1.0
    #: reward at or above which the *answer* is correct (Sudoku/Countdown 1.0; MATH 2.0: the correctness
    #: term, whatever the format credit on top)
    correct_reward: float = 1.0
    #: the largest reward size taken from a ``reward_funcs`` entry (:data:`lit_rl.tasks.rewards.MAX_ABS_REWARD`);
    #: a larger finite value is refused in one line naming the function, the row and the prompt id
    max_abs_reward: float = MAX_ABS_REWARD
    #: d1's texts, per prompt style; subclasses fill these
    SYSTEM_PROMPTS: dict[str, str] = {}
    QUESTION_TEMPLATES: dict[str, str] = {}
    #: text between the system prompt and the question when both go in one user message
    JOINERS: dict[str, str] = {}

    @classmethod
    def check_args(cls, reward_funcs: Sequence[RewardFunc | str] | RewardFunc | str | None = None,
                   reward_weights: Sequence[float] | None = None, reward_completions: str = "conversational",
                   prompt_style: str = "d1_train", reward_timeout: float | None = None) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`).
        A classmethod: the prompt styles are the configured subclass's ``SYSTEM_PROMPTS``; the constructor calls it
        as ``Task.check_args.__func__(type(self), ...)``, so a subclass's own ``check_args`` does not hide it."""
        if cls.SYSTEM_PROMPTS and prompt_style not in cls.SYSTEM_PROMPTS:
            raise FieldError("prompt_style", f"must be one of {sorted(cls.SYSTEM_PROMPTS)}, got {prompt_style!r}")
        if reward_weights is not None:
            n = 0 if reward_funcs is None else 1 if isinstance(reward_funcs, str) or callable(reward_funcs) else len(
                reward_funcs)  # as resolve_reward_funcs counts them
            if len(reward_weights) != n:
                raise FieldError("reward_weights", f"has {len(reward_weights)} entries for {n} reward_funcs")
        if reward_completions not in ("conversational", "text"):
            raise FieldError("reward_completions", f"must be 'conversational' or 'text', got {reward_completions!r}")
        if reward_timeout is not None and not reward_timeout > 0:
            raise FieldError("reward_timeout", f"must be > 0 seconds or null, got {reward_timeout}")

    def __init__(
        self,
        reward_funcs: Sequence[str | RewardFunc] | None = None,
        reward_weights: Sequence[float] | None = None,
        reward_completions: str = "conversational",
        system_prompt: str | None = None,
        question_template: str | None = None,
        system_role: bool = False,
        prompt_style: str = "d1_train",
        reward_timeout: float | None = None,
    ) -> None:
        Task.check_args.__func__(type(self), reward_funcs=reward_funcs, reward_weights=reward_weights,
                                 reward_completions=reward_completions, prompt_style=prompt_style,
                                 reward_timeout=reward_timeout)
        self.prompt_style = prompt_style
        self.extra_reward_funcs: list[RewardFunc] = resolve_reward_funcs(reward_funcs)
        self.reward_weights = ([float(w) for w in reward_weights] if reward_weights is not None
                               else [1.0] * len(self.extra_reward_funcs))
        self.reward_completions = reward_completions
        self._system_prompt_override = system_prompt
        self._question_template_override = question_template
        self.system_role = system_role
        self.reward_timeout = reward_timeout

    # -- prompts -----------------------------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        """d1-style system prompt asking for ``<reasoning>...</reasoning>\\n<answer>...</answer>``."""
        if self._system_prompt_override is not None:
            return self._system_prompt_override
        return self.SYSTEM_PROMPTS.get(self.prompt_style, "")

    @property
    def question_template(self) -> str:
        if self._question_template_override is not None:
            return self._question_template_override
        return self.QUESTION_TEMPLATES.get(self.prompt_style, "{question}")

    def format_question(self, **fields: Any) -> str:
        """The question text for one row (template filled with the task's fields). A ``{name}`` placeholder the
        task has no field for is a :class:`~lit_rl.errors.FieldError` naming ``question_template`` (it used to be
        left in the prompt as literal text: an overlay that switched to ``PromptTask`` but kept Sudoku's
        ``{puzzle}`` trained on the text ``{puzzle}``)."""
        template = self.question_template
        missing = [m for m in _PLACEHOLDER.findall(template) if m not in fields]
        if missing:
            raise FieldError("question_template", f"{template!r} has placeholder(s) "
                             f"{', '.join('{' + m + '}' for m in dict.fromkeys(missing))} that {type(self).__name__} "
                             f"does not fill (its fields: {', '.join('{' + f + '}' for f in fields) or 'none'})")
        return fill_template(template, **fields)

    def messages(self, example: Example) -> list[dict[str, str]]:
        """Zero-shot chat messages for ``example``: one user message (d1), or system + user."""
        system = self.system_prompt
        if not system:
            return [{"role": "user", "content": example.question}]
        if self.system_role:
            return [{"role": "system", "content": system}, {"role": "user", "content": example.question}]
        joiner = self.JOINERS.get(self.prompt_style, "\n\n")
        return [{"role": "user", "content": system + joiner + example.question}]

    # -- data --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def train_examples(self) -> list[Example]:
        """Training prompts in a fixed, documented order (ids stable across runs)."""

    @abc.abstractmethod
    def eval_examples(self) -> list[Example]:
        """The task's evaluation set."""

    @abc.abstractmethod
    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        """Rebuild an :class:`Example` from a generation record (``question`` + ``ground_truth`` as the
        d1 generation files store them); raises ``ValueError`` if they cannot be understood."""

    # -- scoring -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def reward(self, completion: str, example: Example) -> float:
        """Training reward (reference reward rules, §4). Never raises."""

    @abc.abstractmethod
    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        """Evaluation score. ``parser="eval"``: the evaluation rules (docs/tasks.md, lenient);
        ``parser="reward"``: the reward's parsing rules; ``parser="reference"``: d1's evaluation code, bugs
        included (a task without reference code scores as ``eval``). Never raises."""

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        """The answer string ``parser`` reads from ``completion`` (``score --details``), ``None``: nothing.
        Never raises."""
        return None

    @staticmethod
    def _check_parser(parser: str) -> None:
        if parser not in PARSERS:
            raise ValueError(f"parser={parser!r}: expected one of {PARSERS}")

    def total_reward(self, completion: str, example: Example) -> float:
        """Task reward plus every extra reward callable, for one completion (:meth:`total_rewards`)."""
        return self.total_rewards([completion], [example]).totals[0]

    def total_rewards(
        self, completions: Sequence[str], examples: Sequence[Example],
        completion_ids: Sequence[Sequence[int]] | None = None
    ) -> "RewardScores":
        """Rewards of a batch: the task's verifier per row plus ``Σ w_i f_i`` over the extra reward callables,
        each called once for the whole batch as TRL calls it (``None``/NaN adds nothing, as TRL's ``nansum``).

        Returns the totals and each function's values by name (``<task>_reward`` for the verifier), for
        TRL's per-function metrics ``rewards/<name>/mean|std``.
        """
        own = [float(self.reward(c, e)) for c, e in zip(completions, examples)]
        per_func: dict[str, list[float]] = {f"{self.name}_reward": own}
        totals = list(own)
        if self.extra_reward_funcs:
            prompts = [self.messages(e) for e in examples]
            comps = (
                [[{"role": "assistant", "content": c}] for c in completions]
                if self.reward_completions == "conversational" else list(completions)
            )
            ids = [list(map(int, row)) for row in completion_ids] if completion_ids is not None else None
            kwargs = self.reward_kwargs(examples)
            for f, w in zip(self.extra_reward_funcs, self.reward_weights):
                values = call_reward_func(f, prompts, comps, completion_ids=ids, timeout=self.reward_timeout,
                                          max_abs=self.max_abs_reward, **kwargs)
                name = reward_func_name(f)
                while name in per_func:
                    name += "_"
                per_func[name] = values
                totals = [t + (w * v if v == v else 0.0) for t, v in zip(totals, values)]
        return RewardScores(totals=totals, per_func=per_func)

    def reward_kwargs(self, examples: Sequence[Example]) -> dict[str, list[Any]]:
        """Dataset columns as TRL passes them to reward callables."""
        kw: dict[str, list[Any]] = {"answer": [e.answer for e in examples], "prompt_id": [e.id for e in examples]}
        for key in sorted({k for e in examples for k in e.meta}):
            kw[key] = [e.meta.get(key) for e in examples]
        return kw

    def reward_func(self) -> RewardFunc:
        """This task's verifier as a TRL-style callable.

        It needs the dataset columns in kwargs (``answer`` and the ``Example.meta`` keys, e.g. what
        :meth:`reward_kwargs` returns); completions may be strings or TRL conversational messages.
        """

        def task_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
            n = len(completions)
            answers = kwargs.get("answer")
            if answers is None or len(answers) != n:
                raise ValueError(f"{self.name} reward: kwargs must hold 'answer' with one entry per completion")
            ids = kwargs.get("prompt_id") or [""] * n
            columns = {k: v for k, v in kwargs.items()
                       if k not in ("answer", "prompt_id") and isinstance(v, (list, tuple)) and len(v) == n}
            out = []
            for i, c in enumerate(completions):
                ex = Example(id=str(ids[i]), question="", answer=answers[i], meta={k: v[i] for k, v in columns.items()})
                out.append(self.reward(completion_text(c), ex))
            return out

        task_reward.__name__ = f"{self.name}_reward"
        return task_reward
