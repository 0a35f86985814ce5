"""4x4 Sudoku (ERILS App. C-B; d1/SPG reward and evaluation code).

Data. There are exactly 288 valid 4x4 grids (rows, columns and 2x2 boxes hold 1-4 once). SPG's split is
solution-disjoint: its test set (``spg/dataset/test_sudoku_split_new.csv``, 256 puzzles) uses 88 of the
grids and training uses only the other 200. SPG's training csv is not packaged (it is > 4 MB), so training
puzzles are generated here from those 200 grids: puzzle ``i`` (id ``sudoku-train-<i>``) comes from its own
RNG seeded by ``(seed, i)``, so it does not depend on ``num_train``; its grid is the ``i mod 200``-th grid of
a seeded permutation of the training grids (every grid equally often), it has a blank count drawn
uniformly from ``[min_blanks, max_blanks]`` (default 6-12, SPG's test set has 7-12) and a unique
solution (cells are blanked in random order, each only if the solution stays unique). d1's test set
(500 puzzles, 8 blanks) is also loadable (``eval_set="d1"``).

Reward (d1/SPG ``sudoku_reward_func``): the digits (``str.isdigit``) of the LAST ``<answer>...</answer>``
block, padded with ``'0'`` or cut to 16; the fraction of the puzzle's blank cells filled correctly. No
closed answer block, or no digit in it: 0.

Evaluation (``parse_sudoku_answers``, §5): see :func:`lit_rl.tasks.parsing.sudoku_eval_answer`; the score
is (correct blank cells, blank cells), pooled over a set by the caller.

Prompt (``prompt_style="d1_train"``, d1 ``data_utils.get_sudoku_questions``): ``SUDOKU_SYSTEM_PROMPT``,
a blank line, ``"Solve the following Sudoku puzzle: {puzzle}\\n"``. ``"d1_eval"`` is d1's eval prompt,
which has the same text. Template field: ``{puzzle}``.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import random
import re
from pathlib import Path
from typing import Any

from lit_rl.errors import FieldError
from lit_rl.tasks.base import DATA_DIR, EvalScore, Example, Task, read_utf8, record_fields, short_repr
from lit_rl.tasks.parsing import fit16, last_answer_block, sudoku_eval_answer

SUDOKU_SYSTEM_PROMPT = """
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, \
top-to-bottom, where '0' represents empty cells.

Rules:
- Fill empty cells with digits 1-4
- Each row must contain digits 1-4 exactly once
- Each column must contain digits 1-4 exactly once
- Each 2x2 box must contain digits 1-4 exactly once

Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final \
solved grid.

Respond in this exact format:
<reasoning>
Your step-by-step solving process
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""
SUDOKU_QUESTION_TEMPLATE = "Solve the following Sudoku puzzle: {puzzle}\n"

SPG_TEST_CSV = DATA_DIR / "spg" / "dataset" / "test_sudoku_split_new.csv"
D1_TEST_CSV = DATA_DIR / "d1" / "dataset" / "4x4_test_sudoku.csv"

# -- grids and a tiny exact solver ------------------------------------------------------------------------

_UNITS = (
    [[r * 4 + c for c in range(4)] for r in range(4)]
    + [[r * 4 + c for r in range(4)] for c in range(4)]
    + [[(br + r) * 4 + bc + c for r in range(2) for c in range(2)] for br in (0, 2) for bc in (0, 2)]
)


def is_valid_grid(grid: str) -> bool:
    """Whether ``grid`` is a complete valid 4x4 Sudoku (16 chars, every unit a permutation of 1-4)."""
    return len(grid) == 16 and all(sorted(grid[i] for i in unit) == ["1", "2", "3", "4"] for unit in _UNITS)


@functools.lru_cache(maxsize=1)
def all_grids() -> tuple[str, ...]:
    """The 288 valid 4x4 grids, in lexicographic order."""
    rows = ["".join(p) for p in itertools.permutations("1234")]
    grids: list[str] = []

    def extend(prefix: str) -> None:  # add rows that keep every column and box free of repeats
        if len(prefix) == 16:
            grids.append(prefix)
            return
        for row in rows:
            g = prefix + row
            if all(len({g[i] for i in unit if i < len(g)}) == sum(1 for i in unit if i < len(g)) for unit in _UNITS):
                extend(g)

    extend("")
    return tuple(sorted(grids))


