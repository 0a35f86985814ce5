"""The committed miniature Countdown pool (data/pools/countdown_ordered.jsonl.gz, written by the external model
that conf/external/countdown_ordered.yaml trains) matches the configs that read and describe it."""

from __future__ import annotations

from pathlib import Path

import yaml

from lit_rl.models.tokenizer import build_char_tokenizer
from lit_rl.pools.build import load_build_config
from lit_rl.pools.pool import iter_pool, load_pool
from lit_rl.tasks import CountdownTask

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/countdown_ordered.jsonl.gz"


def _overlay_task() -> CountdownTask:
    overlay = yaml.safe_load((ROOT / "conf/erils_countdown.yaml").read_text())
    data = overlay["data"]["init_args"]
    assert data["pool_path"] == str(POOL.relative_to(ROOT))
    return CountdownTask(**data["task"]["init_args"])


def test_the_erils_overlay_reads_507_prompts_of_two_usable_rows():
    task = _overlay_task()
    assert task.ordered  # the pool's problems: each solvable in the prompt's order
    pool = load_pool(POOL, 2, valid_ids=[e.id for e in task.train_examples()], task="countdown")
    assert len(pool) == 507  # docs/erils_countdown.md, Table IV analogue


def test_lengths_are_in_the_external_tokenizer_and_the_limit_is_the_build_configs():
    build = load_build_config(ROOT / "conf/external/countdown_ordered.yaml")
    header, records = iter_pool(POOL)
    records = list(records)
    assert header["tokenizer"] == build.backend_spec["model"] and header["length_unit"] == "tokens"
    assert header["max_usable_tokens"] == build.max_usable_tokens == 32
    assert len(records) == 6000 and all(r.usable == (r.num_tokens <= 32) for r in records)
    assert header["task_spec"] == build.task_spec  # the same problems (ordered) as the build config's
    char = build_char_tokenizer()
    chars = [len(char(r.completion, add_special_tokens=False)["input_ids"]) for r in records[:200]]
    assert sum(c != r.num_tokens for c, r in zip(chars, records[:200])) > 150  # another tokenizer than the dLLM's
    task = _overlay_task()
    by_id = {e.id: e for e in task.train_examples()}
    assert all(r.reward == task.reward(r.completion, by_id[r.prompt_id]) for r in records[:300])
