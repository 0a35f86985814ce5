"""``rollouts filter``: a copy of a pool (gzipped when the name ends in ``.gz``) with only the records of at least
a reward (and at most ``max_tokens`` long) usable, for checks such as "can the dLLM learn the task from the
pool's correct rows?" (SFT capacity).

Records under ``min_reward`` are marked unusable and each prompt's records are put usable-first again
(:func:`~lit_rl.pools.pool.usable_first`: the order is kept within each part); records that were
unusable already (over the length limit) stay unusable. The header records the filter (``filtered_from``,
``min_reward``, ``filter_max_tokens``; ``max_usable_tokens`` becomes the smaller limit), and the file is written
atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_rl.pools.pool import iter_pool, usable_first, write_pool_atomic

__all__ = ["filter_pool"]


def filter_pool(src: str | Path, dst: str | Path, min_reward: float | None = None,
                max_tokens: int | None = None) -> dict[str, Any]:
    """Write ``dst`` from ``src``; returns counts: records, usable before and after, prompts with a usable record."""
    if Path(dst).resolve() == Path(src).resolve():
        raise ValueError(f"--out: {dst} is the source pool; write the filtered copy elsewhere")
    header, records = iter_pool(src)
    by_prompt: dict[str, list[Any]] = {}
    for rec in records:
        by_prompt.setdefault(rec.prompt_id, []).append(rec)
    before = after = 0
    out: list[Any] = []
    for recs in by_prompt.values():
        recs.sort(key=lambda r: r.index)
        before += sum(r.usable for r in recs)
        for r in recs:
            r.usable = (r.usable and (min_reward is None or r.reward >= min_reward)
                        and (max_tokens is None or r.num_tokens <= max_tokens))
        ordered = usable_first(recs)
        after += sum(r.usable for r in ordered)
        out.extend(ordered)
    header = {**header, "filtered_from": str(src), "min_reward": min_reward, "filter_max_tokens": max_tokens}
    if max_tokens is not None:  # the statistics count "over the limit" against the header's limit
        header["max_usable_tokens"] = min(int(header.get("max_usable_tokens", max_tokens)), max_tokens)
    write_pool_atomic(dst, header, out)
    return {"records": len(out), "usable_before": before, "usable_after": after,
            "prompts_with_usable": sum(any(r.usable for r in recs) for recs in by_prompt.values()),
            "prompts": len(by_prompt)}
