"""MATH with MATH500 evaluation (ERILS App. C-B; d1/SPG reward and evaluation code).

Data. Evaluation: ``lit_rl/data/math500/test.jsonl`` (the canonical 500-problem split; ids
``math500-test-<i>``). Training (ids ``math-train-<i>``): a local JSONL or Parquet file (``train_path``),
or a Hugging Face dataset name (``train_dataset``, d1/SPG use ``ankner/math-500`` split ``train``) when
``datasets`` is installed and the hub is reachable. Each row needs the problem (``problem_field``) and
either a short answer (``answer_field``) or a worked solution with a ``\\boxed{}`` (``solution_field``).

Reward (d1/SPG ``correctness_reward_func_math`` + ``boxed_and_answer_tags_format_reward``, max 3.0):

* correctness 2.0 when the content of the response's last ``\\boxed{}`` (:func:`lit_rl.tasks.parsing.
  last_boxed`) ``is_equiv`` (Hendrycks normalisation) the reference answer; no box, or braces that never
  balance: no correctness reward. (The reference code then compares the whole response, so a bare
  ``"42"`` would count there; §4 says "the last ``\\boxed{}``", which we follow.) The reference answer goes
  through the reference extraction (identity for short answers, the boxed part of a worked solution).
* format: 1.0 (``<answer>`` with ``\\boxed`` inside its first block), 0.75 (``<answer>`` without a box
  there), 0.5 (box without ``<answer>``), 0.25 otherwise. The block is the text after the first
  ``<answer>`` up to the next ``</answer>`` or ``<answer>``. (d1's code writes ``"\\boxed"`` in a plain
  string, i.e. a backspace character, so its box test is never true there; we implement the intended
  test that docs/tasks.md spells out.)

Evaluation (``parse_math_answers``, §5): the content of the last ``\\boxed{}``; if there is none, it is
empty or its braces never balance, the first ``<answer>`` block (stripped); compared with ``is_equiv``.
(For text with no box at all the reference code compares the whole text instead of the answer block;
``parser="reference"`` does that, to match d1's tables item by item: 26.00 / 32.40 / 36.20 at L_gen
128 / 256 / 512, where ``eval`` gives 26.20 / 32.40 / 36.20.) ``parser="reward"`` uses the reward's correctness instead.

Prompts: ``"d1_train"`` (default) is d1 ``data_utils.get_math_questions`` (generic format prompt, a blank
line, "You are a math expert ... Wrap the final answer in a \\boxed{}." and the problem); ``"d1_eval"`` is
d1's MATH500 eval prompt. Template field: ``{problem}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_rl.tasks.base import DATA_DIR, EvalScore, Example, Task, read_jsonl, record_fields, short_repr
from lit_rl.tasks.math_normalize import is_equiv
from lit_rl.tasks.parsing import CLOSE, OPEN, first_answer_block, has_box, last_boxed, reference_boxed

SYSTEM_PROMPT = """
Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>
"""
MATH_TRAIN_TEMPLATE = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}. \n\n{problem}"
)
MATH500_EVAL_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final "
    "answer in a \\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    '<answer>\n\\boxed{...}\n</answer>" \n'
)
MATH500_TEST_JSONL = DATA_DIR / "math500" / "test.jsonl"

CORRECT_REWARD = 2.0


def reference_answer(answer: str) -> str:
    """The comparable part of a ground-truth answer: its last box if it has one, else itself."""
    if has_box(answer):
        boxed = reference_boxed(answer)
        if boxed is not None:
            return boxed
    return answer


def math_correct(completion: str, answer: str) -> bool:
    """Reward correctness test (d1 ``correctness_reward_func_math``)."""
    try:
        got = last_boxed(completion)
        return got is not None and is_equiv(got, reference_answer(answer))
    except Exception:
        return False


def math_format_reward(completion: str) -> float:
    """d1 ``boxed_and_answer_tags_format_reward``: 1.0 / 0.75 / 0.5 / 0.25 (module docstring)."""
    a = completion.find(OPEN)
    if a < 0:
        tag, region = 0.0, completion
    else:
        # r.split("<answer>")[1].split("</answer>")[0]
        nxt = completion.find(OPEN, a + len(OPEN))
        seg = completion[a + len(OPEN) : nxt if nxt >= 0 else len(completion)]
        tag, region = 1.0, seg.split(CLOSE, 1)[0]
    box = 1.0 if "\\boxed" in region else 0.5
    return 0.5 * (tag + box)


def math_reward(completion: str, answer: str) -> float:
    """Correctness (0 or 2.0) plus format (0.25..1.0); max 3.0."""
    try:
        return (CORRECT_REWARD if math_correct(completion, answer) else 0.0) + math_format_reward(completion)
    except Exception:  # untrusted text must never crash a training step
        return 0.0


def math_eval_answer(text: str, reference: bool = False) -> str | None:
    """The answer the MATH500 evaluation extracts (``None``: nothing). ``reference``: as d1's
    ``parse_math_answers`` does, where text without any box is compared whole (not its answer block)."""
    parsed = reference_boxed(text) if reference else last_boxed(text)
    if not parsed:
        block = first_answer_block(text)
        if block is not None:
            parsed = block.strip()
    return parsed


def math_eval_correct(text: str, answer: str, parser: str = "eval") -> bool:
    try:
        if parser == "reward":
            return math_correct(text, answer)
        parsed = math_eval_answer(text, reference=parser == "reference")
        return parsed is not None and is_equiv(parsed, answer)
    except Exception:
        return False


def _read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` pairs of a JSONL or Parquet file; ``where`` is ``"<file>:<line>"`` (JSONL) or
    ``"<file> row <n>"`` (Parquet)."""
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow's errors on a corrupt file do not name it
            raise ValueError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
        return [(f"{path} row {i + 1}", row) for i, row in enumerate(rows)]
    return list(read_jsonl(path))


