"""Rollout sources as a list (``data.init_args.sources``): the same rows as the g_on / g_ext shorthand describes,
rows of different widths stacked with their own widths, and a source order the batch keeps."""

from pathlib import Path

import torch

from datamodules import RolloutDataModule
from datamodules.sources import DiffusionOnPolicy, ExternalPool
from lit_rl.core.sources import Source
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import SudokuTask

ROOT = Path(__file__).resolve().parents[2]
POOL = str(ROOT / "data/pools/sudoku_scripted.jsonl.gz")
GEN = DecodeSettings(32, 32, 4, 1.0)


def _task():
    return SudokuTask(system_prompt="", question_template="{puzzle}", num_train=1000)


def _dm(**kw):
    dm = RolloutDataModule(_task(), prompts_per_batch=3, max_prompt_len=64, eval_size=4, **kw)
    dm.setup()
    return dm


def _policy():
    torch.manual_seed(0)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=256)


def test_a_sources_list_gives_the_rows_the_shorthand_gives():
    shorthand = _dm(pool_path=POOL, g_on=2, g_ext=2, generation=GEN)
    listed = _dm(sources=[DiffusionOnPolicy(2, GEN), ExternalPool(2, POOL, 512, min_width=GEN.gen_length)],
                 generation=GEN)
    assert [type(s).__name__ for s in shorthand.sources] == ["DiffusionOnPolicy", "ExternalPool"]
    assert [e.id for e in shorthand.train_examples] == [e.id for e in listed.train_examples]  # the pool's prompts
    policy = _policy()
    a, b = (shorthand.produce_rollouts(shorthand.prompt_batch(3), policy),
            listed.produce_rollouts(listed.prompt_batch(3), policy))
    for name in ("input_ids", "attention_mask", "completion_mask", "lengths", "rewards", "source", "group", "gen_width",
                 "hit_limit"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.texts == b.texts and set(shorthand.last_stats) == set(listed.last_stats)


def test_rows_of_different_widths_keep_their_own_width():
    # on-policy rows are L_gen = 32 wide; the pool's completions (~60 characters) need more: every row is
    # stacked at the larger width, on-policy rows' padding neither attended nor scored
    dm = _dm(sources=[DiffusionOnPolicy(1, GEN), ExternalPool(1, POOL, 512, min_width=GEN.gen_length)], generation=GEN)
    ro = dm.produce_rollouts(dm.prompt_batch(0), _policy())
    on, ext = ro.source == int(Source.ON_POLICY), ro.source == int(Source.EXTERNAL)
    width = ro.completion_mask.shape[1]
    assert width > 32 and ro.gen_width[on].eq(32).all() and ro.gen_width[ext].eq(width).all()
    comp_attn = ro.attention_mask[:, ro.prompt_len:]
    assert comp_attn[on].sum(-1).eq(32).all() and comp_attn[ext].sum(-1).eq(width).all()
    assert (ro.lengths[on] <= 32).all() and ro.completion_mask.sum(-1).tolist() == ro.lengths.tolist()


def test_the_source_order_is_the_row_order():
    dm = _dm(sources=[ExternalPool(2, POOL), DiffusionOnPolicy(1, GEN)], generation=GEN)
    ro = dm.produce_rollouts(dm.prompt_batch(0), _policy())
    assert ro.source.tolist() == [Source.EXTERNAL] * 6 + [Source.ON_POLICY] * 3
    assert ro.group.tolist() == [0, 0, 1, 1, 2, 2, 0, 1, 2]
    assert {"train/external/cut_frac", "time/generation_s", "train/on_policy/format_rate"} <= set(dm.last_stats)


def test_sources_in_yaml_through_the_cli(tmp_path):
    import yaml

    from lit_rl.cli import run_lightning_cli
    from lit_rl.config import preflight

    overlay = tmp_path / "sources.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"init_args": {"sources": [
        {"class_path": "datamodules.sources.ExternalPool", "init_args": {"num": 3, "pool_path": POOL, "min_width": 48}},
    ]}}}))
    argv = ["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(overlay),
            f"--trainer.default_root_dir={tmp_path}"]
    preflight(argv)  # a sources list needs no g_on / g_ext / pool_path
    cli = run_lightning_cli(argv[1:], run=False)  # run=False: no subcommand
    dm = cli.datamodule
    assert [type(s).__name__ for s in dm.sources] == ["ExternalPool"] and dm.sources[0].num == 3
    assert (dm.g_on, dm.g_ext) == (0, 3)


