"""The double-rollout reliability study (DR Fig. 1-2): how well continuations from a cut judge a rollout.

For every first-stage rollout that got continuations, the study keeps whether the rollout itself was correct
(``y``), the share of its ``N`` continuations that are correct (``a``: the continuation accuracy from the cut
at ρ), its completion length and its prompt's difficulty, measured as the prompt's first-stage pass rate
(the share of its ``G`` rollouts that are correct). The paper's premise is that ``a`` is high after correct
rollouts and low after incorrect ones, and stays informative across lengths and difficulties; where ``a`` is
near ``y`` the continuations only copy the outcome (a cut too late), where it is near the pass rate they
ignore the kept prefix (a cut too early).

:func:`reliability_rows` extracts the per-row values from an :class:`~lit_rl.algorithms.double_rollout.Estimate`;
:func:`reliability_table` bins them: by length (quantile bins over all rows) and by difficulty (pass-rate
bins ``[0, 1/3)`` hard, ``[1/3, 2/3)`` medium, ``[2/3, 1]`` easy), each split into correct / incorrect
rollouts: count and mean continuation accuracy. :func:`crossed_table` crosses the two, the paper's protocol, with
a minimum count per cell.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

DIFFICULTY_BINS = (("hard", 0.0, 1 / 3), ("medium", 1 / 3, 2 / 3), ("easy", 2 / 3, 1.0 + 1e-9))


def reliability_rows(correct_original: Tensor, correct_cont: Tensor, has_cont: Tensor, lengths: Tensor,
                     group: Tensor) -> dict[str, Tensor]:
    """Per-row study values of one rollout batch, rows with continuations only.

    Shapes: ``correct_original (B,)`` bool, ``correct_cont (B, N)`` bool, ``has_cont (B,)`` bool,
    ``lengths (B,)``, ``group (B,)`` long. Returns ``correct (R,)`` bool, ``cont_acc (R,)`` float (share of
    the row's continuations that are correct), ``length (R,)`` long, ``pass_rate (R,)`` float (the row's
    prompt's first-stage accuracy over ALL its rows, with or without continuations).
    """
    y = correct_original.bool()
    groups = group.long()
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    hits = torch.zeros(n_groups).index_add_(0, groups.cpu(), y.float().cpu())  # (n_groups,)
    sizes = torch.zeros(n_groups).index_add_(0, groups.cpu(), torch.ones(len(groups)))  # (n_groups,)
    pass_rate = (hits / sizes.clamp(min=1))[groups.cpu()]  # (B,)
    keep = has_cont.bool().cpu()
    return {
        "correct": y.cpu()[keep],
        "cont_acc": (correct_cont.float().mean(dim=1).cpu()[keep] if correct_cont.numel()
                     else torch.zeros(int(keep.sum()))),
        "length": lengths.long().cpu()[keep],
        "pass_rate": pass_rate[keep],
    }


def length_edges(lengths: Tensor, bins: int = 3) -> list[float]:
    """Inner edges of ``bins`` quantile bins of ``lengths`` (e.g. tertiles for 3)."""
    if len(lengths) == 0:
        return []
    qs = torch.linspace(0, 1, bins + 1)[1:-1]
    return [float(x) for x in torch.quantile(lengths.float(), qs)]


def _cell(correct: Tensor, cont_acc: Tensor, sel: Tensor, label: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for name, want in (("correct", True), ("incorrect", False)):
        m = sel & (correct == want)
        n = int(m.sum())
        out.append({"by": kind, "bin": label, "rollout": name, "n": n,
                    "cont_acc": float(cont_acc[m].mean()) if n else None})
    return out


def reliability_table(rows: dict[str, Tensor], n_length_bins: int = 3) -> list[dict[str, Any]]:
    """Binned continuation accuracy (module docstring): one dict per (bin, correct/incorrect) with ``by``
    (``"all"``, ``"length"``, ``"difficulty"``), ``bin`` (label), ``rollout``, ``n``, ``cont_acc`` (``None``
    for an empty cell). Length bins are labelled ``"<=e1"``, ``"(e1,e2]"``, ``">e2"`` by their edges."""
    correct, cont_acc, length, pass_rate = rows["correct"], rows["cont_acc"], rows["length"], rows["pass_rate"]
    table = _cell(correct, cont_acc, torch.ones_like(correct), "all", "all")
    edges = length_edges(length, n_length_bins)
    bounds = [float("-inf"), *edges, float("inf")]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        label = f"<={hi:g}" if lo == float("-inf") else (f">{lo:g}" if hi == float("inf") else f"({lo:g},{hi:g}]")
        table += _cell(correct, cont_acc, (length > lo) & (length <= hi), label, "length")
    for label, lo, hi in DIFFICULTY_BINS:
        table += _cell(correct, cont_acc, (pass_rate >= lo) & (pass_rate < hi), label, "difficulty")
    return table


def crossed_table(rows: dict[str, Tensor], n_length_bins: int = 3, min_count: int = 20) -> list[dict[str, Any]]:
    """DR Fig. 1-2's protocol: difficulty bins crossed with length bins, each split into correct / incorrect
    rollouts. ``rows`` as :func:`reliability_rows` returns them, where ``pass_rate`` should be the starting
    model's pass rate over separate samples of the prompt (the paper's difficulty). Length bins are quantile
    bins of all rows' lengths, the same edges in every difficulty. One dict per (difficulty, length bin,
    correct/incorrect) with ``difficulty``, ``bin``, ``rollout``, ``n`` and ``cont_acc``: the mean continuation
    accuracy, ``None`` where the cell has fewer than ``min_count`` rollouts (too few to read)."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    correct, cont_acc, length, pass_rate = rows["correct"], rows["cont_acc"], rows["length"], rows["pass_rate"]
    bounds = [float("-inf"), *length_edges(length, n_length_bins), float("inf")]
    out = []
    for difficulty, d_lo, d_hi in DIFFICULTY_BINS:
        in_d = (pass_rate >= d_lo) & (pass_rate < d_hi)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            label = f"<={hi:g}" if lo == float("-inf") else (f">{lo:g}" if hi == float("inf") else f"({lo:g},{hi:g}]")
            for cell in _cell(correct, cont_acc, in_d & (length > lo) & (length <= hi), label, "length"):
                if cell["n"] < min_count:
                    cell["cont_acc"] = None
                out.append({"difficulty": difficulty, **{k: v for k, v in cell.items() if k != "by"}})
    return out