@functools.lru_cache(maxsize=1)
def _cell_masks() -> dict[tuple[int, str], int]:
    # bit k of mask[(cell, digit)] is set when all_grids()[k] has `digit` at `cell`
    masks: dict[tuple[int, str], int] = {}
    for k, g in enumerate(all_grids()):
        for cell, d in enumerate(g):
            masks[(cell, d)] = masks.get((cell, d), 0) | (1 << k)
    return masks


def _candidates(puzzle: str) -> int:
    """Bitmask of the grids consistent with ``puzzle`` (any 4x4 solution is one of the 288 grids)."""
    if not isinstance(puzzle, str) or len(puzzle) != 16 or any(ch not in "01234" for ch in puzzle):
        raise ValueError(f"puzzle must be 16 characters from '01234' ('0' = blank), got {puzzle!r}")
    masks = _cell_masks()
    cand = (1 << len(all_grids())) - 1
    for cell, d in enumerate(puzzle):
        if d != "0":
            cand &= masks[(cell, d)]
    return cand


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Number of solutions of ``puzzle``, capped at ``limit`` (``limit=2`` answers "is it unique?")."""
    return min(_candidates(puzzle).bit_count(), limit)


def solve(puzzle: str) -> str | None:
    """A solution of ``puzzle`` (the lexicographically first if several), or ``None`` if it has none.

    >>> solve("3014002020004130")
    '3214142323414132'
    """
    cand = _candidates(puzzle)
    if not cand:
        return None
    return all_grids()[(cand & -cand).bit_length() - 1]


def grid_problem(puzzle: Any, solution: Any, puzzle_field: str = "Puzzle",
                 solution_field: str = "Solution") -> str | None:
    """What is wrong with a ``(puzzle, solution)`` pair (``None``: nothing): the puzzle must be 16 digits
    0-4 (``'0'`` = blank), the solution a valid grid of 16 digits 1-4 that keeps the puzzle's givens."""
    if not isinstance(puzzle, str) or len(puzzle) != 16 or any(ch not in "01234" for ch in puzzle):
        return f"field {puzzle_field!r} must be 16 digits 0-4 ('0' = blank), got {short_repr(puzzle)}"
    if not isinstance(solution, str) or len(solution) != 16 or any(ch not in "1234" for ch in solution):
        return f"field {solution_field!r} must be 16 digits 1-4, got {short_repr(solution)}"
    if not is_valid_grid(solution):
        return (f"field {solution_field!r} is not a valid 4x4 Sudoku (a row, column or box repeats a digit): "
                f"{solution!r}")
    wrong = [i for i in range(16) if puzzle[i] != "0" and puzzle[i] != solution[i]]
    if wrong:
        return (f"field {solution_field!r} ({solution}) contradicts the given of {puzzle_field!r} ({puzzle}) "
                f"at cell {wrong[0]}")
    return None


def read_sudoku_csv(path: str | Path) -> list[tuple[str, str]]:
    """``(puzzle, solution)`` rows of a ``Puzzle,Solution`` csv (d1/SPG format); ``ValueError`` naming the
    file, line and field on a malformed row (see :func:`grid_problem`)."""
    reader = csv.reader(io.StringIO(read_utf8(path), newline=""))
    header = next(reader, None)
    names = [h.strip() for h in header or []]
    if "Puzzle" not in names or "Solution" not in names:
        raise ValueError(f"{path}:1: the header must name the columns 'Puzzle' and 'Solution', "
                         f"got {short_repr(header)}")
    ip, isol = names.index("Puzzle"), names.index("Solution")
    rows = []
    for row in reader:
        if not any(cell.strip() for cell in row):  # blank line
            continue
        where = f"{path}:{reader.line_num}"
        if len(row) <= max(ip, isol):
            missing = "Puzzle" if len(row) <= ip else "Solution"
            raise ValueError(f"{where}: field {missing!r} missing (the row has {len(row)} field(s))")
        puzzle, solution = row[ip].strip(), row[isol].strip()
        problem = grid_problem(puzzle, solution)
        if problem:
            raise ValueError(f"{where}: {problem}")
        rows.append((puzzle, solution))
    return rows


@functools.lru_cache(maxsize=4)
def spg_train_grids(test_csv: str = str(SPG_TEST_CSV)) -> tuple[str, ...]:
    """The 200 grids that SPG's test split does not use (sorted): the only solutions training may use."""
    test_solutions = {sol for _, sol in read_sudoku_csv(test_csv)}
    return tuple(g for g in all_grids() if g not in test_solutions)


