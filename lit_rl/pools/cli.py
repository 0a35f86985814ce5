"""``python -m lit_rl rollouts``: external rollout pools (ERILS §IV-A, App. B).

* ``rollouts build --config conf/external/<task>.yaml [--out POOL] [--limit N] [--overwrite]
  [--no_progress] [--no_stats] [--mlflow_uri URI|none]`` builds (or resumes) a pool with a real external policy,
  length control, filtering and usable-first ordering (:mod:`lit_rl.pools.build`), then writes its statistics.
* ``rollouts train-lm --config conf/external/<task>.yaml`` trains the config's external model into its
  ``backend.model`` directory from the config's ``external_lm`` block: a small Llama with its own byte-level
  BPE tokenizer, taught by a scripted teacher to follow the length instruction
  (:mod:`lit_rl.pools.external_lm`; the miniature Countdown pool, ``conf/external/countdown_ordered.yaml``).
* ``rollouts filter POOL --out POOL2[.gz] [--min_reward R] [--max_tokens T]`` copies a pool, leaving records
  under ``R`` (or over ``T`` tokens) unusable (:mod:`lit_rl.pools.pool_filter`).
* ``rollouts stats POOL [--g_ext 2] [--max_tokens 500] [--mlflow_uri sqlite:///runs/mlflow.db]
  [--experiment NAME] [--json] [--no_write]`` prints ERILS Tables IV and V (and the generation wall time
  of Table XII) for any pool, writes them next to the pool as ``<stem>.stats.md`` and
  ``<stem>.stats.json`` with a length histogram ``<stem>.lengths.png``, and with ``--mlflow_uri`` logs all
  three to MLflow (nothing is logged without it).
* ``rollouts scripted --task sudoku --out POOL[.gz] [--n 6] [--error_rate 0.1] [--seed 42] [--limit N]
  [--trace grid]`` writes a pool from the scripted solver (:mod:`lit_rl.tasks.scripted`) in one go, in the
  recipe's trace by default (the committed demo pool ``data/pools/sudoku_grid.jsonl.gz``: ``--limit 1000``).
  ``build`` with ``conf/external/sudoku_embedded.yaml`` is a different pool: the scripted solver behind the
  build pipeline's two-stage length control, with verbose first stages (up to 500+ tokens), resumable.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

from lit_rl.atomic import atomic_savefig, atomic_write_text
from lit_rl.pools.pool import (MAX_USABLE_TOKENS, PoolFormatError, PoolRecord, _header, iter_pool, pool_stem,
                                  reorder_usable_first, write_pool_atomic)
from lit_rl.cli_args import LitArgumentParser
from lit_rl.tracking import check_tracking_uri, get_or_create_experiment  # noqa: F401  (check_tracking_uri: re-exported)


def build_scripted_pool(
    task_name: str, out: str | Path, n: int = 6, error_rate: float = 0.1, seed: int = 42, limit: int | None = None,
    task_kwargs: dict | None = None, trace: str | None = None,
) -> int:
    """Write a scripted pool for ``task_name``'s training prompts; returns the number of records.

    ``trace``: a style of the task's registry entry (:mod:`lit_rl.tasks.registry`) (``None``: the task's first, e.g.
    Sudoku ``deduction``; ``grid`` is the fixed-length trace)."""
    from lit_rl.models.tokenizer import build_char_tokenizer
    from lit_rl.tasks import get_task
    from lit_rl.tasks.registry import known_traces, scripted_tasks, task_entry

    if task_name not in scripted_tasks():
        raise ValueError(f"--task: no scripted policy for {task_name!r} (known: {sorted(scripted_tasks())})")
    styles = known_traces(task_name)
    if trace is not None and trace not in styles:
        raise ValueError(f"--trace: no {trace!r} trace for {task_name!r} (known: {sorted(styles)})")
    task = get_task(task_name, **(task_kwargs or {}))
    tok = build_char_tokenizer()
    write = styles[trace] if trace is not None else task_entry(task_name).default_trace
    examples = task.train_examples()[:limit] if limit else task.train_examples()
    records: list[PoolRecord] = []
    t0 = time.perf_counter()
    for ex in examples:
        rng = random.Random(f"{seed}:{ex.id}")
        cands = []
        for i in range(n):
            text = write(ex, rng, error_rate)
            cands.append(
                PoolRecord(
                    prompt_id=ex.id,
                    index=i,
                    source=f"scripted-{task_name}",
                    completion=text,
                    reward=float(task.reward(text, ex)),
                    num_tokens=len(tok(text, add_special_tokens=False)["input_ids"]),
                    tokenizer=tok.name_or_path,
                    meta={"seed": seed, "error_rate": error_rate},
                )
            )
        records.extend(reorder_usable_first(cands))
    extra = {"trace": trace} if trace is not None else {}
    header = _header(task_name, f"scripted-{task_name}", tok.name_or_path, n=n, seed=seed, error_rate=error_rate,
                     wall_time_s=round(time.perf_counter() - t0, 3), **extra)
    write_pool_atomic(out, header, records)
    return len(records)


# --------------------------------------------------------------------------------------------------------
# statistics (ERILS Tables IV, V, XII)
# --------------------------------------------------------------------------------------------------------
def _max_reward(header: dict) -> float:
    if isinstance(header.get("max_reward"), (int, float)):
        return float(header["max_reward"])
    from lit_rl.tasks import TASKS

    cls = TASKS.get(str(header.get("task", "")).lower())
    return float(cls.max_reward) if cls is not None else 1.0


def _correct_reward(header: dict) -> float:
    """Reward at or above which an answer is correct: the header's ``correct_reward``, else the task's
    (MATH 2.0: a correct answer whatever its format credit), else the header's ``max_reward``."""
    if isinstance(header.get("correct_reward"), (int, float)):
        return float(header["correct_reward"])
    from lit_rl.tasks import TASKS

    cls = TASKS.get(str(header.get("task", "")).lower())
    return float(cls.correct_reward) if cls is not None else _max_reward(header)


