"""IGPO's inpainting stage and replacement (lit_rl.algorithms.inpaint): the stage against the real tiny dLLM, the
real Sudoku task and the real decode engine; the replacement against hand-built rows; conf/igpo.yaml through the
real CLI."""

from __future__ import annotations

import random
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.algorithms.inpaint import InpaintReplace, InpaintSettings, InpaintStage, replacement_pairs
from lit_rl.batch import Inpainted, PromptBatch, RolloutBatch, Source
from lit_rl.errors import FieldError
from lit_rl.generation.continuations import DiffusionContinuations
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.tasks import SudokuTask
from lit_rl.tasks.base import Example
from lit_rl.tasks.registry import task_entry

ROOT = Path(__file__).resolve().parents[2]
T, F = True, False
GEN = DecodeSettings(gen_length=48, block_length=16, steps=6, temperature=1.0)
# two puzzles (solution, puzzle with 0 for blanks)
PUZZLES = [("1234341221434321", "1034301221404301"), ("2143341212344321", "2103300212304021")]


def test_replacement_pairs_take_the_first_failed_slots_and_the_first_correct_new_rows():
    # group 0 (triggered, 4 on-policy rows 0-3): correct new rows 1, 3 -> k = min(2, floor(0.5 * 4)) = 2
    # group 1 (not triggered): nothing; group 2 (triggered, on-policy rows 6, 8 and a pool row 7): new rows 5, 6
    # correct -> k = min(2, max(1, floor(0.5 * 2))) = 1
    group = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])
    on = torch.tensor([T, T, T, T, T, T, T, F, T])
    trig = torch.tensor([T, F, T])
    new_group = torch.tensor([0, 0, 0, 0, 2, 2, 2])
    new_ok = torch.tensor([F, T, F, T, F, T, T])
    assert replacement_pairs(group, on, trig, new_group, new_ok, 0.5) == [(0, 1), (1, 3), (6, 5)]
    # a larger fraction is still capped by the correct rows; no correct row -> no replacement
    assert replacement_pairs(group, on, trig, new_group, new_ok, 1.0) == [(0, 1), (1, 3), (6, 5), (8, 6)]
    assert replacement_pairs(group, on, trig, new_group, torch.zeros(7, dtype=torch.bool), 1.0) == []


def _rows() -> RolloutBatch:
    """Two groups of 2 rows, prompt width 2, completion width 4 (EOS = 9)."""
    ids = torch.tensor([[1, 2, 5, 5, 9, 9], [1, 2, 6, 9, 9, 9], [3, 4, 7, 9, 9, 9], [3, 4, 8, 8, 8, 9]])
    return RolloutBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), prompt_len=2,
        completion_mask=torch.tensor([[T, T, T, F], [T, T, F, F], [T, T, F, F], [T, T, T, T]]),
        lengths=torch.tensor([3, 2, 2, 4]), rewards=torch.tensor([0.5, 0.0, 1.0, 0.0]),
        source=torch.zeros(4, dtype=torch.long), group=torch.tensor([0, 0, 1, 1]), texts=["a", "b", "c", "d"],
        prompt_ids=["p0", "p0", "p1", "p1"], hit_limit=torch.tensor([F, F, F, T]), row=torch.tensor([10, 11, 12, 13]),
    )


