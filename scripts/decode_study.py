"""The embedded ERILS run under each rollout decoder, over seeds: accuracy, cost, confidence and agreement.

Reads finished ``conf/erils.yaml`` runs (one MLflow store per run, or several runs per store), grouped by the
decoder (or recipe) named on the command line, and prints:

* the table: greedy accuracy (all 256 puzzles) at updates 60, 120, 180, 240 and at the end, rollout generation
  seconds (``time/generation_s`` summed
  over the 75 rollout batches), forward passes per rollout, the on-policy confidence at the first and the last
  batch, the agreement of the training and exact decodes (``callbacks.DecodeAgreement``: tokens and whole
  completions) at the start and the end, and the run time; each as mean ± sample std over the seeds;
* the figure (``--out``): the confidence and the forward passes per rollout over training, one line per run;
* with ``--curves PNG``: the greedy accuracy over training, each group's mean with its seeds' range;
* a JSON line last.

    python scripts/decode_study.py --mode exact sqlite:///a.db sqlite:///b.db --mode dual ... [--out PNG]

A store that holds several groups' runs takes a filter: ``sqlite:///runs.db#/D/`` keeps the runs whose
``trainer.default_root_dir`` contains ``/D/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_rl.atomic import atomic_savefig  # noqa: E402
from lit_rl.report import _plt, runs_with_wall  # noqa: E402
from lit_rl.report import mean_std as _ms  # noqa: E402

GREEDY = "val/sudoku/greedy/accuracy"
CONF, PASSES, GEN = "train/on_policy/confidence_mean", "train/on_policy/forward_passes", "time/generation_s"
AGREE_TOK, AGREE_COMPL = "decode_agreement/token", "decode_agreement/completion"
KEYS = [GREEDY, CONF, PASSES, GEN, AGREE_TOK, AGREE_COMPL]
CURVE_POINTS = (60, 120, 180, 240)  # the evaluations before the last (every 15 rollout batches of 4 updates)


def run_folder(run) -> str:
    """A run's folder: the tag ``lit_rl.run.trainer.default_root_dir`` (runs logged since the folder became a
    tag), else the param of that name (older runs)."""
    return run.tags.get("lit_rl.run.trainer.default_root_dir") or run.params.get("trainer.default_root_dir", "")


def select(uri: str) -> tuple[str, str | None]:
    """``URI#FILTER`` -> the store and the ``trainer.default_root_dir`` substring its runs must contain."""
    store, _, flt = uri.partition("#")
    return store, flt or None



def run_figures(run, wall_s: float | None) -> dict[str, float | None]:
    """One run's figures (``None`` where the run did not log the metric)."""
    def ends(key: str) -> tuple[float | None, float | None]:
        s = run.series(key)
        return (s[0][1], s[-1][1]) if s else (None, None)

    greedy = dict(run.series(GREEDY))
    conf0, conf1 = ends(CONF)
    tok0, tok1 = ends(AGREE_TOK)
    compl0, compl1 = ends(AGREE_COMPL)
    passes = [v for _, v in run.series(PASSES)]
    return {**{f"at_{u}": greedy.get(u) for u in CURVE_POINTS}, "final": ends(GREEDY)[1],
            "generation_s": sum(v for _, v in run.series(GEN)) or None,
            "passes_mean": statistics.mean(passes) if passes else None, "passes_first": passes[0] if passes else None,
            "passes_last": passes[-1] if passes else None, "confidence_first": conf0, "confidence_last": conf1,
            "agreement_token_start": tok0, "agreement_token_end": tok1, "agreement_completion_start": compl0,
            "agreement_completion_end": compl1, "run_s": wall_s}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", nargs="+", action="append", required=True, metavar=("NAME", "URI"),
                    help="a decoder's name and the MLflow stores of its runs (one run per seed)")
    ap.add_argument("--out", default=str(ROOT / "docs/img/decode_study.png"))
    ap.add_argument("--curves", default=None, help="also draw the greedy accuracy curves into this PNG")
    args = ap.parse_args(argv)
    modes: dict[str, list] = {}
    for name, *uris in args.mode:
        if not uris:
            ap.error(f"--mode {name}: give at least one MLflow store")
        for uri in uris:
            store, flt = select(uri)
            picked = [(r, wall) for r, wall in runs_with_wall(store, KEYS)
                      if flt is None or flt in run_folder(r)]
            if not picked:
                ap.error(f"--mode {name}: no finished run in {uri}")
            modes.setdefault(name, []).extend((r, run_figures(r, wall)) for r, wall in picked)
    cols = [*((f"update {u}", f"at_{u}", 3) for u in CURVE_POINTS), ("final greedy", "final", 3),
            ("rollout generation s", "generation_s", 1),
            ("passes / rollout", "passes_mean", 1),
            ("confidence first → last", ("confidence_first", "confidence_last"), 3),
            ("agreement tokens start → end", ("agreement_token_start", "agreement_token_end"), 3),
            ("agreement completions start → end", ("agreement_completion_start", "agreement_completion_end"), 3),
            ("run s", "run_s", 0)]
    print("| decoder | seeds | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    summary: dict = {"script": "decode_study", "modes": {}}
    for name, rows in modes.items():
        figs = [f for _, f in rows]
        cells = []
        for _, key, digits in cols:
            if isinstance(key, tuple):
                a = [f[key[0]] for f in figs if f[key[0]] is not None]
                b = [f[key[1]] for f in figs if f[key[1]] is not None]
                cells.append(f"{_ms(a, digits)} → {_ms(b, digits)}")
            else:
                cells.append(_ms([f[key] for f in figs if f[key] is not None], digits))
        print(f"| {name} | {len(figs)} | " + " | ".join(cells) + " |")
        summary["modes"][name] = figs
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (name, rows) in enumerate(modes.items()):
        for j, (r, _) in enumerate(rows):
            for ax, key in zip(axes, (CONF, PASSES)):
                s = r.series(key)
                ax.plot([x for x, _ in s], [y for _, y in s], color=f"C{i}", alpha=0.8, lw=1,
                        label=name if j == 0 else None)
    axes[0].set(title="on-policy confidence of revealed tokens", xlabel="optimizer update", ylabel="mean confidence")
    axes[1].set(title="forward passes per rollout", xlabel="optimizer update", ylabel="passes")
    axes[0].legend()
    fig.tight_layout()
    atomic_savefig(fig, args.out)
    print(f"figure: {args.out}")
    if args.curves:
        _draw_curves(plt, modes, args.curves)
        print(f"figure: {args.curves}")
    print(json.dumps(summary))
    return summary


def _draw_curves(plt, modes: dict, path: str) -> None:
    """Greedy accuracy over training: each group's mean over its seeds, shaded between their min and max."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (name, rows) in enumerate(modes.items()):
        per_step: dict[int, list[float]] = {}
        for r, _ in rows:
            for step, v in r.series(GREEDY):
                per_step.setdefault(step, []).append(v)
        steps = sorted(k for k, v in per_step.items() if len(v) == len(rows))
        ax.plot(steps, [statistics.mean(per_step[k]) for k in steps], color=f"C{i}",
                label=f"{name} ({len(rows)} seeds)")
        ax.fill_between(steps, [min(per_step[k]) for k in steps], [max(per_step[k]) for k in steps], color=f"C{i}",
                        alpha=0.15)
    ax.set(xlabel="optimizer update", ylabel="greedy cell accuracy (256 puzzles)", ylim=(0.2, 1.0))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path)


if __name__ == "__main__":
    main()