def _header_count(header: dict, key: str, path: str | Path) -> int | None:
    value = header.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise PoolFormatError(f"{path}:1: header field {key!r} must be an integer >= 1, got {repr(value)[:40]}")
    return value


def _check_stage1(meta: dict, where: str) -> None:
    s1 = meta.get("stage1")
    if s1 is None:
        return
    tokens, reward = (s1.get("num_tokens", 0), s1.get("reward", 0.0)) if isinstance(s1, dict) else (None, None)
    ok = isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens < 2**63
    ok = ok and (isinstance(reward, float) and math.isfinite(reward) or type(reward) is int and abs(reward) < 2**63)
    if not ok:
        raise PoolFormatError(f"{where}: field 'meta.stage1' must be an object with a count 'num_tokens' "
                              "and a finite 'reward'")


def _stage_summary(lengths: list[int], rewards: list[float], correct_reward: float) -> dict:
    n = len(lengths)
    correct = sum(r >= correct_reward - 1e-9 for r in rewards)
    return {
        "completions": n,
        "mean_length": sum(lengths) / n if n else 0.0,
        "median_length": float(sorted(lengths)[n // 2]) if n else 0.0,
        "max_length": max(lengths) if n else 0,
        "mean_reward": sum(rewards) / n if n else 0.0,
        "correct": correct,
        "correct_pct": 100.0 * correct / n if n else 0.0,
    }


def format_duration(seconds: float | None) -> str:
    """``16733`` -> ``"4h 38m 53s"`` (the format of ERILS Table XII)."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s"


def pool_stats(path: str | Path, g_ext: int | None = None, max_tokens: int | None = None) -> dict:
    """ERILS Tables IV and V (and the Table XII generation time) for the pool at ``path``.

    * Table IV: source prompts, generated completions, completions over ``max_tokens`` (default: the
      header's ``max_usable_tokens``, else 500), "default usable" prompts (at least ``g_ext`` usable
      completions; default: the header's ``g_ext``, else 2) and "all-n valid" prompts (every candidate
      usable).
    * Table V: per stage (the first stage of a two-stage build, from ``meta["stage1"]``; the final
      completions; the default training set = the first ``g_ext`` usable completions of usable prompts):
      mean completion length, mean verifier reward, correct completions (reward >= the task's ``correct_reward``: its
      maximum for Sudoku and Countdown, 2.0 of 3.0 for MATH).
      For two-stage pools also the first -> final transitions (kept / became correct / became incorrect).
    * Generation: total wall time over all build sessions (``<stem>.build.json``), requests, retries.

    Counts come from ``num_tokens`` (and ``usable``) as recorded; reward is reported, never used to filter.
    Flat keys of the old summary (``source_prompts``, ``completions``, ``over_500_tokens``, ...) are kept.
    """
    header, records = iter_pool(path, with_lines=True)
    g_ext = int(g_ext or _header_count(header, "g_ext", path) or 2)
    # usability as recorded (what the DataModule uses), unless the caller asks for another limit
    recount = max_tokens is not None
    max_tokens = int(max_tokens or _header_count(header, "max_usable_tokens", path) or MAX_USABLE_TOKENS)
    max_reward, correct_reward = _max_reward(header), _correct_reward(header)
    per_prompt: dict[str, list[PoolRecord]] = defaultdict(list)
    for lineno, r in records:
        _check_stage1(r.meta, f"{path}:{lineno}")
        per_prompt[r.prompt_id].append(r)
    recs = [r for rs in per_prompt.values() for r in rs]
    usable = (lambda r: r.num_tokens <= max_tokens) if recount else (lambda r: r.usable)  # noqa: E731
    n_cands = _header_count(header, "n", path) or (max((len(rs) for rs in per_prompt.values()), default=0))
    default_usable = {pid for pid, rs in per_prompt.items() if sum(usable(r) for r in rs) >= g_ext}
    table_iv = {
        "task": header.get("task"),
        "source_prompts": len(per_prompt),
        "generated_completions": len(recs),
        "over_max_tokens": sum(r.num_tokens > max_tokens for r in recs),
        "default_usable": len(default_usable),
        "all_n_valid": sum(all(usable(r) for r in rs) for rs in per_prompt.values()),
        "n": n_cands,
        "g_ext": g_ext,
        "max_tokens": max_tokens,
    }
    stages: dict[str, dict] = {}
    two_stage = any("stage1" in r.meta for r in recs)
    transitions = None
    if two_stage:
        s1 = [r.meta["stage1"] for r in recs if isinstance(r.meta.get("stage1"), dict)]
        stages["first_stage"] = _stage_summary([int(m.get("num_tokens", 0)) for m in s1],
                                               [float(m.get("reward", 0.0)) for m in s1], correct_reward)
        pairs = [(float(r.meta["stage1"].get("reward", 0.0)) >= correct_reward - 1e-9,
                  r.reward >= correct_reward - 1e-9) for r in recs if isinstance(r.meta.get("stage1"), dict)]
        transitions = {
            "kept_correct": sum(a and b for a, b in pairs),
            "became_correct": sum(b and not a for a, b in pairs),
            "became_incorrect": sum(a and not b for a, b in pairs),
            "stayed_incorrect": sum(not a and not b for a, b in pairs),
        }
    stages["final"] = _stage_summary([r.num_tokens for r in recs], [r.reward for r in recs], correct_reward)
    used = [r for pid in per_prompt if pid in default_usable
            for r in [x for x in sorted(per_prompt[pid], key=lambda r: r.index) if usable(x)][:g_ext]]
    stages["default_training"] = _stage_summary([r.num_tokens for r in used], [r.reward for r in used], correct_reward)
    from lit_rl.pools.build import read_build_info

    info = read_build_info(path) or {}
    sessions = info.get("sessions") or []
    generation = {
        "wall_time_s": info.get("generation_wall_time_s", header.get("wall_time_s")),
        "wall_time": format_duration(info.get("generation_wall_time_s", header.get("wall_time_s"))),
        "sessions": len(sessions),
        "requests": sum(int(s.get("requests", 0)) for s in sessions),
        "retries": sum(int(s.get("retries", 0)) for s in sessions),
        "status": info.get("status"),
    }
    final = stages["final"]
    return {
        "pool": str(path),
        "task": header.get("task"),
        "policy": header.get("policy"),
        "tokenizer": header.get("tokenizer"),
        "length_unit": header.get("length_unit", "tokens"),
        "length_fallback": bool(header.get("length_fallback", header.get("tokenizer") == "chars")),
        "length_control": (header.get("length_control") or {}).get("mode"),
        "max_reward": max_reward,
        "correct_reward": correct_reward,
        "table_iv": table_iv,
        "table_v": stages,
        "two_stage_transitions": transitions,
        "generation": generation,
        "lengths": {"final": [r.num_tokens for r in recs],
                    "first_stage": [int(r.meta["stage1"].get("num_tokens", 0)) for r in recs
                                    if isinstance(r.meta.get("stage1"), dict)]},
        # the old flat summary
        "source_prompts": table_iv["source_prompts"],
        "completions": table_iv["generated_completions"],
        f"over_{max_tokens}_tokens": table_iv["over_max_tokens"],
        f"usable_prompts_g_ext_{g_ext}": table_iv["default_usable"],
        "all_valid_prompts": table_iv["all_n_valid"],
        "mean_tokens": final["mean_length"],
        "mean_reward": final["mean_reward"],
        "correct": final["correct"],
    }


def _num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def stats_markdown(stats: dict) -> str:
    """Tables IV, V and the generation time as Markdown."""
    iv, v, gen = stats["table_iv"], stats["table_v"], stats["generation"]
    unit = "tokens" if stats["length_unit"] == "tokens" else "CHARACTERS"
    lines = [
        f"## External rollout pool `{stats['pool']}`",
        "",
        f"task **{stats['task']}** · policy **{stats['policy']}** · length control **{stats['length_control'] or '-'}**"
        f" · lengths in {unit} of `{stats['tokenizer']}` · {iv['n']} candidates per prompt · G_ext = {iv['g_ext']}",
    ]
    if stats["length_fallback"]:
        lines += ["", "> **Warning**: no tokenizer of the external model was available; lengths (and the "
                      f"{iv['max_tokens']}-token filter) count characters."]
    lines += [
        "",
        "### Filtering (ERILS Table IV)",
        "",
        f"| Task | Source prompts | Generated completions | Completions >{iv['max_tokens']} | "
        f"Default usable (≥{iv['g_ext']} of ≤{iv['max_tokens']}) | All-{iv['n']} valid |",
        "|---|---:|---:|---:|---:|---:|",
        f"| {iv['task']} | {iv['source_prompts']:,} | {iv['generated_completions']:,} | {iv['over_max_tokens']:,} | "
        f"{iv['default_usable']:,} | {iv['all_n_valid']:,} |",
        "",
        "### Completions per stage (ERILS Table V)",
        "",
        "| Stage | Completions | Mean completion length | Mean verifier reward | Correct completions |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"first_stage": "First stage", "final": "Second stage (final)" if "first_stage" in v else "Final",
             "default_training": f"Default training set (first {iv['g_ext']} usable)"}
    for key in ("first_stage", "final", "default_training"):
        if key in v:
            s = v[key]
            lines.append(f"| {names[key]} | {s['completions']:,} | {_num(s['mean_length'])} | "
                         f"{_num(s['mean_reward'], 4)} | {s['correct']:,} ({_num(s['correct_pct'])}%) |")
    t = stats.get("two_stage_transitions")
    if t:
        lines += ["", f"First stage → final: {t['kept_correct']:,} correct kept, "
                      f"{t['became_correct']:,} became correct, {t['became_incorrect']:,} became incorrect, "
                      f"{t['stayed_incorrect']:,} stayed incorrect."]
    lines += [
        "",
        "### Generation cost (ERILS Table XII)",
        "",
        "| External-rollout generation | Sessions | Requests | Retries |",
        "|---:|---:|---:|---:|",
        f"| {gen['wall_time']} | {gen['sessions']} | {gen['requests']:,} | {gen['retries']:,} |",
        "",
    ]
    return "\n".join(lines)


def stats_paths(pool: str | Path) -> dict[str, Path]:
    """Where ``rollouts stats`` writes: ``<stem>.stats.md``, ``<stem>.stats.json``, ``<stem>.lengths.png``."""
    stem = pool_stem(pool)
    return {"markdown": stem.with_name(stem.name + ".stats.md"), "json": stem.with_name(stem.name + ".stats.json"),
            "histogram": stem.with_name(stem.name + ".lengths.png")}


def plot_length_histogram(stats: dict, out: str | Path) -> Path:
    """Histogram of final (and first-stage) completion lengths with the usability limit marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    final, first = stats["lengths"]["final"], stats["lengths"]["first_stage"]
    limit = stats["table_iv"]["max_tokens"]
    top = max(final + first + [limit + 1])
    bins = [i * max(1, math.ceil(top / 60)) for i in range(62)]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if first:
        ax.hist(first, bins=bins, alpha=0.5,
                label=f"first stage (mean {stats['table_v']['first_stage']['mean_length']:.0f})", color="tab:gray")
    ax.hist(final, bins=bins, alpha=0.7, label=f"final (mean {stats['table_v']['final']['mean_length']:.0f})",
            color="tab:blue")
    ax.axvline(limit, color="tab:red", linestyle="--", label=f"usable limit {limit}")
    ax.set_xlabel(f"completion length ({stats['length_unit']} of {stats['tokenizer']})")
    ax.set_ylabel("completions")
    ax.set_title(f"{stats['task']} external pool · {stats['policy']}")
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    try:
        atomic_savefig(fig, out)
    finally:
        plt.close(fig)
    return out


def write_stats(stats: dict, pool: str | Path) -> dict[str, Path]:
    """Write the Markdown, JSON (without the raw length lists) and histogram next to the pool, each atomically."""
    paths = stats_paths(pool)
    atomic_write_text(paths["markdown"], stats_markdown(stats))
    atomic_write_text(paths["json"], json.dumps({k: v for k, v in stats.items() if k != "lengths"}, indent=2) + "\n")
    plot_length_histogram(stats, paths["histogram"])
    return paths


def log_stats_mlflow(stats: dict, files: dict[str, Path], tracking_uri: str,
                     experiment_name: str = "lit_rl-external-pools", run_name: str | None = None) -> str:
    """Log the statistics (params + metrics) and the Markdown/JSON/histogram files to MLflow; returns the run id."""
    import mlflow

    check_tracking_uri(tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp_id = get_or_create_experiment(client, experiment_name)
    run = client.create_run(exp_id, run_name=run_name or f"pool-{pool_stem(stats['pool']).name}")
    rid = run.info.run_id
    params = {"pool": stats["pool"], "task": stats["task"], "policy": stats["policy"], "tokenizer": stats["tokenizer"],
              "length_unit": stats["length_unit"], "length_control": stats["length_control"],
              "n": stats["table_iv"]["n"], "g_ext": stats["table_iv"]["g_ext"],
              "max_tokens": stats["table_iv"]["max_tokens"]}
    for k, val in params.items():
        client.log_param(rid, k, str(val))
    metrics = {f"pool/{k}": float(val) for k, val in stats["table_iv"].items()
               if isinstance(val, (int, float)) and not isinstance(val, bool)}
    for stage, s in stats["table_v"].items():
        metrics.update({f"pool/{stage}/{k}": float(val) for k, val in s.items()})
    for k, val in (stats.get("two_stage_transitions") or {}).items():
        metrics[f"pool/transitions/{k}"] = float(val)
    if stats["generation"]["wall_time_s"] is not None:
        metrics["pool/generation_wall_time_s"] = float(stats["generation"]["wall_time_s"])
    for k, val in metrics.items():
        client.log_metric(rid, k, val)
    for p in files.values():
        client.log_artifact(rid, str(p))
    client.set_terminated(rid)
    return rid


def run_stats(pool: str | Path, g_ext: int | None = None, max_tokens: int | None = None, write: bool = True,
              tracking_uri: str | None = None, experiment_name: str = "lit_rl-external-pools",
              run_name: str | None = None) -> tuple[dict, dict[str, Path]]:
    """Compute, write and (optionally) log a pool's statistics."""
    if tracking_uri:
        check_tracking_uri(tracking_uri)
    stats = pool_stats(pool, g_ext, max_tokens)
    files = write_stats(stats, pool) if write else {}
    if tracking_uri:
        if not files:
            raise ValueError("--mlflow_uri needs the files: drop --no_write")
        stats["mlflow_run_id"] = log_stats_mlflow(stats, files, tracking_uri, experiment_name, run_name)
    return stats, files



def main(argv: list[str]) -> int:
    parser = LitArgumentParser(prog="python -m lit_rl rollouts", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or resume a pool from a config (conf/external/*.yaml)")
    b.add_argument("--config", required=True, help="build config YAML (see lit_rl/pools/build.py)")
    b.add_argument("--out", default=None, help="pool path (overrides the config's out)")
    b.add_argument("--limit", type=int, default=None, help="only the first N training prompts (overrides the config)")
    b.add_argument("--overwrite", action="store_true", help="start over instead of resuming an existing pool")
    b.add_argument("--no_progress", action="store_true", help="no progress bar")
    b.add_argument("--no_stats", action="store_true", help="skip the statistics at the end")
    b.add_argument("--mlflow_uri", default=None,
                   help="log the statistics here instead of the config's mlflow.tracking_uri ('none': do not log)")
    tl = sub.add_parser("train-lm", help="train the build config's external model (its external_lm block) into "
                                         "backend.model: a small causal LM with its own BPE tokenizer")
    tl.add_argument("--config", required=True, help="build config YAML with an external_lm block")
    tl.add_argument("--overwrite", action="store_true", help="replace an existing backend.model folder")
    fl = sub.add_parser("filter", help="copy a pool (gzipped for a .gz name), leaving records under --min_reward "
                                       "unusable (e.g. the correct rows only, for an SFT capacity check)")
    fl.add_argument("pool")
    fl.add_argument("--out", required=True)
    fl.add_argument("--min_reward", type=float, default=None, help="records under this reward become unusable")
    fl.add_argument("--max_tokens", type=int, default=None, help="records longer than this become unusable")
    s = sub.add_parser("scripted", help="write a pool from the scripted solver (one shot)")
    s.add_argument("--task", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--n", type=int, default=6, help="candidates per prompt (paper: 6)")
    s.add_argument("--error_rate", type=float, default=0.1, help="share of deliberately wrong answers")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--limit", type=int, default=None, help="only the first N training prompts")
    s.add_argument("--trace", default=None,
                   help="trace style (default: the recipe's, conf/erils.yaml's pool; Sudoku: grid (fixed length, "
                        "37 tokens; the default), deduction (variable length; leaves the model at chance, "
                        "docs/erils.md) or grid_verbose (uncontrolled length: restated puzzle, grid, column check; "
                        "69 tokens))")
    st = sub.add_parser("stats", help="ERILS Tables IV/V of a pool: print, write next to it, and log to MLflow "
                                      "with --mlflow_uri")
    st.add_argument("pool")
    st.add_argument("--g_ext", type=int, default=None, help="G_ext of 'default usable' (default: the header's, else 2)")
    st.add_argument("--max_tokens", type=int, default=None, help="usability limit (default: the header's, else 500)")
    st.add_argument("--mlflow_uri", default=None, help="log to MLflow, e.g. sqlite:///runs/mlflow.db")
    st.add_argument("--experiment", default="lit_rl-external-pools", help="MLflow experiment name")
    st.add_argument("--run_name", default=None)
    st.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    st.add_argument("--no_write", action="store_true", help="do not write the .stats.md/.stats.json/.lengths.png files")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            from lit_rl.pools.backends import BackendError
            from lit_rl.pools.build import build_pool, load_build_config

            cfg = load_build_config(args.config, {"out": args.out, "limit": args.limit})
            try:
                res = build_pool(cfg, progress=not args.no_progress, overwrite=args.overwrite)
            except BackendError as e:
                print(f"error: {e}", file=sys.stderr)
                return 3
            print(json.dumps({"pool": str(res.pool), "prompts_total": res.prompts_total,
                              "prompts_done": res.prompts_done, "prompts_generated": res.prompts_generated,
                              "resumed_from": res.resumed_from, "dropped_lines": res.dropped_lines,
                              "wall_time_s": res.wall_time_s, "generation_wall_time_s": res.generation_wall_time_s,
                              "requests": res.requests, "retries": res.retries}))
            if not args.no_stats:
                ml = dict(cfg.mlflow or {})
                if args.mlflow_uri:
                    ml["tracking_uri"] = None if args.mlflow_uri == "none" else args.mlflow_uri
                stats, files = run_stats(res.pool, cfg.g_ext, None, tracking_uri=ml.get("tracking_uri"),
                                         experiment_name=ml.get("experiment_name", "lit_rl-external-pools"),
                                         run_name=ml.get("run_name"))
                print(stats_markdown(stats))
                print("wrote " + ", ".join(str(p) for p in files.values()), file=sys.stderr)
        elif args.cmd == "train-lm":
            from lit_rl.pools.build import load_build_config
            from lit_rl.pools.external_lm import train_from_config

            summary = train_from_config(load_build_config(args.config), log=lambda m: print(m, file=sys.stderr),
                                        overwrite=args.overwrite)
            print(json.dumps({k: v for k, v in summary.items() if k != "settings"}))
        elif args.cmd == "filter":
            from lit_rl.pools.pool_filter import filter_pool

            print(json.dumps({"pool": args.out, **filter_pool(args.pool, args.out, args.min_reward, args.max_tokens)}))
        elif args.cmd == "scripted":
            from lit_rl.tasks.registry import REGISTRY

            entry = REGISTRY.get(args.task)
            trace = args.trace or (entry.recipe_trace if entry is not None else None)
            count = build_scripted_pool(args.task, args.out, args.n, args.error_rate, args.seed, args.limit,
                                        trace=trace)
            print(json.dumps({"pool": args.out, "records": count}))
        else:
            stats, files = run_stats(args.pool, args.g_ext, args.max_tokens, write=not args.no_write,
                                     tracking_uri=args.mlflow_uri, experiment_name=args.experiment,
                                     run_name=args.run_name)
            if args.json:
                print(json.dumps({k: v for k, v in stats.items() if k != "lengths"}, indent=2))
            else:
                print(stats_markdown(stats))
            if files:
                print("wrote " + ", ".join(str(p) for p in files.values()), file=sys.stderr)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