def test_the_processor_copies_the_correct_hinted_rows_into_the_failed_slots():
    ro = _rows()
    inp = Inpainted(
        row=ro.row.clone(), triggered=torch.tensor([T, F]), no_reference=torch.tensor([F, F]),
        group=torch.tensor([0, 0]), completion=torch.tensor([[4, 4, 4, 4], [2, 3, 9, 9]]),
        hint=torch.tensor([[T, F, F, F], [F, T, F, F]]), lengths=torch.tensor([4, 3]), rewards=torch.tensor([0.2, 1.0]),
        correct=torch.tensor([F, T]), texts=["wrong", "right"], hit_limit=torch.tensor([T, F]),
    )
    batch = PromptBatch(examples=[], step=0)
    batch.put(inp)
    out = InpaintReplace(InpaintSettings(replace_fraction=0.5)).process(ro, batch)
    # k = min(1 correct, max(1, floor(0.5 * 2))) = 1: slot 0 takes new row 1
    assert out.input_ids[0].tolist() == [1, 2, 2, 3, 9, 9]
    assert out.source.tolist() == [int(Source.INPAINTED), 0, 0, 0]
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and out.lengths.tolist() == [3, 2, 2, 4]
    assert out.completion_mask[0].tolist() == [T, T, T, F] and out.hint_mask[0].tolist() == [F, T, F, F]
    assert out.texts == ["right", "b", "c", "d"] and out.row.tolist() == [10, 11, 12, 13]  # the slot's row id
    assert not out.hit_limit[0] and not out.hint_mask[1:].any()
    assert torch.equal(out.input_ids[1:], ro.input_ids[1:])  # the other rows are untouched
    assert batch.stats["train/inpaint/rows_replaced"] == 1.0
    assert batch.stats["train/inpaint/replaced_reward_mean"] == 1.0
    # rows the stage did not see, or no stage output at all, are refused
    with pytest.raises(RuntimeError, match="other rows"):
        InpaintReplace().process(ro.select(torch.tensor([T, T, T, F])), batch)
    with pytest.raises(RuntimeError, match="rollout_stages"):
        InpaintReplace().process(ro, PromptBatch(examples=[], step=0))


def test_settings_refuse_bad_values_by_name():
    for kw, field in [({"hint_source": "web"}, "hint_source"), ({"replace_fraction": 0.0}, "replace_fraction"),
                      ({"chunk_min": 5, "chunk_max": 4}, "chunk_min"), ({"shown_min": 0.7}, "shown_min"),
                      ({"reserve": -1}, "reserve"), ({"rows_per_group": 0}, "rows_per_group")]:
        with pytest.raises(FieldError) as e:
            InpaintSettings(**kw)
        assert e.value.field == field
    assert InpaintReplace(InpaintSettings(enabled=False)).stage is None


def _grid(k: int, wrong_blanks: int = 0) -> str:
    """Puzzle ``k``'s grid-trace completion with its first ``wrong_blanks`` blank cells wrong (Sudoku's reward is
    the share of blanks right)."""
    sol, puz = PUZZLES[k]
    blanks = [i for i, c in enumerate(puz) if c == "0"][:wrong_blanks]
    g = "".join(str(int(c) % 4 + 1) if i in blanks else c for i, c in enumerate(sol))
    return f"<reasoning>{g}</reasoning>\n<answer>{g}</answer>"


def _setup(texts, reward_funcs=None):
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    task = SudokuTask(system_prompt="", question_template="{puzzle}", num_train=10, reward_funcs=reward_funcs)
    examples = [Example(id=f"p{i}", question="", answer=sol, meta={"puzzle": puz}) for i, (sol, puz) in
                enumerate(PUZZLES)]
    ids, mask = policy.encode_prompts([task.messages(e) for e in examples])
    ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)  # (4, P): 2 rows per group
    comp = torch.full((4, 48), policy.eos_id)
    ro = RolloutBatch(
        input_ids=torch.cat([ids, comp], 1), attention_mask=torch.cat([mask, torch.ones_like(comp)], 1),
        prompt_len=ids.shape[1], completion_mask=torch.zeros(4, 48, dtype=torch.bool), lengths=torch.ones(4),
        rewards=torch.tensor(task.total_rewards(list(texts), [examples[0]] * 2 + [examples[1]] * 2).totals),
        source=torch.zeros(4, dtype=torch.long), group=torch.tensor([0, 0, 1, 1]),
        texts=list(texts), prompt_ids=["p0", "p0", "p1", "p1"], hit_limit=torch.zeros(4, dtype=torch.bool),
    )
    batch = PromptBatch(examples=examples, step=5, task=task, generation=GEN)
    return policy, task, batch, ro


