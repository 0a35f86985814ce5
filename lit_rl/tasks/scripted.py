"""Scripted external policies: short, correct reasoning traces written by a program.

They stand in for the strong AR model of ERILS on the embedded CPU default, so the demo needs no large
model. Each writes the ERILS output format ``<reasoning>...</reasoning>\\n<answer>...</answer>``.

* Sudoku: a compact deduction trace. Cells are filled in the order a human would find them (a blank
  with a single candidate first; when none has one, the first blank takes its solution value), each step
  written ``rcd`` (row, column, digit, 1-based; no separators, so a 12-blank trace and its answer fit
  the embedded default's 64-token completions), then the 16-digit solution.
* Countdown: a short search trace over pairs (``a+b=c``, ...), then the expression that hits the target.

``error_rate`` makes the scripted policy wrong on purpose (one answer digit / operator changed), so that
external rewards are not all 1.0 — as with a real external model.

The task registry (:mod:`lit_rl.tasks.registry`) names each task's trace styles. Also here:
:func:`verbose_trace` (the scripted backend's wordy first stage); :func:`lit_rl.tasks.registry.format_warmup_text`, the
format-only completions of the tiny model's warm-up (random reasoning of varying length, an answer that copies the
givens), which teach the format but not the task.
"""

from __future__ import annotations

import itertools
import random
import re
from fractions import Fraction

from lit_rl.tasks.base import Example
from lit_rl.tasks.chainsum import chainsum_completion, chainsum_verbose_completion  # noqa: F401  (re-exported: every scripted writer)