def test_two_pools_keep_their_own_records_and_the_generation_follows_the_list():
    grid = str(ROOT / "data/pools/sudoku_grid.jsonl.gz")
    dm = _dm(sources=[DiffusionOnPolicy(1, GEN), ExternalPool(1, POOL), ExternalPool(2, grid)])
    assert dm.generation == GEN and dm.eval_generation.gen_length == GEN.gen_length  # from the on-policy source
    assert [s.min_width for s in dm.sources[1:]] == [GEN.gen_length] * 2  # as wide as that generation
    batch = dm.prompt_batch(0)
    ro = dm.produce_rollouts(batch, _policy())
    ext = (ro.source == int(Source.EXTERNAL)).nonzero().squeeze(-1).tolist()
    assert len(ext) == 3 * (1 + 2) and [len(r) for r in batch.external] == [3, 3, 3]
    first, second = ext[:3], ext[3:]  # the first pool's row per prompt, then the second pool's two
    assert all(ro.texts[i] == batch.records[id(dm.sources[1])][g][0].completion for g, i in enumerate(first))
    texts = [r.completion for g in range(3) for r in batch.records[id(dm.sources[2])][g]]
    assert [ro.texts[i] for i in second] == texts
    assert {r.completion for g in range(3) for r in batch.records[id(dm.sources[1])][g]}.isdisjoint(texts)


def _pool_with_unusable_prompts(tmp_path: Path) -> str:
    """The grid pool with every third prompt's records marked unusable (too long, as ERILS App. B's filter)."""
    import gzip
    import json

    lines = gzip.open(ROOT / "data/pools/sudoku_grid.jsonl.gz", "rt").read().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        rec = json.loads(line)
        if int(rec["prompt_id"].rsplit("-", 1)[1]) % 3 == 0:
            rec["usable"] = False
        out.append(json.dumps(rec))
    path = tmp_path / "pool.jsonl"
    path.write_text("\n".join(out) + "\n")
    return str(path)


def _prompt_ids(dm, batches=20):
    return [e.id for step in range(batches) for e in dm.prompt_batch(step).examples]


def test_the_on_policy_baseline_follows_erils_prompt_order_on_a_pool_with_unusable_prompts(tmp_path):
    """ERILS App. B-E: SPG trains on the same prompts in the same order as ERILS. ERILS's stream keeps the
    prompts with G_ext usable records, then shuffles; SPG without ``prompt_order_pool`` shuffles all of them."""
    pool = _pool_with_unusable_prompts(tmp_path)
    erils = _dm(pool_path=pool, g_on=2, g_ext=2, generation=GEN)
    spg_all = _dm(pool_path=None, g_on=4, g_ext=0, generation=GEN)
    spg = _dm(pool_path=None, g_on=4, g_ext=0, generation=GEN, prompt_order_pool=pool, prompt_order_g_ext=2)
    assert len(erils.train_examples) == 666 and len(spg_all.train_examples) == 1000  # 334 of 1000 unusable
    assert _prompt_ids(spg) == _prompt_ids(erils)  # 60 prompts, step by step
    assert _prompt_ids(spg_all) != _prompt_ids(erils)
    assert not any(int(i.rsplit("-", 1)[1]) % 3 == 0 for i in _prompt_ids(spg))
    assert [type(s).__name__ for s in spg.sources] == ["DiffusionOnPolicy"]  # no external row is loaded


def test_on_a_pool_where_every_prompt_is_usable_the_baseline_order_is_unchanged():
    """The embedded Sudoku pool has two usable records for each of its 1000 prompts: naming it changes nothing
    (so conf/spg.yaml's curve stays the committed one)."""
    grid = str(ROOT / "data/pools/sudoku_grid.jsonl.gz")
    plain = _dm(pool_path=None, g_on=4, g_ext=0, generation=GEN)
    aligned = _dm(pool_path=None, g_on=4, g_ext=0, generation=GEN, prompt_order_pool=grid, prompt_order_g_ext=2)
    assert _prompt_ids(plain, 50) == _prompt_ids(aligned, 50)


def test_prompt_order_pool_is_refused_beside_an_external_pool():
    import pytest

    from lit_rl.errors import FieldError

    with pytest.raises(FieldError, match="prompt_order_pool"):
        RolloutDataModule(_task(), pool_path=POOL, g_on=2, g_ext=2, prompt_order_pool=POOL)
    with pytest.raises(FieldError, match="prompt_order_g_ext"):
        RolloutDataModule(_task(), pool_path=None, g_on=4, g_ext=0, prompt_order_pool=POOL, prompt_order_g_ext=0)