@functools.lru_cache(maxsize=8)
def _grid_order(seed: int) -> tuple[str, ...]:
    grids = list(spg_train_grids())
    random.Random(f"lit_rl/sudoku/order/{seed}").shuffle(grids)
    return tuple(grids)


def make_puzzle(grid: str, blanks: int, rng: random.Random, tries: int = 100) -> str:
    """A puzzle with exactly ``blanks`` blanks, solution ``grid`` and a unique solution.

    Blanks cells in random order, skipping cells whose removal would make the solution ambiguous; retries
    with a new order if it gets stuck. Raises ``ValueError`` when ``tries`` orders all fail.
    """
    for _ in range(tries):
        cells = list(range(16))
        rng.shuffle(cells)
        puzzle = list(grid)
        n = 0
        for cell in cells:
            if n == blanks:
                break
            puzzle[cell] = "0"
            if count_solutions("".join(puzzle)) == 1:
                n += 1
            else:
                puzzle[cell] = grid[cell]
        if n == blanks:
            return "".join(puzzle)
    raise ValueError(f"could not make a unique {blanks}-blank puzzle from {grid}")


def puzzle_from_question(question: str) -> str | None:
    """The puzzle in a d1 eval question: its first 16 characters if all digits, else the 16 digits after
    ``"Sudoku puzzle: "`` (reference ``parse_sudoku_answers``); ``None`` if neither."""
    if len(question) >= 16 and question[:16].isdigit():
        return question[:16]
    m = re.search(r"Sudoku puzzle: ([0-9]{16})", question)
    return m.group(1) if m else None


# -- scoring ------------------------------------------------------------------------------------------------


def _correct_cells(answer: str, solution: str, puzzle: str) -> tuple[int, int]:
    blanks = [i for i in range(16) if puzzle[i] == "0"]
    if not answer:
        return 0, len(blanks)
    answer = fit16(answer)
    return sum(1 for i in blanks if answer[i] == solution[i]), len(blanks)


def reward_answer(completion: str) -> str | None:
    """The training reward's answer: the digits of the last answer block (``None``: no block)."""
    block = last_answer_block(completion)
    if block is None:
        return None
    return "".join(ch for ch in block.strip() if ch.isdigit())


def sudoku_reward(completion: str, solution: str, puzzle: str) -> float:
    """d1/SPG Sudoku reward: fraction of blank cells filled correctly by the last answer block (0..1)."""
    try:
        answer = reward_answer(completion)
        if not answer:
            return 0.0
        correct, blanks = _correct_cells(answer, solution, puzzle)
        return correct / blanks if blanks else 0.0
    except Exception:  # untrusted text must never crash a training step
        return 0.0


def sudoku_eval_cells(completion: str, solution: str, puzzle: str, parser: str = "eval") -> tuple[int, int]:
    """(correct blank cells, blank cells) under the reference eval parsing (or the reward's parsing)."""
    blanks = puzzle.count("0")
    try:
        answer = (reward_answer(completion) or "") if parser == "reward" else sudoku_eval_answer(completion)
        return _correct_cells(answer, solution, puzzle)
    except Exception:
        return 0, blanks