class MathTask(Task):
    """MATH training, MATH500 evaluation (module docstring has the details).

    Args:
        train_path: local JSONL (one object per line) or Parquet file with the training problems.
        train_dataset: Hugging Face dataset name (used when ``train_path`` is not set; needs ``datasets``).
        train_split: split of ``train_dataset``.
        problem_field: column holding the problem text.
        answer_field: column holding the short reference answer.
        solution_field: column holding a worked solution with ``\\boxed{}`` (used when a row has no answer).
        eval_path: MATH500-format JSONL to evaluate on (default: the packaged MATH500 test set).
        **kwargs: prompt/reward options of :class:`~lit_rl.tasks.base.Task`.
    """

    name = "math500"
    max_reward = 3.0
    correct_reward = 2.0  # 2.0 for a correct boxed answer + up to 1.0 format credit
    SYSTEM_PROMPTS = {"d1_train": SYSTEM_PROMPT, "d1_eval": MATH500_EVAL_SYSTEM_PROMPT}
    QUESTION_TEMPLATES = {"d1_train": MATH_TRAIN_TEMPLATE, "d1_eval": "{problem}"}
    JOINERS = {"d1_train": "\n\n", "d1_eval": "\n\n"}

    def __init__(
        self,
        train_path: str | None = None,
        train_dataset: str | None = None,
        train_split: str = "train",
        problem_field: str = "problem",
        answer_field: str = "answer",
        solution_field: str = "solution",
        eval_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.train_path, self.train_dataset, self.train_split = train_path, train_dataset, train_split
        self.problem_field, self.answer_field, self.solution_field = problem_field, answer_field, solution_field
        self.eval_path = Path(eval_path) if eval_path else MATH500_TEST_JSONL
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None

    def _rows_to_examples(self, rows: list[tuple[str, dict[str, Any]]], split: str) -> list[Example]:
        """Examples of ``(where, row)`` pairs; ``ValueError`` naming ``where`` and the field on a bad row."""
        out = []
        for i, (where, row) in enumerate(rows):
            problem = row.get(self.problem_field)
            if not isinstance(problem, str) or not problem.strip():
                raise ValueError(f"{where}: missing problem field {self.problem_field!r} (set problem_field=...)")
            answer = row.get(self.answer_field)
            if isinstance(answer, int) and not isinstance(answer, bool):
                answer = str(answer)
            elif answer is not None and not isinstance(answer, str):
                raise ValueError(f"{where}: answer field {self.answer_field!r} must be a string, "
                                 f"got {type(answer).__name__}")
            if answer is None or not answer.strip():
                solution = row.get(self.solution_field)
                if not isinstance(solution, str) or not has_box(solution) or reference_boxed(solution) is None:
                    raise ValueError(
                        f"{where}: no answer field {self.answer_field!r} and no \\boxed{{}} answer in "
                        f"solution field {self.solution_field!r} (set answer_field=... or solution_field=...)"
                    )
                answer = reference_answer(solution)
            meta = {k: row[k] for k in ("unique_id", "level", "subject") if k in row}
            prefix = "math500" if split == "test" else "math"
            out.append(Example(id=f"{prefix}-{split}-{i}", question=self.format_question(problem=problem),
                               answer=answer, meta=meta))
        return out

    def train_examples(self) -> list[Example]:
        if self._train is not None:
            return self._train
        if self.train_path:
            path = Path(self.train_path)
            if not path.exists():
                raise FileNotFoundError(f"MathTask(train_path={self.train_path!r}): file not found")
            self._train = self._rows_to_examples(_read_rows(path), "train")
        elif self.train_dataset:
            try:
                import datasets  # type: ignore[import-not-found]
            except ImportError:
                raise RuntimeError(
                    f"MathTask(train_dataset={self.train_dataset!r}) needs the `datasets` package; install it "
                    "or set train_path to a local JSONL/Parquet file"
                ) from None
            try:
                rows = list(datasets.load_dataset(self.train_dataset, split=self.train_split))
            except Exception as e:
                raise RuntimeError(
                    f"MathTask(train_dataset={self.train_dataset!r}, train_split={self.train_split!r}) could not "
                    f"be loaded ({type(e).__name__}: {e}); set train_path to a local JSONL/Parquet file"
                ) from None
            self._train = self._rows_to_examples([(f"{self.train_dataset} row {i + 1}", r) for i, r in enumerate(rows)],
                                                 "train")
        else:
            raise ValueError(
                "MathTask has no training data: set train_path (local JSONL/Parquet with fields "
                f"{self.problem_field!r} and {self.answer_field!r} or {self.solution_field!r}) or train_dataset "
                "(a Hugging Face dataset name such as 'ankner/math-500'; needs `datasets` and network)"
            )
        return self._train

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            self._eval = self._rows_to_examples(_read_rows(self.eval_path), "test")
        return self._eval

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"math500-record-{index}")
        if not isinstance(ground_truth, str):
            raise ValueError(f"'ground_truth' must be the reference answer string, got {short_repr(ground_truth)}")
        return Example(id=rid, question=question, answer=ground_truth)

    def reward(self, completion: str, example: Example) -> float:
        return math_reward(completion, str(example.answer))

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        return EvalScore(int(math_eval_correct(completion, str(example.answer), parser)), 1)

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        self._check_parser(parser)
        try:
            return last_boxed(completion) if parser == "reward" else math_eval_answer(completion, parser == "reference")
        except Exception:
            return None