def test_the_stage_decodes_hinted_rows_for_triggered_groups_only_and_keeps_every_hint():
    # group 0: both rows partly right (partial credit < 1) -> fires; group 1 has a fully correct row -> does not
    policy, task, batch, ro = _setup([_grid(0, 1), "", _grid(1), _grid(1, 3)])
    settings = InpaintSettings(chunk_min=2, chunk_max=4, reserve=6)
    engine = DiffusionContinuations(policy, GEN)
    InpaintStage(settings, seed=1).run(batch, ro, policy, engine)
    inp = batch.inpainted
    assert inp.triggered.tolist() == [T, F] and inp.group.tolist() == [0, 0]  # G_on = 2 rows for group 0 only
    trace = task_entry("sudoku").traces["grid"](batch.examples[0], random.Random(0), 0.0)
    ref = policy.tokenizer(trace, add_special_tokens=False)["input_ids"] + [policy.eos_id]  # 38 tokens <= 48 - 6
    for r in range(2):
        h = inp.hint[r]
        assert not h[len(ref):].any() and not h[int(inp.lengths[r]):].any()  # inside the trace and the completion
        assert inp.completion[r][h].tolist() == [ref[i] for i in h.nonzero().flatten().tolist()]
    assert inp.hint.any()
    assert inp.texts == policy.decode_completions(inp.completion)
    assert inp.rewards.tolist() == task.total_rewards(inp.texts, [batch.examples[0]] * 2).totals
    s = batch.stats
    assert s["train/inpaint/trigger_rate"] == 0.5 and s["train/inpaint/rows"] == 2.0
    # positions decoded per prompt: the canvases' masks (the trace's hints, some after an early EOS, excluded)
    assert 0 < s["train/cost/tokens_inpaint"] <= (2 * 48 - int(inp.hint.sum())) / 2
    # the same seed and step draw the same hints and rows; another step draws others
    again = PromptBatch(examples=batch.examples, step=5, task=task, generation=GEN)
    InpaintStage(settings, seed=1).run(again, ro, policy, engine)
    assert torch.equal(again.inpainted.completion, inp.completion) and torch.equal(again.inpainted.hint, inp.hint)
    other = PromptBatch(examples=batch.examples, step=6, task=task, generation=GEN)
    InpaintStage(settings, seed=1).run(other, ro, policy, engine)
    assert not torch.equal(other.inpainted.hint, inp.hint)


def test_a_fully_shown_trace_is_the_reference_and_scores_as_correct():
    policy, task, batch, ro = _setup([""] * 4)
    settings = InpaintSettings(chunk_min=2, chunk_max=4, reserve=6, shown_min=1.0, shown_max=1.0, rows_per_group=1)
    InpaintStage(settings, seed=0).run(batch, ro, policy, DiffusionContinuations(policy, GEN))
    assert batch.inpainted.rewards.tolist() == [1.0, 1.0] and batch.inpainted.correct.all()
    assert (batch.inpainted.completion[batch.inpainted.hint] == policy.eos_id).sum() == 2  # the appended EOS
    out = InpaintReplace(settings).process(ro, batch)
    assert out.source.tolist() == [int(Source.INPAINTED), 0, int(Source.INPAINTED), 0]
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    # append_eos false (IGPO's code): text tokens only are hinted
    no_eos = InpaintSettings(chunk_min=2, chunk_max=4, reserve=6, shown_min=1.0, shown_max=1.0, append_eos=False)
    InpaintStage(no_eos, seed=0).run(batch, ro, policy, DiffusionContinuations(policy, GEN))
    assert batch.inpainted.hint.any() and not (batch.inpainted.completion[batch.inpainted.hint] == policy.eos_id).any()


