"""``lit-rl score``: score saved generations with a task's evaluation (or reward) parser.

Usage::

    python -m lit_rl.score --task sudoku --generations eval_baselines/sudoku_*_generations.json
    python -m lit_rl.score --task countdown --generations gens.jsonl --parser reward

Input formats (chosen per file by content, not by name):

* d1's JSON: ``{"generations": [{"question": str, "generations": str, "ground_truth": ...}, ...], ...}``
  (what d1/SPG ``eval.py`` writes; other top-level keys are ignored). A file is read this way when it
  is one JSON object with a ``"generations"`` key.
* JSONL (ours): one object per line, ``{"prompt_id"?: str, "question": str, "completion": str,
  "ground_truth": ...}``; blank lines are skipped. Sudoku rows may also carry ``"puzzle"``.

``ground_truth`` per task: Sudoku, the 16-character solution (the puzzle is read from ``puzzle`` or from
the question, ``"... Sudoku puzzle: <16 digits>"`` or a question that starts with the 16 digits);
Countdown, ``[numbers, target]`` (or ``{"numbers", "target"}``); MATH500, the reference answer string.

Output: ONE JSON object on stdout::

    {"task", "parser", "files", "n", "correct", "total", "accuracy", "accuracy_pct", "mean_reward", "max_reward"}

``accuracy`` is a fraction in [0, 1], as every accuracy lit_rl prints or logs, pooled over all files:
``correct / total`` (``accuracy_pct``: the same in percent, as d1's tables print it) where the units are
problems (Countdown, MATH500) or blank cells (Sudoku cell accuracy). ``parser="eval"`` is the written
evaluation rules (docs/tasks.md); ``parser="reference"`` is d1's ``eval/parse_and_get_acc.py``, bugs included
(Countdown and MATH500 text without any ``\boxed`` is read whole instead of its ``<answer>`` block), so a
published table can be matched item by item; ``parser="reward"`` scores with the training reward's parsing
(Countdown: correct iff reward 1.0; MATH: the reward's correctness part). On d1's nine LLaDA-8B-Instruct
tables (3 tasks x L_gen 128/256/512) ``reference`` equals d1's code on every item; ``eval`` differs on one
item in each of two tables (Countdown and MATH500 at 128: a correct ``<answer>`` without a box).
``mean_reward`` is the mean training reward (docs/tasks.md) over all rows, whatever the parser.

Malformed input (unreadable file, bad JSON, missing field, ground truth of the wrong shape) exits with
code 2 and a one-line message on stderr that names the file and line (JSONL) or record index (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from lit_rl.tasks import TASKS, get_task
from lit_rl.tasks.base import PARSERS, Example, Task
from lit_rl.cli_args import LitArgumentParser

TASK_CHOICES = tuple(sorted(TASKS))  # prompts: PromptTask, exact <answer> match


class InputError(ValueError):
    """Malformed generation file; the message names the file and line/record."""


def _records(path: Path) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Yield ``(where, record, completion)`` for every row of a d1 JSON or JSONL generation file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None  # maybe JSONL whose first line is an object; else the line loop names the bad line
        if isinstance(data, dict) and "generations" in data:  # else: a one-line JSONL file
            gens = data.get("generations")
            if not isinstance(gens, list):
                raise InputError(f"{path}: d1 JSON needs a top-level 'generations' list")
            for i, rec in enumerate(gens):
                where = f"{path}: generations[{i}]"
                if not isinstance(rec, dict):
                    raise InputError(f"{where}: expected an object")
                completion = rec.get("generations")
                if not isinstance(completion, str):
                    raise InputError(f"{where}: 'generations' must be the completion string")
                yield where, rec, completion
            return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not valid JSON ({e.msg}); "
                             "expected d1 JSON or one JSON object per line") from None
        except RecursionError:
            raise InputError(f"{where}: not valid JSON (nested too deeply)") from None
        except ValueError as e:  # an integer past Python's 4300-digit limit
            raise InputError(f"{where}: not valid JSON ({str(e).split(':')[0]})") from None
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object")
        completion = rec.get("completion")
        if not isinstance(completion, str):
            raise InputError(f"{where}: 'completion' must be a string")
        yield where, rec, completion


def prediction_record(example: Example, completion: str, correct: float | None = None,
                      total: float | None = None) -> dict[str, Any]:
    """One JSONL line of this module's input format for ``completion`` of ``example`` (``predict`` writes
    them): ``prompt_id``, ``question``, ``completion``, ``ground_truth`` (``Example.answer``), the puzzle
    where the task has one, and the evaluation's ``correct`` / ``total`` when given."""
    answer = example.answer
    rec: dict[str, Any] = {
        "prompt_id": example.id,
        "question": example.question,
        "completion": completion,
        "ground_truth": list(answer) if isinstance(answer, tuple) else answer,
    }
    if "puzzle" in example.meta:
        rec["puzzle"] = example.meta["puzzle"]
    if correct is not None:
        rec["correct"], rec["total"] = correct, total
    return rec


