"""Countdown with 3 numbers (ERILS App. C-B; d1/SPG reward and evaluation code).

Data. Test: d1's ``countdown_cd3_test.jsonl`` (256 problems ``{"input": "30,100,93", "output": "23"}``).
d1/SPG train on ``Jiayi-Pan/Countdown-Tasks-3to4`` (3-number rows), which is not available offline, so
training problems are generated to mirror the test file: three integers drawn independently and uniformly
from ``[1, 100]`` (repeats allowed; 8/256 test problems repeat a number), then a random expression over
them (random order, operators from ``+ - * /``, random bracketing ``(a o b) o c`` or ``a o (b o c)``) whose
exact value is an integer in ``[1, 100]`` becomes the target (the test targets span 1-100). Problem ``i``
(id ``countdown-train-<i>``) has its own RNG seeded by ``(seed, i)``; problems equal to a test problem
(same numbers multiset and target) are skipped. Every generated problem is solvable by construction.

Reward (d1/SPG ``countdown_reward_func``, §4): the LAST ``<answer>...</answer>`` block (stripped); none: 0.
Its numbers (every ``\\d+``) must be exactly the given multiset, else ``wrong_numbers_reward`` (0.1). It must
be plain arithmetic (see :mod:`lit_rl.tasks.countdown_arith`, evaluated safely), and its value within 1e-5 of the
target: 1.0; not evaluable, or a wrong value: ``wrong_result_reward`` (0.1). So any answer block that is not a
hit earns 0.1, an empty or malformed one included. ERILS's text describes 0 for wrong numbers:
``CountdownTask(wrong_numbers_reward=0.0)``.

Decimal points. The reference whitelist allows ``.`` and counts numbers as digit runs, so ``1.5*2`` for
``[1, 5, 2] > 3`` uses "1, 5, 2" and scores 1 in the reward and the evaluation: two given digits glued into a
decimal. d1 and SPG keep it (so does the default); ``CountdownTask(decimals=False)`` scores an answer with a
``.`` as wrong numbers (reward ``wrong_numbers_reward``, evaluation incorrect). With numbers of one digit
(docs/erils_countdown.md) the glue is one character away.

Evaluation (``parse_countdown_answers``, §5): the expression is the content of the last ``\\boxed{}``
(:func:`lit_rl.tasks.parsing.last_boxed`); if there is none (or its braces never balance), the first
``<answer>`` block; if none, the whole text. Then ``\\div``, ``\\times``, ``\\cdot`` become ``/ * *``; if a
``<expr> = <number>`` fragment occurs, its left side is kept; correct iff the numbers are exactly the
multiset and the value is within 1e-5 of the target. (For text with no box at all, the reference code's
helper hands the whole text on instead of the answer block; §5 and this module use the answer block. The
LLaDA baseline scores 19.53 either way.)

Prompts: ``"d1_train"`` (default) is d1 ``data_utils.get_countdown_questions``: the generic format prompt,
a newline, and the numbers/target instruction; ``"d1_eval"`` is d1's eval prompt (answer in
``\\boxed{}``), which produced the LLaDA generations. Template fields: ``{numbers}`` (rendered like a
Python list, ``[30, 100, 93]``) and ``{target}``.
"""

from __future__ import annotations

import functools
import math
import random
import re
from typing import Any, Sequence

from lit_rl.errors import FieldError
from lit_rl.tasks.countdown_arith import safe_eval, uses_exactly
from lit_rl.tasks.countdown_problems import (  # noqa: F401  (solve: the task's public solver)
    NUMBER_RANGE,
    TARGET_RANGE,
    TOLERANCE,
    generate_problem,
    solve,
)
from lit_rl.tasks.base import DATA_DIR, EvalScore, Example, Task, read_jsonl, record_fields, short_repr
from lit_rl.tasks.parsing import first_answer_block, last_answer_block, last_boxed, reference_boxed

SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>
"""
COUNTDOWN_TRAIN_TEMPLATE = (
    "Using only the numbers {numbers}, create an arithmetic expression that evaluates to exactly {target}. "
    "You must use all numbers from the list, and each number must be used exactly once. You may use the "
    "operations +, -, *, and / as needed. After reasoning, provide only your final expression inside "
    "<answer></answer> tags without including an equals sign or the target number. For example, if the "
    "numbers are [2, 3, 4] and the target is 5, a valid answer is: <answer>\n2*4-3\n</answer>"
)
CTD_EVAL_SYSTEM_PROMPT = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided "
    "target number. You may use the operations +, -, *, and / as needed, but each number must be used exactly "
    "once. Think step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags "
    "without including an equals sign or the target number. For example: \\boxed{a + b * c}"
    "Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    "<answer>\n\\boxed{...}\n</answer>"
)
COUNTDOWN_EVAL_TEMPLATE = "Numbers: {numbers}\nTarget: {target}"

CD3_TEST_JSONL = DATA_DIR / "d1" / "dataset" / "countdown_cd3_test.jsonl"

_INT_TEXT = re.compile(r"\s*[+-]?[0-9]{1,15}\s*")
#: numbers and targets are kept below this magnitude (exact as floats, so the 1e-5 comparison means something)
MAX_ABS = 10**15


def as_int(value: Any) -> int | None:
    """``value`` as an int if it is one (an int, an integral float or a decimal string, ``|x| < 1e15``), else ``None``.

    >>> as_int(" 23"), as_int(4.0), as_int("1e3"), as_int(True)
    (23, 4, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = int(value) if _INT_TEXT.fullmatch(value) else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    return value if isinstance(value, int) and abs(value) < MAX_ABS else None


@functools.lru_cache(maxsize=2)
def read_cd3_test(path: str = str(CD3_TEST_JSONL)) -> tuple[tuple[tuple[int, ...], int], ...]:
    """``(numbers, target)`` rows of d1's countdown test file (``{"input": "30,100,93", "output": "23"}``
    per line); ``ValueError`` naming the file, line and field on a malformed row."""
    rows = []
    for where, rec in read_jsonl(path):
        for key in ("input", "output"):
            if key not in rec:
                raise ValueError(f"{where}: field {key!r} missing "
                                 f"(expected {{\"input\": \"30,100,93\", \"output\": \"23\"}})")
        raw = rec["input"]
        numbers = [as_int(x) for x in raw.split(",")] if isinstance(raw, str) else [None]
        if None in numbers:
            raise ValueError(f"{where}: field 'input' must be comma-separated integers such as \"30,100,93\", "
                             f"got {short_repr(raw)}")
        target = as_int(rec["output"])
        if target is None:
            raise ValueError(f"{where}: field 'output' must be an integer such as \"23\", "
                             f"got {short_repr(rec['output'])}")
        rows.append((tuple(numbers), target))
    return tuple(rows)


@functools.lru_cache(maxsize=4)
def _generated_test(seed: int, size: int, number_range: tuple[int, int], target_range: tuple[int, int],
                    ordered: bool = False) -> tuple[tuple[tuple[int, ...], int], ...]:
    """``size`` generated test problems, distinct as (numbers multiset, target), each from its own RNG."""
    rows: list[tuple[tuple[int, ...], int]] = []
    seen: set[tuple[tuple[int, ...], int]] = set()
    i = 0
    while len(rows) < size and i < 100 * size:
        try:
            numbers, target = generate_problem(random.Random(f"lit_rl/countdown/{seed}/test/{i}"), number_range,
                                               target_range, ordered=ordered)
        except ValueError as e:
            raise FieldError("target_range", str(e)) from None
        i += 1
        key = (tuple(sorted(numbers)), target)
        if key not in seen:
            seen.add(key)
            rows.append((tuple(numbers), target))
    if len(rows) < size:
        raise FieldError("test_size", f"only {len(rows)} distinct problems found in {i} draws (number_range "
                                      f"{list(number_range)}, target_range {list(target_range)}); ask for fewer")
    return tuple(rows)


@functools.lru_cache(maxsize=1)
def _test_keys() -> frozenset[tuple[tuple[int, ...], int]]:
    return frozenset((tuple(sorted(n)), t) for n, t in read_cd3_test())


# -- scoring ------------------------------------------------------------------------------------------------


def countdown_reward(
    completion: str,
    numbers: Sequence[int],
    target: int | float,
    wrong_numbers_reward: float = 0.1,
    wrong_result_reward: float = 0.1,
    decimals: bool = True,
) -> float:
    """d1/SPG Countdown reward (module docstring): 0, ``wrong_numbers_reward``, ``wrong_result_reward`` or 1.
    ``decimals=False``: an answer with a ``.`` counts as wrong numbers (the reference allows it)."""
    try:
        block = last_answer_block(completion)
        if block is None:
            return 0.0
        expr = block.strip()
        if not uses_exactly(expr, numbers) or (not decimals and "." in expr):
            return wrong_numbers_reward
        value = safe_eval(expr)
        if value is None:
            return wrong_result_reward
        return 1.0 if abs(value - target) < TOLERANCE else wrong_result_reward
    except Exception:  # untrusted text must never crash a training step
        return 0.0


_EXPR_EQUALS = re.compile(r"[0-9+\-*/() ]+")


def eval_expression(text: str, reference: bool = False) -> str:
    """The expression the evaluation extracts from ``text`` (module docstring). ``reference``: as d1's
    ``parse_countdown_answers`` does, where text without any box is read whole (not its answer block)."""
    eq = reference_boxed(text) if reference else last_boxed(text)
    if eq is None:
        block = first_answer_block(text)
        eq = block.strip() if block is not None else text
    eq = eq.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    lhs = equals_lhs(eq)
    return eq if lhs is None else lhs.strip()


def equals_lhs(text: str) -> str | None:
    """Group 1 of ``re.search(r"([0-9+\\-*/() ]+)=[0-9. ]+", text)``, in linear time (else ``None``).

    The match is the first maximal run of those characters that is followed by ``=`` and one of
    ``0-9. `` (a run is maximal because ``=`` is not in the class, so backtracking cannot shorten it).
    """
    for m in _EXPR_EQUALS.finditer(text):
        end = m.end()
        if text[end : end + 1] == "=" and text[end + 1 : end + 2] and text[end + 1] in "0123456789. ":
            return m.group()
    return None


def countdown_eval_correct(text: str, numbers: Sequence[int], target: int | float | None, parser: str = "eval",
                           decimals: bool = True) -> bool:
    """Reference evaluation: 1 iff the extracted expression uses exactly ``numbers`` and hits ``target``.
    ``parser="reward"``: 1 iff the training reward is 1.0. ``decimals=False``: an expression with a ``.`` is
    incorrect (module docstring)."""
    try:
        if parser == "reward":
            return target is not None and countdown_reward(text, numbers, target, decimals=decimals) == 1.0
        expr = eval_expression(text, reference=parser == "reference")
        if target is None or not uses_exactly(expr, numbers) or (not decimals and "." in expr):
            return False
        value = safe_eval(expr.strip())
        return value is not None and abs(value - target) < TOLERANCE
    except Exception:
        return False


class CountdownTask(Task):
    """Countdown, 3 numbers (module docstring has the details).

    Args:
        num_train: number of generated training problems.
        seed: generator seed.
        number_range: ``[lo, hi]`` of the given numbers (reference ``[1, 100]``).
        target_range: ``[lo, hi]`` of the targets (reference ``[1, 100]``).
        test_size: ``None`` (default): d1's ``countdown_cd3_test.jsonl``; an int: that many generated test
            problems (ids ``countdown-test-<i>``, RNG ``(seed, "test", i)``, same ranges), for miniature
            ranges that d1's file does not cover. Training problems equal to a test problem are skipped either way.
        ordered: generated problems (training, and the test split with ``test_size``) all have a solution that
            keeps the numbers in the order given (``5,9,6>8``: ``5+9-6``); any order still scores. A smaller
            task, for a policy that cannot learn to move numbers around (docs/erils_countdown.md).
        wrong_numbers_reward: reward when the answer's numbers are not the given multiset (reference 0.1).
        wrong_result_reward: reward when the numbers are right but the expression is not evaluable or
            misses the target (reference 0.1).
        decimals: whether an answer may glue given digits into a decimal (``1.5*2``); the reference allows it
            (default), ``False`` scores it as wrong numbers in the reward and incorrect in the evaluation.
        **kwargs: prompt/reward options of :class:`~lit_rl.tasks.base.Task`.
    """

    name = "countdown"
    max_reward = 1.0
    SYSTEM_PROMPTS = {"d1_train": SYSTEM_PROMPT, "d1_eval": CTD_EVAL_SYSTEM_PROMPT}
    QUESTION_TEMPLATES = {"d1_train": COUNTDOWN_TRAIN_TEMPLATE, "d1_eval": COUNTDOWN_EVAL_TEMPLATE}
    JOINERS = {"d1_train": "\n", "d1_eval": "\n\n"}

    @staticmethod
    def check_args(num_train: int = 10000, number_range: Sequence[int] = NUMBER_RANGE,
                   target_range: Sequence[int] = TARGET_RANGE, test_size: int | None = None,
                   ordered: bool = False) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`); the
        prompt options' are :meth:`Task.check_args`."""
        if num_train < 0:
            raise FieldError("num_train", f"must be >= 0, got {num_train}")
        for key, rng in (("number_range", number_range), ("target_range", target_range)):
            if (not isinstance(rng, (list, tuple)) or len(rng) != 2 or not all(as_int(x) is not None for x in rng)
                    or int(rng[0]) > int(rng[1])):
                raise FieldError(key, f"must be [lo, hi] with integers lo <= hi, got {short_repr(rng)}")
        if int(number_range[0]) < 1:
            raise FieldError("number_range", f"numbers must be >= 1, got {short_repr(number_range)}")
        if test_size is not None and (as_int(test_size) is None or as_int(test_size) < 1):
            raise FieldError("test_size",
                             f"must be null (d1's test file) or an integer >= 1, got {short_repr(test_size)}")
        if ordered and test_size is None:
            raise FieldError("ordered", "needs a generated test split (test_size): d1's test file has problems "
                                        "without a solution in the given order")

    def __init__(
        self,
        num_train: int = 10000,
        seed: int = 0,
        wrong_numbers_reward: float = 0.1,
        wrong_result_reward: float = 0.1,
        number_range: Sequence[int] = NUMBER_RANGE,
        target_range: Sequence[int] = TARGET_RANGE,
        test_size: int | None = None,
        ordered: bool = False,
        decimals: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        CountdownTask.check_args(num_train=num_train, number_range=number_range, target_range=target_range,
                                 test_size=test_size, ordered=ordered)
        self.num_train, self.seed = num_train, seed
        self.number_range = (int(number_range[0]), int(number_range[1]))
        self.target_range = (int(target_range[0]), int(target_range[1]))
        self.test_size = None if test_size is None else as_int(test_size)
        self.ordered, self.decimals = bool(ordered), bool(decimals)
        self._keys: frozenset[tuple[tuple[int, ...], int]] | None = None
        self.wrong_numbers_reward, self.wrong_result_reward = float(wrong_numbers_reward), float(wrong_result_reward)
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None

    def _example(self, id: str, numbers: Sequence[int], target: int) -> Example:
        numbers = [int(n) for n in numbers]
        return Example(
            id=id,
            question=self.format_question(numbers=numbers, target=target),
            answer=(numbers, int(target)),
            meta={"numbers": numbers, "target": int(target)},
        )

    def train_problem(self, i: int) -> tuple[list[int], int]:
        """``(numbers, target)`` of training problem ``i`` (independent of ``num_train``)."""
        rng = random.Random(f"lit_rl/countdown/{self.seed}/{i}")
        test = self._test_keys()
        for _ in range(10_000):
            try:
                numbers, target = generate_problem(rng, self.number_range, self.target_range, ordered=self.ordered)
            except ValueError as e:
                raise FieldError("target_range", str(e)) from None
            if (tuple(sorted(numbers)), target) not in test:
                return numbers, target
        raise FieldError("test_size", f"the {len(test)} test problems leave no other problem in these ranges "
                                      f"(number_range {list(self.number_range)}, "
                                      f"target_range {list(self.target_range)})")

    def test_problems(self) -> tuple[tuple[tuple[int, ...], int], ...]:
        """``(numbers, target)`` of the test split: d1's file, or ``test_size`` generated problems."""
        if self.test_size is None:
            return read_cd3_test()
        return _generated_test(self.seed, self.test_size, self.number_range, self.target_range, self.ordered)

    def _test_keys(self) -> frozenset[tuple[tuple[int, ...], int]]:
        if self.test_size is None:
            return _test_keys()
        if self._keys is None:
            self._keys = frozenset((tuple(sorted(n)), t) for n, t in self.test_problems())
        return self._keys

    def train_examples(self) -> list[Example]:
        if self._train is None:
            self._train = [self._example(f"countdown-train-{i}", *self.train_problem(i)) for i in range(self.num_train)]
        return self._train

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            self._eval = [self._example(f"countdown-test-{i}", n, t) for i, (n, t) in enumerate(self.test_problems())]
        return self._eval

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"countdown-record-{index}")
        if isinstance(ground_truth, (list, tuple)) and len(ground_truth) == 2:
            (numbers, target), fields = ground_truth, ("ground_truth[0]", "ground_truth[1]")
        elif isinstance(ground_truth, dict):
            numbers, target = ground_truth.get("numbers"), ground_truth.get("target")
            fields = ("ground_truth['numbers']", "ground_truth['target']")
        else:  # the reference falls back to the question text
            m_num = re.search(r"Numbers: \[([\d, ]+)\]", question, re.IGNORECASE)
            m_tgt = re.search(r"Target: (\d+)", question, re.IGNORECASE)
            if not (m_num and m_tgt):
                raise ValueError(f"'ground_truth' must be [numbers, target] or {{'numbers', 'target'}}, "
                                 f"got {short_repr(ground_truth)}")
            numbers, target = [x for x in m_num.group(1).split(",") if x.strip()], m_tgt.group(1)
            fields = ("question (Numbers: [...])", "question (Target: ...)")
        ints = [as_int(n) for n in numbers] if isinstance(numbers, (list, tuple)) else [None]
        if not ints or None in ints:
            raise ValueError(f"'{fields[0]}' must be a non-empty list of integers (|x| < 1e15), "
                             f"got {short_repr(numbers)}")
        value: int | float | None = as_int(target)
        if value is None and isinstance(target, float) and math.isfinite(target) and abs(target) < MAX_ABS:
            value = target  # a non-integral target is kept as is
        if value is None:
            raise ValueError(f"'{fields[1]}' must be a finite number (|x| < 1e15), got {short_repr(target)}")
        return Example(id=rid, question=question, answer=(ints, value), meta={"numbers": ints, "target": value})

    @staticmethod
    def _numbers_target(example: Example) -> tuple[list[int], Any]:
        if "numbers" in example.meta and "target" in example.meta:
            return list(example.meta["numbers"]), example.meta["target"]
        numbers, target = example.answer
        return list(numbers), target

    def reward(self, completion: str, example: Example) -> float:
        try:
            numbers, target = self._numbers_target(example)
        except (TypeError, ValueError):
            return 0.0
        return countdown_reward(completion, numbers, target, self.wrong_numbers_reward, self.wrong_result_reward,
                                self.decimals)

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        try:
            numbers, target = self._numbers_target(example)
        except (TypeError, ValueError):
            return EvalScore(0, 1)
        if parser == "reward":
            ok = self.reward(completion, example) == 1.0
        else:
            ok = countdown_eval_correct(completion, numbers, target, parser, self.decimals)
        return EvalScore(int(ok), 1)

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        self._check_parser(parser)
        try:
            if parser == "reward":
                block = last_answer_block(completion)
                return None if block is None else block.strip()
            return eval_expression(completion, reference=parser == "reference")
        except Exception:
            return None
