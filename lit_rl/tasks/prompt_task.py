"""Bring your own task: prompts from a local JSONL/Parquet file or a Hugging Face dataset, your own rewards.

:class:`PromptTask` turns any table of prompts into a lit_rl task that both algorithms (ERILS's
``RolloutDataModule``, double-rollout GRPO's ``ARRolloutDataModule``) and ``lit_rl score`` can use:

* **data**: ``train_path`` / ``eval_path`` (local ``.jsonl`` or ``.parquet``), or ``dataset`` (a Hugging Face
  dataset name or builder such as ``"json"``, with ``dataset_config``, ``train_split`` / ``eval_split`` and
  ``data_files``; needs ``datasets`` and, for hub datasets, the network);
* **columns**: ``prompt_column`` holds the question text or a list of chat messages (TRL's conversational
  form); ``answer_column`` the reference answer (optional); ``id_column`` a stable id (else the row number);
  ``columns`` renames others (``{"solution": "answer"}``). Every other column is passed to reward functions
  as a keyword argument, as TRL passes dataset columns;
* **verifier** (``answer_check``): ``"exact"`` (default): 1 when the last ``<answer>`` block, stripped, equals
  the answer; ``"math"``: the last ``\\boxed{}`` (else the ``<answer>`` block) equals it after lit_rl's
  Hendrycks-style normalisation; ``"math_verify"``: Hugging Face's ``math-verify`` (the ``math`` extra);
  ``"none"``: no verifier, the reward is the sum of ``reward_funcs`` alone;
* **rewards**: ``reward_funcs`` / ``reward_weights`` in TRL's signature add to the verifier (:class:`Task`).

Evaluation scores the verifier (``correct`` 0/1 of 1); with ``answer_check: none`` it scores the total
reward. Bad rows fail with the file and line (JSONL) or row number (Parquet, datasets) and the column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from lit_rl.errors import FieldError
from lit_rl.tasks.base import EvalScore, Example, Task, record_fields, short_repr
from lit_rl.tasks.parsing import last_answer_block

ANSWER_CHECKS = ("exact", "math", "math_verify", "none")


def _read_table(path: Path) -> list[tuple[str, dict[str, Any]]]:
    from lit_rl.tasks.math_task import _read_rows

    if not path.exists():
        raise FileNotFoundError(f"{path}: prompt file not found")
    return _read_rows(path)


def _math_verify(completion: str, answer: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:
        raise RuntimeError("answer_check: math_verify needs the `math-verify` package "
                           "(pip install 'lit-rl[math]')") from None
    try:
        return bool(verify(parse(f"${answer}$"), parse(completion)))
    except Exception:  # untrusted text must never crash a training step
        return False


class PromptTask(Task):
    """A task from your own prompts and rewards (module docstring has every option).

    Args:
        train_path, eval_path: local JSONL or Parquet files (one prompt per row).
        dataset: a Hugging Face dataset (name or builder) used for the splits without a local file.
        dataset_config: its configuration name.
        train_split, eval_split: its splits.
        data_files: ``data_files`` of ``datasets.load_dataset`` (e.g. for the ``json`` builder).
        prompt_column: the question text, or a list of chat messages.
        answer_column: the reference answer (needed unless ``answer_check`` is ``"none"``).
        id_column: a stable row id (default: ``<split>-<row number>``).
        columns: renames applied to every row first (``{"old": "new"}``).
        answer_check: ``"exact"``, ``"math"``, ``"math_verify"`` or ``"none"``.
        eval_size: keep only the first this many evaluation rows.
        name: the task's name in metric keys (``val/<name>/...``) and rollout pools.
        **kwargs: :class:`~lit_rl.tasks.base.Task`'s (``reward_funcs``, ``reward_weights``, ``system_prompt``...).
    """

    max_reward = 1.0

    @staticmethod
    def check_args(answer_column: str | None = "answer", answer_check: str = "exact") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`); the
        prompt options' are :meth:`Task.check_args`."""
        if answer_check not in ANSWER_CHECKS:
            raise FieldError("answer_check", f"must be one of {ANSWER_CHECKS}, got {answer_check!r}")
        if answer_check != "none" and not answer_column:
            raise FieldError("answer_column", f"is {answer_column!r}, but answer_check {answer_check!r} needs the "
                             "answer column (or set answer_check: none)")

    def __init__(
        self,
        train_path: str | None = None,
        eval_path: str | None = None,
        dataset: str | None = None,
        dataset_config: str | None = None,
        train_split: str = "train",
        eval_split: str = "test",
        data_files: str | list[str] | dict[str, Any] | None = None,
        prompt_column: str = "prompt",
        answer_column: str | None = "answer",
        id_column: str | None = None,
        columns: dict[str, str] | None = None,
        answer_check: str = "exact",
        eval_size: int | None = None,
        name: str = "prompts",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("system_prompt", "")
        kwargs.setdefault("question_template", "{question}")
        super().__init__(**kwargs)
        PromptTask.check_args(answer_column=answer_column, answer_check=answer_check)
        self.name = name
        self.train_path, self.eval_path, self.dataset = train_path, eval_path, dataset
        self.dataset_config, self.splits, self.data_files = (
            dataset_config, {"train": train_split, "eval": eval_split}, data_files)
        self.prompt_column, self.answer_column, self.id_column = prompt_column, answer_column, id_column
        self.columns = dict(columns or {})
        self.answer_check, self.eval_size = answer_check, eval_size
        self.correct_reward = 1.0
        self._cache: dict[str, list[Example]] = {}

    # -- data ----------------------------------------------------------------------------------------
    def _rows(self, which: str) -> list[tuple[str, dict[str, Any]]]:
        path = self.train_path if which == "train" else self.eval_path
        if path:
            return _read_table(Path(path))
        if not self.dataset:
            raise ValueError(f"PromptTask has no {which} data: set {which}_path or dataset")
        try:
            import datasets  # type: ignore[import-not-found]
        except ImportError:
            raise RuntimeError(f"PromptTask(dataset={self.dataset!r}) needs the `datasets` package") from None
        split = self.splits[which]
        try:
            rows = datasets.load_dataset(self.dataset, self.dataset_config, split=split, data_files=self.data_files)
        except Exception as e:
            raise RuntimeError(
                f"PromptTask(dataset={self.dataset!r}, split={split!r}) could not be loaded ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); use a local train_path / eval_path"
            ) from None
        return [(f"{self.dataset}[{split}] row {i + 1}", dict(r)) for i, r in enumerate(rows)]

    def _example(self, where: str, row: dict[str, Any], which: str, index: int) -> Example:
        row = {self.columns.get(k, k): v for k, v in row.items()}
        if self.prompt_column not in row:
            raise ValueError(f"{where}: no column {self.prompt_column!r} (prompt_column; the row has {sorted(row)})")
        prompt = row.pop(self.prompt_column)
        if not isinstance(prompt, (str, list)) or isinstance(prompt, list) and not all(
            isinstance(m, dict) and "content" in m for m in prompt
        ):
            raise ValueError(f"{where}: column {self.prompt_column!r} must be text or chat messages, "
                             f"got {short_repr(prompt)}")
        text = prompt if isinstance(prompt, str) else "".join(str(m.get("content") or "") for m in prompt)
        if not text.strip():
            raise ValueError(f"{where}: column {self.prompt_column!r} is empty: a prompt without text cannot be "
                             "trained on; fill it or remove the row")
        answer = None
        if self.answer_check != "none":
            if self.answer_column not in row or row[self.answer_column] is None:
                raise ValueError(f"{where}: no column {self.answer_column!r} (answer_column, needed by answer_check)")
            answer = str(row.pop(self.answer_column))
        rid = (str(row.pop(self.id_column)) if self.id_column and self.id_column in row
               else f"{self.name}-{which}-{index}")
        question = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        meta = {k: v for k, v in row.items()}
        if isinstance(prompt, list):
            meta["_messages"] = prompt
        return Example(id=rid, question=self.format_question(question=question), answer=answer, meta=meta)

    def _examples(self, which: str) -> list[Example]:
        if which not in self._cache:
            rows = self._rows(which)
            examples = [self._example(where, row, which, i) for i, (where, row) in enumerate(rows)]
            first: dict[str, str] = {}
            for (where, _), e in zip(rows, examples):
                if e.id in first:  # the ledger, the pool and score --details key on the id
                    raise ValueError(f"{where}: id {e.id!r} repeats {first[e.id]} ({self.id_column or 'id'}): "
                                     "prompt ids must be unique")
                first[e.id] = where
            if which == "eval" and self.eval_size is not None:
                examples = examples[: self.eval_size]
            self._cache[which] = examples
        return self._cache[which]

    def train_examples(self) -> list[Example]:
        return self._examples("train")

    def eval_examples(self) -> list[Example]:
        return self._examples("eval")

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The row's own chat messages when its prompt was conversational, else the task's (system) prompt."""
        own = example.meta.get("_messages")
        return [dict(m) for m in own] if own else super().messages(example)

    def reward_kwargs(self, examples: Sequence[Example]) -> dict[str, list[Any]]:
        """TRL's columns; the answer column reaches reward functions under its own name too (``solution`` for
        ``answer_column: solution``), as TRL passes every dataset column, besides lit_rl's ``answer``."""
        kw = super().reward_kwargs(examples)
        kw.pop("_messages", None)
        if self.answer_column and self.answer_column != "answer" and self.answer_check != "none":
            kw.setdefault(self.answer_column, kw["answer"])
        return kw

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"{self.name}-record-{index}")
        return Example(id=rid, question=question, answer=None if ground_truth is None else str(ground_truth))

    # -- scoring -------------------------------------------------------------------------------------
    def _correct(self, completion: str, answer: str) -> bool:
        if self.answer_check == "exact":
            block = last_answer_block(completion)
            return block is not None and block.strip() == answer.strip()
        if self.answer_check == "math":
            from lit_rl.tasks.math_task import math_eval_correct

            return math_eval_correct(completion, answer, "eval")
        return _math_verify(completion, answer)

    def reward(self, completion: str, example: Example) -> float:
        if self.answer_check == "none" or example.answer is None:
            return 0.0
        try:
            return 1.0 if self._correct(completion, str(example.answer)) else 0.0
        except Exception:  # verifiers never raise
            return 0.0

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        if self.answer_check == "none":
            return EvalScore(self.total_reward(completion, example), 1.0)
        return EvalScore(self.reward(completion, example), 1.0)

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        """What ``answer_check`` compares: the last ``<answer>`` block (``exact``), the MATH500 rule's answer
        (``math``); ``None`` for ``math_verify`` (it parses the whole text) and ``none``."""
        self._check_parser(parser)
        try:
            if self.answer_check == "exact":
                block = last_answer_block(completion)
                return None if block is None else block.strip()
            if self.answer_check == "math":
                from lit_rl.tasks.math_task import math_eval_answer

                return math_eval_answer(completion)
        except Exception:
            return None
        return None