def _candidates(grid: list[int], idx: int) -> set[int]:
    r, c = divmod(idx, 4)
    br, bc = (r // 2) * 2, (c // 2) * 2
    seen = {grid[r * 4 + j] for j in range(4)} | {grid[i * 4 + c] for i in range(4)}
    seen |= {grid[(br + i) * 4 + bc + j] for i in range(2) for j in range(2)}
    return {1, 2, 3, 4} - seen


def sudoku_trace(puzzle: str, solution: str, rng: random.Random) -> list[tuple[int, int, int]]:
    """Deduction order ``[(row, col, digit), ...]`` (1-based) for the blanks of ``puzzle``."""
    grid = [int(ch) for ch in puzzle]
    steps = []
    while 0 in grid:
        blanks = [i for i, v in enumerate(grid) if v == 0]
        singles = [i for i in blanks if len(_candidates(grid, i)) == 1]
        idx = rng.choice(singles) if singles else blanks[0]
        grid[idx] = int(solution[idx])
        steps.append((idx // 4 + 1, idx % 4 + 1, grid[idx]))
    return steps


def sudoku_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """A scripted Sudoku completion for ``example`` (``meta["puzzle"]``, ``answer`` = solution)."""
    puzzle, solution = example.meta["puzzle"], str(example.answer)
    steps = sudoku_trace(puzzle, solution, rng)
    answer = list(solution)
    if error_rate > 0 and rng.random() < error_rate:
        blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
        i = rng.choice(blanks)
        answer[i] = rng.choice([d for d in "1234" if d != answer[i]])
    trace = "".join(f"{r}{c}{d}" for r, c, d in steps)
    return f"<reasoning>{trace}</reasoning>\n<answer>{''.join(answer)}</answer>"


def sudoku_grid_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """A fixed-length Sudoku trace: the solution grid cell by cell (givens copied, blanks filled), then the
    same 16 digits as the answer.

    Made for tiny *causal* LMs: every trace token sits at a fixed offset from the prompt cell it depends
    on (16 prompt digits before, the trace's own earlier digits) and the answer repeats the trace at a fixed
    offset. The deduction trace of :func:`sudoku_completion` has a variable length, so writing its answer
    means copying the givens from a variable distance, which a 1M-parameter causal LM with rotary
    positions did not learn in 1,000 SFT steps (eval reward stayed at chance, 0.25-0.29), while this trace
    reached 0.42 greedy / 0.30 sampled in 250 steps. ``error_rate``: on that share of traces one blank is
    wrong in both the trace and the answer (a reasoning error, not a copying error).
    """
    puzzle, solution = example.meta["puzzle"], str(example.answer)
    grid = list(solution)
    if error_rate > 0 and rng.random() < error_rate:
        blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
        i = rng.choice(blanks)
        grid[i] = rng.choice([d for d in "1234" if d != grid[i]])
    g = "".join(grid)
    return f"<reasoning>{g}</reasoning>\n<answer>{g}</answer>"


def sudoku_grid_verbose_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """The *uncontrolled-length* counterpart of :func:`sudoku_grid_completion` (ERILS Fig. 1(b) / Fig. 4): the
    trace first restates the puzzle, then writes the solution grid, then checks it column by column (the
    grid transposed), and the answer is the grid: 16·3 trace digits, 69 char-tokens. That is what an
    external model writes without the length instruction (restating the problem, repeating checks), and
    it is longer than the embedded policy's L_gen of 48 while the solution, fixed-length and at fixed
    offsets, is the same as the length-controlled trace's. ``error_rate``: as the grid trace (one blank
    wrong in the grid, its column check and the answer).
    """
    puzzle = example.meta["puzzle"]
    short = sudoku_grid_completion(example, rng, error_rate)
    g = short[len("<reasoning>"):].split("</reasoning>")[0]  # (16,) the solution grid as written
    columns = "".join(g[r * 4 + c] for c in range(4) for r in range(4))
    return f"<reasoning>{puzzle}{g}{columns}</reasoning>\n<answer>{g}</answer>"


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": lambda a, b: a / b if b else None}


def countdown_search(numbers: list[int], target: int, rng: random.Random,
                     max_steps: int = 6) -> tuple[list[str], str | None]:
    """Short search over ``(a op b) op c`` orders; returns (trace lines, expression or None)."""
    tried: list[str] = []
    orders = list(itertools.permutations(range(3)))
    rng.shuffle(orders)
    found = None
    for i, j, k in orders:
        a, b, c = (Fraction(numbers[i]), Fraction(numbers[j]), Fraction(numbers[k]))
        for op1, op2 in itertools.product(_OPS, repeat=2):
            ab = _OPS[op1](a, b)
            if ab is None:
                continue
            v = _OPS[op2](ab, c)
            if v is None:
                continue
            expr = f"({numbers[i]}{op1}{numbers[j]}){op2}{numbers[k]}"
            if v == target:
                found = expr
                tried.append(f"{expr}={target}")
                return tried[-max_steps:], found
            if ab.denominator == 1 and len(tried) < 64 and rng.random() < 0.05:
                tried.append(f"{numbers[i]}{op1}{numbers[j]}={int(ab)}")
    return tried[-max_steps:], found


def countdown_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """A scripted Countdown completion (``answer`` = ``(numbers, target)``)."""
    numbers, target = example.answer
    numbers = [int(n) for n in numbers]
    trace, expr = countdown_search(numbers, int(target), rng)
    if expr is None:
        expr = "+".join(str(n) for n in numbers)
    elif error_rate > 0 and rng.random() < error_rate:
        for op in "+-*/":
            if op in expr:
                expr = expr.replace(op, rng.choice([o for o in "+-*" if o != op]), 1)
                break
    return f"<reasoning>{', '.join(trace)}</reasoning>\n<answer>{expr}</answer>"


def _try_rows(numbers, ordered: bool) -> list[tuple[str, str, Fraction]]:
    """The expressions of three numbers with a value (:func:`~lit_rl.tasks.countdown_problems.three_number_expressions`
    rows), only those in the numbers' order when ``ordered``."""
    from lit_rl.tasks.countdown_problems import in_order, three_number_expressions

    return [r for r in three_number_expressions([int(n) for n in numbers])
            if r[2] is not None and (not ordered or in_order(r[0], numbers))]


def countdown_trials_completion(example: Example, rng: random.Random, tries: tuple[int, int] = (2, 8),
                                ordered: bool = False) -> str:
    """A trial-and-error Countdown trace over three numbers: ``k ~ U{tries}`` wrong expressions, then one that
    hits the target, each written in two steps (``"3*4=12;12-5=7"``), tries separated by ``", "``, then the
    hitting expression as the answer (:func:`~lit_rl.tasks.countdown_problems.three_number_expressions`).

    The teacher of the miniature Countdown's external causal LM (``lit_rl.pools.external_lm``): a model
    trained on it learns to write tries and to stop at one it believes hits the target, so its samples are
    varied and sometimes wrong. Without a hitting expression (never for generated problems) the last try is
    answered anyway. ``ordered``: only expressions that keep the numbers in the prompt's order
    (:func:`countdown_ordered_trials_completion`).
    """
    numbers, target = example.answer
    rows = _try_rows(numbers, ordered)
    hits = [r for r in rows if r[2] == target]
    misses = [r for r in rows if r[2] != target]
    k = rng.randint(*tries)
    chosen = [misses[rng.randrange(len(misses))] for _ in range(k)] if misses else []
    final = hits[rng.randrange(len(hits))] if hits else (chosen.pop() if chosen else rows[0])
    trace = ", ".join(r[1] for r in chosen + [final])
    return f"<reasoning>{trace}</reasoning>\n<answer>{final[0]}</answer>"


def countdown_ordered_trials_completion(example: Example, rng: random.Random, tries: tuple[int, int] = (2, 8)) -> str:
    """:func:`countdown_trials_completion` over the 32 expressions that keep the numbers in the prompt's order
    (``5,9,6>8``: ``9-6=3;5+3=8`` then ``5+(9-6)``): the teacher for ``CountdownTask(ordered=True)``, whose
    problems all have such a solution. Every number then sits at one of a few offsets from the start of a try."""
    return countdown_trials_completion(example, rng, tries, ordered=True)


def countdown_trials_pool_completion(example: Example, rng: random.Random, error_rate: float = 0.0) -> str:
    """The ``trials`` style of ``rollouts scripted --task countdown``: the ordered teacher with 0-1 wrong tries
    (:func:`countdown_ordered_trials_completion`); with probability ``error_rate`` the final try is a wrong one
    too (the trace still ends on it, so the answer is wrong)."""
    if error_rate > 0 and rng.random() < error_rate:
        numbers, target = example.answer
        misses = [r for r in _try_rows(numbers, ordered=True) if r[2] != target]
        if misses:
            expr, trace, _ = misses[rng.randrange(len(misses))]
            return f"<reasoning>{trace}</reasoning>\n<answer>{expr}</answer>"
    return countdown_ordered_trials_completion(example, rng, (0, 1))


def countdown_random_try(example: Example, rng: random.Random) -> str:
    """One random try in the trials format, ``<reasoning>a o b=v;v o c=w</reasoning>`` then that expression as
    the answer, over the expressions that keep the prompt's order: the format of the trials teacher with the
    numbers copied and random operators (the format warm-up's ``trials`` style; it hits the target only by
    chance)."""
    rows = _try_rows(example.answer[0], ordered=True)
    expr, trace, _ = rows[rng.randrange(len(rows))]
    return f"<reasoning>{trace}</reasoning>\n<answer>{expr}</answer>"


# -- the scripted external policy's verbose first stage (lit_rl.pools.backends.ScriptedBackend) --------
def last_answer(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    return found[-1] if found else None


def reasoning_of(text: str) -> str:
    m = re.search(r"<reasoning>(.*?)</reasoning>", text, flags=re.S)
    return m.group(1) if m else ""


def verbose_trace(task: str, example: Example, compact: str, rng: random.Random) -> str:
    """Expand a compact scripted trace into a wordy one with the same answer."""
    answer = last_answer(compact) or ""
    if task == "sudoku":
        steps = re.findall(r"(\d)(\d)(\d)", reasoning_of(compact))
        lines = [f"The puzzle is {example.meta['puzzle']}; zeros are empty cells. I fill one cell at a time."]
        for r, c, d in steps:
            why = rng.choice(["the row already holds the other digits", "the column and the 2x2 box rule out the rest",
                              "it is the only candidate left"])
            lines.append(f"Row {r}, column {c}: {why}, so the cell must be {d}.")
            if rng.random() < 0.3:
                lines.append(f"Check: row {r} and column {c} now have no repeated digit.")
        lines.append("Every row, column and box now holds 1-4 exactly once.")
    else:
        lines = ["I need to reach the target with each number used once. Trying combinations: "
                 f"{reasoning_of(compact)}."]
        for _ in range(rng.randint(4, 16)):
            lines.append("Let me double-check the arithmetic of that candidate step by step before answering.")
        lines.append(f"So the expression {answer.strip()} works.")
    return "<reasoning>\n" + "\n".join(lines) + "\n</reasoning>\n<answer>" + answer + "</answer>"