class SudokuTask(Task):
    """4x4 Sudoku with SPG's solution-disjoint split (module docstring has the details).

    Args:
        eval_set: ``"spg"`` (256 puzzles, default) or ``"d1"`` (500 puzzles).
        num_train: number of generated training puzzles.
        min_blanks, max_blanks: blank-count range of training puzzles (inclusive).
        seed: generator seed (ids and puzzles are stable for a given seed).
        **kwargs: prompt/reward options of :class:`~lit_rl.tasks.base.Task`.
    """

    name = "sudoku"
    max_reward = 1.0
    SYSTEM_PROMPTS = {"d1_train": SUDOKU_SYSTEM_PROMPT, "d1_eval": SUDOKU_SYSTEM_PROMPT}
    QUESTION_TEMPLATES = {"d1_train": SUDOKU_QUESTION_TEMPLATE, "d1_eval": SUDOKU_QUESTION_TEMPLATE}
    JOINERS = {"d1_train": "\n\n", "d1_eval": "\n\n"}

    @staticmethod
    def check_args(eval_set: str = "spg", num_train: int = 10000, min_blanks: int = 6, max_blanks: int = 12) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`); the
        prompt options' are :meth:`Task.check_args`."""
        if eval_set not in ("spg", "d1"):
            raise FieldError("eval_set", f"must be 'spg' or 'd1', got {eval_set!r}")
        if not 1 <= min_blanks <= max_blanks <= 12:
            field = "min_blanks" if not 1 <= min_blanks <= max_blanks else "max_blanks"
            raise FieldError(field, f"min_blanks = {min_blanks}, max_blanks = {max_blanks}: need 1 <= min_blanks <= "
                             "max_blanks <= 12")
        if num_train < 0:
            raise FieldError("num_train", f"must be >= 0, got {num_train}")

    def __init__(
        self,
        eval_set: str = "spg",
        num_train: int = 10000,
        min_blanks: int = 6,
        max_blanks: int = 12,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        SudokuTask.check_args(eval_set=eval_set, num_train=num_train, min_blanks=min_blanks, max_blanks=max_blanks)
        self.eval_set, self.num_train, self.seed = eval_set, num_train, seed
        self.min_blanks, self.max_blanks = min_blanks, max_blanks
        self._train: list[Example] | None = None
        self._eval: list[Example] | None = None

    def _example(self, id: str, puzzle: str, solution: str) -> Example:
        return Example(id=id, question=self.format_question(puzzle=puzzle), answer=solution,
                       meta={"puzzle": puzzle, "solution": solution})

    def train_puzzle(self, i: int) -> tuple[str, str]:
        """``(puzzle, solution)`` of training puzzle ``i`` (independent of ``num_train``)."""
        grids = _grid_order(self.seed)
        rng = random.Random(f"lit_rl/sudoku/{self.seed}/{i}")
        grid = grids[i % len(grids)]
        # a unique-solution 4x4 puzzle needs at least 4 clues; greedy removal can stall before 12 blanks,
        # so fall back to fewer blanks (never below min_blanks) for the rare grid/order where it does
        for blanks in range(rng.randint(self.min_blanks, self.max_blanks), self.min_blanks - 1, -1):
            try:
                return make_puzzle(grid, blanks, rng), grid
            except ValueError:
                continue
        raise RuntimeError(f"no unique puzzle with >= {self.min_blanks} blanks for grid {grid}")

    def train_examples(self) -> list[Example]:
        if self._train is None:
            self._train = [self._example(f"sudoku-train-{i}", *self.train_puzzle(i)) for i in range(self.num_train)]
        return self._train

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            path = SPG_TEST_CSV if self.eval_set == "spg" else D1_TEST_CSV
            rows = read_sudoku_csv(path)
            self._eval = [self._example(f"sudoku-{self.eval_set}test-{i}", p, s) for i, (p, s) in enumerate(rows)]
        return self._eval

    def example_from_record(self, question: str, ground_truth: Any, index: int = 0, **extra: Any) -> Example:
        rid, question = record_fields(question, extra, f"sudoku-record-{index}")
        if "puzzle" in extra:
            puzzle, pfield = extra["puzzle"], "puzzle"
        else:
            puzzle, pfield = puzzle_from_question(question), "question"
            if puzzle is None:
                raise ValueError("no 16-digit puzzle in 'puzzle' or 'question' (expected 'Sudoku puzzle: <16 digits>')")
        problem = grid_problem(puzzle, ground_truth, pfield, "ground_truth")
        if problem:
            raise ValueError(problem)
        return Example(id=rid, question=question, answer=ground_truth,
                       meta={"puzzle": puzzle, "solution": ground_truth})

    @staticmethod
    def _puzzle_solution(example: Example) -> tuple[str, str]:
        return str(example.meta.get("puzzle", "")), str(example.meta.get("solution", example.answer))

    def reward(self, completion: str, example: Example) -> float:
        puzzle, solution = self._puzzle_solution(example)
        if len(puzzle) != 16 or len(solution) != 16:
            return 0.0
        return sudoku_reward(completion, solution, puzzle)

    def evaluate(self, completion: str, example: Example, parser: str = "eval") -> EvalScore:
        self._check_parser(parser)
        puzzle, solution = self._puzzle_solution(example)
        if len(puzzle) != 16 or len(solution) != 16:
            return EvalScore(0, 0)
        return EvalScore(*sudoku_eval_cells(completion, solution, puzzle, parser))

    def extract(self, completion: str, example: Example, parser: str = "eval") -> str | None:
        """The 16 cells compared (padded with ``0`` or cut, as both reference parsers do); ``None``: no answer.
        ``reference`` is ``eval`` here: lit_rl's patterns are d1's ``parse_sudoku_answers`` patterns."""
        self._check_parser(parser)
        try:
            answer = (reward_answer(completion) or "") if parser == "reward" else sudoku_eval_answer(completion)
            return fit16(answer) if answer else None
        except Exception:
            return None
