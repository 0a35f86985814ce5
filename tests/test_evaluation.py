"""The evaluation protocol's pure pieces: configs, schedule, subsets, sharding, scoring, results table."""

import json

import pytest
import torch

from lit_rl.evaluation import (
    ConfigScorer,
    EvalConfig,
    ResultsTable,
    eval_batches,
    is_due,
    paper_configs,
    run_config,
    select_subset,
)
from lit_rl.generation.settings import DecodeSettings
from lit_rl.tasks import get_task


def sudoku():
    return get_task("sudoku", num_train=2, system_prompt="", question_template="{puzzle}")


def partial(ex, wrong: int) -> str:
    """The solution with its first ``wrong`` blank cells replaced by a wrong digit."""
    sol = list(ex.answer)
    blanks = [i for i, c in enumerate(ex.meta["puzzle"]) if c == "0"]
    for i in blanks[:wrong]:
        sol[i] = "1" if sol[i] != "1" else "2"
    return "<answer>" + "".join(sol) + "</answer>"


class TablePolicy(torch.nn.Module):
    """A policy whose completion for (prompt, seed) is looked up in a table (default: no answer).

    ``generate`` returns rows ``[prompt index, seed, EOS]``; ``decode_completions`` maps them to text.
    """

    eos_id = 0

    def __init__(self, outputs: dict[tuple[str, int], str]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.outputs = outputs
        self.prompts: list[str] = []
        self.calls: list[tuple[int, int]] = []  # (batch size, seed) of each generate call

    def encode_prompts(self, messages, max_prompt_len=None):
        rows = []
        for m in messages:
            text = m[-1]["content"]
            if text not in self.prompts:
                self.prompts.append(text)
            rows.append([self.prompts.index(text) + 1])
        ids = torch.tensor(rows)
        return ids, torch.ones_like(ids)

    def generate(self, prompt_ids, prompt_mask, settings, seed):
        self.calls.append((prompt_ids.shape[0], seed))
        B = prompt_ids.shape[0]
        return torch.stack([prompt_ids[:, 0], torch.full((B,), seed), torch.zeros(B, dtype=torch.long)], 1)  # (B, 3)

    def completion_lengths(self, comp):
        return torch.full((comp.shape[0],), 3)

    def decode_completions(self, comp):
        return [self.outputs.get((self.prompts[int(p) - 1], int(s)), "no answer") for p, s, _ in comp.tolist()]


# -- configs ---------------------------------------------------------------------------------------


def test_paper_configs_match_the_protocol():
    cfgs = {c.name: c for c in paper_configs()}
    assert list(cfgs) == ["multi", "det128", "det256", "det512"]
    m = cfgs["multi"]
    assert m.num_samples == 4 and m.seeds == [1001, 1002, 1003, 1004]
    assert m.generation == DecodeSettings(gen_length=256, block_length=32, steps=128, temperature=0.9)
    for L in (128, 256, 512):
        d = cfgs[f"det{L}"]
        assert d.num_samples == 1 and d.generation == DecodeSettings(L, 32, L // 2, 0.0)
    assert m.metric_names[:5] == ["pass@1", "pass@2", "pass@3", "pass@4", "accuracy"]


def test_eval_config_checks_and_builds_settings_from_yaml_dicts():
    c = EvalConfig(name="x", generation={"gen_length": 64, "block_length": 32, "steps": 32, "temperature": 0.0},
                   num_samples=2)
    assert c.seeds == [1001, 1002] and isinstance(c.generation, DecodeSettings) and c.generation.gen_length == 64
    c = EvalConfig(name="ar", generation={"class_path": "lit_rl.generation.settings.DecodeSettings",
                                          "init_args": {"gen_length": 32, "steps": 32}})
    assert c.generation.gen_length == 32
    sentinel = object()  # an AR policy's settings object passes through untouched
    assert EvalConfig(name="ar", generation=sentinel).generation is sentinel
    with pytest.raises(ValueError, match="seeds"):
        EvalConfig(name="x", num_samples=2, seeds=[1])
    with pytest.raises(ValueError, match="parser"):
        EvalConfig(name="x", parser="strict")
    with pytest.raises(ValueError, match="name"):
        EvalConfig(name="a/b")


# -- schedule, subset, sharding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "mu, every, start, max_step, expected",
    [
        (1, 4, 0, 12, [4, 8, 12]),
        (2, 4, 4, 12, [4, 8, 12]),
        (2, 4, 8, 12, [8, 12]),
        (3, 4, 0, 12, [6, 9, 12]),  # steps 3, 6, 9, 12: each evaluation at the first batch past 4, 8, 12
        (4, 5, 3, 16, [4, 8, 16]),  # scheduled 3, 8, 13: 3 -> 4, 8 -> 8, 13 -> 16
    ],
)
def test_is_due_fires_once_per_scheduled_step(mu, every, start, max_step, expected):
    fired, last = [], 0
    for step in range(mu, max_step + 1, mu):  # global_step after each rollout batch of mu updates
        if is_due(step, last, start, every):
            fired.append(step)
            last = step
    assert fired == expected


def test_is_due_never_fires_for_step_zero_and_not_twice():
    assert not is_due(0, 0, 0, 4)
    assert is_due(4, 0, 0, 4) and not is_due(4, 4, 0, 4) and not is_due(5, 4, 0, 4)
    assert not is_due(3, 0, 4, 4)


def test_select_subset_first_and_seeded_random():
    ex = sudoku().eval_examples()
    assert [e.id for e in select_subset(ex, 3)] == [e.id for e in ex[:3]]
    a, b = select_subset(ex, 5, "random", seed=1), select_subset(ex, 5, "random", seed=1)
    assert [e.id for e in a] == [e.id for e in b] and len({e.id for e in a}) == 5
    assert [e.id for e in a] != [e.id for e in select_subset(ex, 5, "random", seed=2)]
    order = [e.id for e in ex]
    assert [order.index(e.id) for e in a] == sorted(order.index(e.id) for e in a)  # kept in set order
    assert len(select_subset(ex, None)) == len(ex) == len(select_subset(ex, 10_000))


def test_eval_batches_shard_whole_batches_round_robin():
    ex = sudoku().eval_examples()[:7]
    one = eval_batches(ex, 2)
    assert [len(b) for b in one] == [2, 2, 2, 1]
    r0, r1 = eval_batches(ex, 2, 0, 2), eval_batches(ex, 2, 1, 2)
    assert r0 == [one[0], one[2]] and r1 == [one[1], one[3]]  # the same batches as on one device


# -- scoring ---------------------------------------------------------------------------------------


def test_first_k_pass_at_k_of_a_stub_policy_matches_hand_computation():
    task = sudoku()
    e0, e1 = task.eval_examples()[:2]  # 8 and 9 blank cells
    outputs = {
        # e0: cell accuracy per seed 0, 4/8, 8/8, 0 -> best of first k: 0, 1/2, 1, 1
        (e0.question, 1002): partial(e0, 4),
        (e0.question, 1003): partial(e0, 0),
        # e1: 9/9, 0, 0, 0 -> best of first k: 1, 1, 1, 1
        (e1.question, 1001): partial(e1, 0),
    }
    policy = TablePolicy(outputs)
    cfg = EvalConfig(name="multi", generation=DecodeSettings(32, 32, 32, 0.9), num_samples=4, unbiased=True)
    result = run_config(policy, task, eval_batches([e0, e1], batch_size=2), cfg)
    assert result.correct.tolist() == [[0, 4, 8, 0], [9, 0, 0, 0]]
    assert result.total.tolist() == [8, 9]
    assert policy.calls == [(2, 1001), (2, 1002), (2, 1003), (2, 1004)]  # batched: one call per seed
    scorer = ConfigScorer(cfg)
    scorer.update(result)
    m = scorer.compute()
    # Sudoku pools best-of-k over blank cells: (8 * best_e0 + 9 * best_e1) / 17
    assert m["pass@1"] == pytest.approx(9 / 17)
    assert m["pass@2"] == pytest.approx((8 * 0.5 + 9) / 17)
    assert m["pass@3"] == pytest.approx(1.0) and m["pass@4"] == pytest.approx(1.0)
    # accuracy over all 8 samples: (0 + 4 + 8 + 0 + 9) / (4 * 8 + 4 * 9)
    assert m["accuracy"] == pytest.approx(21 / 68)
    # unbiased, binary "fully solved": each prompt has c = 1 of n = 4; pass@2 = 1 - C(3,2)/C(4,2) = 1/2
    assert [m[f"unbiased_pass@{k}"] for k in (1, 2, 3, 4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert m["length_mean"] == 3 and m["hit_limit_frac"] == 0


def test_scorer_merges_rank_shards_like_the_whole_set():
    """What DDP sync does (sum of states): two shards merged equal one pass over all prompts."""
    task = sudoku()
    ex = task.eval_examples()[:5]
    outputs = {(e.question, 1001): partial(e, i) for i, e in enumerate(ex)}
    cfg = EvalConfig(name="det", generation=DecodeSettings(32, 32, 32, 0.0))
    full = ConfigScorer(cfg)
    full.update(run_config(TablePolicy(outputs), task, eval_batches(ex, 2), cfg))
    shards = [ConfigScorer(cfg) for _ in range(2)]
    for r, s in enumerate(shards):
        s.update(run_config(TablePolicy(outputs), task, eval_batches(ex, 2, r, 2), cfg))
    for metric in ("pass_at_k", "accuracy", "length", "hit_limit"):
        getattr(shards[0], metric).merge_state(getattr(shards[1], metric))
    assert shards[0].compute() == pytest.approx(full.compute())
    blanks = [e.meta["puzzle"].count("0") for e in ex]
    assert full.compute()["pass@1"] == pytest.approx(sum(b - min(i, b) for i, b in enumerate(blanks)) / sum(blanks))


# -- results table ---------------------------------------------------------------------------------


def test_results_table_csv_markdown_and_app_d_report():
    t = ResultsTable()
    t.add(100, "multi", {"pass@1": 0.2, "pass@2": 0.3, "accuracy": 0.2, "length_mean": 50.0})
    t.add(100, "det256", {"pass@1": 0.25, "accuracy": 0.25})
    t.add(200, "multi", {"pass@1": 0.4, "pass@2": 0.5, "accuracy": 0.4, "length_mean": 40.0})
    t.add(200, "det256", {"pass@1": 0.1, "accuracy": 0.1})
    t.add(300, "multi", {"pass@1": 0.4, "pass@2": 0.6, "accuracy": 0.4, "length_mean": 30.0})
    t.add(300, "det256", {"pass@1": 0.2, "accuracy": 0.2})
    t.add(300, "det256", {"pass@1": 0.15, "accuracy": 0.15})  # re-evaluation replaces
    csv_lines = t.to_csv().splitlines()
    assert csv_lines[0] == "step,config,metric,value"
    assert "300,det256,pass@1,0.15" in csv_lines and "300,det256,pass@1,0.2" not in csv_lines
    md = t.to_markdown().splitlines()
    assert md[0] == "| step | multi pass@1 | multi pass@2 | multi accuracy | det256 pass@1 | det256 accuracy |"
    assert md[2] == "| 100 | 0.2000 | 0.3000 | 0.2000 | 0.2500 | 0.2500 |"  # fractions, as logged and printed
    pct = t.to_markdown(percent=True).splitlines()
    assert pct[0].startswith("| step | multi pass@1 (%) | multi pass@2 (%) | multi accuracy (%) |")
    assert pct[2] == "| 100 | 20.00 | 30.00 | 20.00 | 25.00 | 25.00 |"
    rep = t.report("pass@1")
    assert rep["steps"] == [100, 200, 300]
    assert rep["configs"]["multi"]["best"]["step"] == 200  # tie 0.4 at 200 and 300: the earliest
    assert rep["configs"]["det256"]["best"] == {"step": 100, "metrics": {"pass@1": 0.25, "accuracy": 0.25}}
    assert rep["configs"]["det256"]["final"]["step"] == 300
    assert rep["configs"]["multi"]["final"]["metrics"]["pass@2"] == 0.6
    json.dumps(rep)
    md = ResultsTable.report_markdown(rep)
    assert "| det256 | best | 100 | pass@1 0.2500, accuracy 0.2500 |" in md
    assert ResultsTable(t.state()).rows == t.rows