def score_files(
    task: str | Task, paths: Sequence[str | Path], parser: str = "eval", details: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Score generation files (formats in the module docstring); raises :class:`InputError` on bad input.

    ``details``, if given, receives one entry per item (where it is, its id, the evaluation's correct and
    total, the training reward), so a total can be reconciled with a paper's table item by item.
    """
    if parser not in PARSERS:
        raise ValueError(f"parser={parser!r}: expected one of {PARSERS}")
    if isinstance(task, str):
        task = get_task(task)
    if not paths:
        raise InputError("no generation files given")
    n = 0
    correct = total = 0.0
    reward_sum = 0.0
    for p in paths:
        path = Path(p)
        n_before = n
        for where, rec, completion in _records(path):
            if "question" not in rec or "ground_truth" not in rec:
                raise InputError(f"{where}: needs 'question' and 'ground_truth'")
            extra = {k: rec[k] for k in ("prompt_id", "puzzle") if k in rec and rec[k] is not None}
            try:
                example = task.example_from_record(rec["question"], rec["ground_truth"], index=n, **extra)
            except ValueError as e:
                raise InputError(f"{where}: {e}") from None
            score = task.evaluate(completion, example, parser=parser)
            reward = task.reward(completion, example)
            correct += score.correct
            total += score.total
            reward_sum += reward
            n += 1
            if details is not None:
                details.append({
                    "where": where, "id": example.id, "extracted": task.extract(completion, example, parser=parser),
                    "correct": score.correct, "total": score.total, "reward": reward,
                })
        if n == n_before:  # an accuracy of 0.0 over nothing would pass for a result
            raise InputError(f"{path}: no generations in the file (empty): nothing to score")
    return {
        "task": task.name,
        "parser": parser,
        "files": [str(p) for p in paths],
        "n": n,
        "correct": correct,
        "total": total,
        "accuracy": round(correct / total, 6) if total else 0.0,
        "accuracy_pct": round(100.0 * correct / total, 4) if total else 0.0,
        "mean_reward": round(reward_sum / n, 6) if n else 0.0,
        "max_reward": task.max_reward,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = LitArgumentParser(
        prog="lit-rl score",
        description="Score saved generations (d1 JSON or our JSONL) with a task's evaluation or reward parser.",
    )
    ap.add_argument("--task", required=True, choices=TASK_CHOICES, help="task whose verifier to use")
    ap.add_argument("--generations", required=True, nargs="+", metavar="FILE", help="generation files, pooled")
    ap.add_argument(
        "--parser",
        default="eval",
        choices=PARSERS,
        help="'eval': the evaluation rules (docs/tasks.md); 'reference': d1's parse_and_get_acc.py, bugs included "
        "(to match published tables item by item); 'reward': training-reward parsing",
    )
    ap.add_argument("--details", metavar="FILE",
                    help="also write one JSON line per item: where, id, extracted answer, correct, total, reward")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad usage or malformed input)."""
    args = build_parser().parse_args(argv)
    details: list[dict[str, Any]] | None = [] if args.details else None
    try:
        result = score_files(args.task, args.generations, args.parser, details)
    except InputError as e:
        print(f"lit-rl score: error: {e}", file=sys.stderr)
        return 2
    if details is not None:
        from lit_rl.atomic import atomic_write_text

        atomic_write_text(args.details, "".join(json.dumps(d) + "\n" for d in details))
        result["details"] = args.details
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