def test_correctness_is_the_verifiers_and_extra_rewards_see_the_hinted_rows_ids():
    """A format reward of +1 on every row makes wrong rows' totals reach 1: they still trigger the stage, and a
    wrong hinted row is still not correct; the reward function gets each hinted row's completion ids."""
    seen = []

    def always_one(completions, completion_ids=None, **kwargs):
        seen.append(completion_ids)
        return [1.0] * len(completions)

    policy, task, batch, ro = _setup([_grid(0, 2)] * 2 + [_grid(1)] * 2, [always_one])
    settings = InpaintSettings(chunk_min=2, chunk_max=4, reserve=6, shown_min=0.0, shown_max=0.0)  # last chunk only
    InpaintStage(settings, seed=0).run(batch, ro, policy, DiffusionContinuations(policy, GEN))
    inp = batch.inpainted
    assert inp.triggered.tolist() == [T, F]  # group 0's totals are >= 1 but its verifier scores are not
    assert (inp.rewards >= 1.0).all() and not inp.correct.any()  # a random tiny model does not solve the puzzle
    ids = seen[-1]
    assert [len(x) for x in ids] == inp.lengths.tolist() and ids[0] == inp.completion[0, : len(ids[0])].tolist()


def test_without_a_reference_the_stage_says_so_once_and_leaves_the_groups(recwarn):
    policy, task, batch, ro = _setup([""] * 4)
    stage = InpaintStage(InpaintSettings(hint_source="pool", chunk_min=2, chunk_max=4, reserve=6), seed=0)
    engine = DiffusionContinuations(policy, GEN)
    stage.run(batch, ro, policy, engine)  # no pool rows in the batch
    assert batch.inpainted.no_reference.tolist() == [T, T] and len(batch.inpainted.group) == 0
    assert batch.stats["train/inpaint/no_reference"] == 2.0 and batch.stats["train/inpaint/rows"] == 0.0
    stage.run(batch, ro, policy, engine)
    assert sum("no correct external record" in str(w.message) for w in recwarn) == 1
    out = InpaintReplace(stage.settings).process(ro, batch)
    assert torch.equal(out.input_ids, ro.input_ids) and (out.source == 0).all()


def test_igpo_config_trains_hinted_rows_through_the_cli(tmp_path):
    """conf/igpo.yaml on the tiny overlay, every chunk shown (so the hinted rows are the reference and correct):
    rows are replaced, and d1's loss sees and filters their hint positions."""
    import yaml

    from lit_rl.cli import run_lightning_cli

    cfg = yaml.safe_load((ROOT / "conf/igpo.yaml").read_text())
    procs = cfg["model"]["init_args"]["processors"]
    procs[0]["init_args"]["settings"] |= {"shown_min": 1.0, "shown_max": 1.0}
    (tmp_path / "shown.yaml").write_text(yaml.safe_dump({"model": {"init_args": {"processors": procs}}}))
    run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "conf/igpo.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"), f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "--config", str(tmp_path / "shown.yaml"),
    ])
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    m = run.data.metrics
    assert m["train/inpaint/trigger_rate"] > 0 and m["train/inpaint/correct_frac"] == 1.0
    assert m["train/inpaint/rows_replaced"] >= 1 and m["train/inpaint/replaced_reward_mean"] == 1.0
    # d1's entropy filter: of each replaced row's ~38 hint positions the top floor(0.2 n) stay
    hints = client.get_metric_history(run.info.run_id, "train/d1/hint_tokens")
    kept = {h.step: h.value for h in client.get_metric_history(run.info.run_id, "train/d1/hint_tokens_kept")}
    assert any(h.value > 0 for h in hints)
    assert all(kept[h.step] <= 0.2 * h.value + 1e-6 for h in hints if h.value > 0)


def test_a_processor_without_a_seed_draws_from_the_modules():
    from lit_rl.algorithms.advantages import SourceSpecific
    from lit_rl.algorithms.erils import ERILSModule

    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    own, given = InpaintReplace(), InpaintReplace(seed=3)
    ERILSModule(policy, processors=[own, SourceSpecific()], seed=7)
    ERILSModule(policy, processors=[given, SourceSpecific()], seed=7)
    assert own.seed == 7 and own.stage.seed == 7  # seed_everything-style runs vary the module's seed only
    assert given.seed == 3 and given.stage.seed == 3
