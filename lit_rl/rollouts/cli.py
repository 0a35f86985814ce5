"""``python -m lit_rl rollouts``: external rollout pools.

* ``rollouts scripted --task sudoku --out POOL [--n 6] [--error-rate 0.1] [--seed 42] [--limit N]``
  writes a pool from the scripted solver (:mod:`lit_rl.rollouts.scripted`) for the task's training
  prompts, in their recorded order, lengths counted with the tiny model's character tokenizer.
* ``rollouts stats POOL [--g-ext 2]`` prints the pool's statistics as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

from lit_rl.rollouts.pool import PoolRecord, _header, iter_pool, reorder_usable_first, write_pool_atomic


def build_scripted_pool(task_name: str, out: str | Path, n: int = 6, error_rate: float = 0.1, seed: int = 42, limit: int | None = None, task_kwargs: dict | None = None) -> int:
    """Write a scripted pool for ``task_name``'s training prompts; returns the number of records."""
    from lit_rl.models.tokenizer import build_char_tokenizer
    from lit_rl.rollouts.scripted import SCRIPTED_POLICIES
    from lit_rl.tasks import get_task

    if task_name not in SCRIPTED_POLICIES:
        raise ValueError(f"--task: no scripted policy for {task_name!r} (known: {sorted(SCRIPTED_POLICIES)})")
    task = get_task(task_name, **(task_kwargs or {}))
    tok = build_char_tokenizer()
    write = SCRIPTED_POLICIES[task_name]
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
    header = _header(task_name, f"scripted-{task_name}", tok.name_or_path, n=n, seed=seed, error_rate=error_rate, wall_time_s=round(time.perf_counter() - t0, 3))
    write_pool_atomic(out, header, records)
    return len(records)


def pool_stats(path: str | Path, g_ext: int = 2) -> dict:
    """Counts, mean length/reward, usable prompts (ERILS Table IV/V-style summary)."""
    header, records = iter_pool(path)
    per_prompt: dict[str, list[PoolRecord]] = defaultdict(list)
    for r in records:
        per_prompt[r.prompt_id].append(r)
    recs = [r for rs in per_prompt.values() for r in rs]
    n = max(len(recs), 1)
    return {
        "pool": str(path),
        "task": header.get("task"),
        "policy": header.get("policy"),
        "tokenizer": header.get("tokenizer"),
        "source_prompts": len(per_prompt),
        "completions": len(recs),
        "over_500_tokens": sum(not r.usable for r in recs),
        f"usable_prompts_g_ext_{g_ext}": sum(sum(r.usable for r in rs) >= g_ext for rs in per_prompt.values()),
        "all_valid_prompts": sum(all(r.usable for r in rs) for rs in per_prompt.values()),
        "mean_tokens": sum(r.num_tokens for r in recs) / n,
        "mean_reward": sum(r.reward for r in recs) / n,
        "correct": sum(r.reward >= 1.0 for r in recs),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lit_rl rollouts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scripted", help="write a pool from the scripted solver")
    s.add_argument("--task", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--n", type=int, default=6, help="candidates per prompt (paper: 6)")
    s.add_argument("--error-rate", type=float, default=0.1, help="share of deliberately wrong answers")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--limit", type=int, default=None, help="only the first N training prompts")
    st = sub.add_parser("stats", help="print pool statistics as JSON")
    st.add_argument("pool")
    st.add_argument("--g-ext", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "scripted":
            count = build_scripted_pool(args.task, args.out, args.n, args.error_rate, args.seed, args.limit)
            print(json.dumps({"pool": args.out, "records": count}))
        else:
            print(json.dumps(pool_stats(args.pool, args.g_ext), indent=2))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