def crossed_markdown(table: Sequence[dict[str, Any]], min_count: int) -> str:
    """:func:`crossed_table` as Markdown: one line per difficulty and length bin."""
    lines = ["| difficulty | length | cont. acc. after correct (n) | cont. acc. after incorrect (n) |",
             "|---|---|---|---|"]
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in table:
        cells.setdefault((r["difficulty"], r["bin"]), {})[r["rollout"]] = r

    def fmt(c: dict[str, Any]) -> str:
        return f"- ({c['n']} < {min_count})" if c["cont_acc"] is None else f"{c['cont_acc']:.3f} ({c['n']})"

    for (d, b), c in cells.items():
        lines.append(f"| {d} | {b} | {fmt(c['correct'])} | {fmt(c['incorrect'])} |")
    return "\n".join(lines) + "\n"


def table_markdown(table: Sequence[dict[str, Any]]) -> str:
    """The table as Markdown: one line per bin, continuation accuracy after correct / incorrect rollouts."""
    lines = ["| by | bin | cont. acc. after correct (n) | cont. acc. after incorrect (n) |", "|---|---|---|---|"]
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in table:
        cells.setdefault((r["by"], r["bin"]), {})[r["rollout"]] = r

    def fmt(c: dict[str, Any]) -> str:
        return "-" if c["cont_acc"] is None else f"{c['cont_acc']:.3f} ({c['n']})"

    for (by, b), c in cells.items():
        lines.append(f"| {by} | {b} | {fmt(c['correct'])} | {fmt(c['incorrect'])} |")
    return "\n".join(lines) + "\n"


__all__ = ["DIFFICULTY_BINS", "crossed_markdown", "crossed_table", "length_edges", "reliability_rows",
           "reliability_table", "table_markdown"]
