"""Table XI's protocol in miniature: read the three-length evaluations of finished runs.

Each run's final checkpoint is decoded deterministically at three generation lengths by
``python -m lit_rl validate --config <run>/config.yaml --config conf/eval/erils_lengths.yaml
--ckpt_path <run>/checkpoints/last.ckpt`` (:func:`lit_rl.reproduce.runner.validate_job`); the callback writes
``<run>/eval/passk_lengths_validate_report.json``. This module turns those files into table rows.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Sequence

__all__ = ["REPORT_FILE", "length_scores", "lengths_rows"]

REPORT_FILE = "eval/passk_lengths_validate_report.json"


def length_scores(run_folder: Path) -> dict[int, dict[str, float]] | None:
    """``{gen_length: {"accuracy", "length_mean", "hit_limit_frac"}}`` of one run's three-length evaluation,
    or None when it has not run (or its file is unreadable: the table then shows the run as missing)."""
    try:
        rep = json.loads((Path(run_folder) / REPORT_FILE).read_text())
        out = {}
        for cfg in rep["configs"].values():
            m = cfg["final"]["metrics"]
            out[int(cfg["settings"]["gen_length"])] = {k: float(m[k]) for k in ("accuracy", "length_mean",
                                                                                "hit_limit_frac") if k in m}
        return dict(sorted(out.items()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lengths_rows(groups: dict[str, Sequence[Path]]) -> tuple[list[str], dict[str, Any]]:
    """Markdown lines (a table: one row per group, a column per length, mean ± std over the group's runs) and
    the same numbers as a dict. Groups whose runs have no three-length evaluation are left out."""
    found = {name: [s for s in map(length_scores, folders) if s] for name, folders in groups.items()}
    found = {k: v for k, v in found.items() if v}
    if not found:
        return [], {}
    lengths = sorted({n for runs in found.values() for s in runs for n in s})
    lines = ["| run | runs | " + " | ".join(f"L_gen {n}" for n in lengths) + " |",
             "|---|---|" + "---|" * len(lengths)]
    summary: dict[str, Any] = {}
    for name, runs in found.items():
        cells, summary[name] = [], {}
        for n in lengths:
            vals = [s[n]["accuracy"] for s in runs if n in s]
            mean = statistics.fmean(vals) if vals else None
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            summary[name][n] = {"mean": mean, "std": std, "n": len(vals), "values": vals}
            cells.append("-" if mean is None else f"{mean:.3f}" + (f" ± {std:.3f}" if len(vals) > 1 else ""))
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines, summary
