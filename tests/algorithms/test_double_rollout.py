"""Double-rollout GRPO: the orchestration by hand with a stub backend, the module's step, and a tiny e2e fit
through the real CLI."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.core.advantages import group_centered
from lit_rl.algorithms.double_rollout import (
    DoubleRolloutGRPO,
    DoubleRolloutSettings,
    GRPOLossSettings,
    estimate_rewards,
)
from lit_rl.algorithms.processors import GroupBaseline
from lit_rl.generation.ar import ARBackend
from lit_rl.batch import RolloutBatch, Source

ROOT = Path(__file__).resolve().parents[2]

# toy vocabulary: 0 EOS, 1 "|" (the delimiter), 2 "a", 3 "b", 4 "Y" (correct answer), 5 "N", 6 pad, 7-9 prompt
EOS, D, A, B_, Y, N_, PAD = 0, 1, 2, 3, 4, 5, 6
CHARS = {0: "", 1: "|", 2: "a", 3: "b", 4: "Y", 5: "N", 6: "", 7: "p", 8: "q", 9: "r"}


def decode(ids: torch.Tensor) -> list[str]:
    out = []
    for row in ids.tolist():
        row = row[: row.index(EOS)] if EOS in row else row
        out.append("".join(CHARS[t] for t in row))
    return out


def score(texts, groups):
    # correct iff the text ends with "Y"
    return [1.0 if t.endswith("Y") else 0.0 for t in texts]


class StubBackend(ARBackend):
    """Returns fixed continuations per prefix (looked up by the prefix tokens) and records the calls."""

    eos_id = EOS

    def __init__(self, table: dict[tuple[int, ...], list[list[int]]]) -> None:
        self.table, self.calls = table, []

    def generate(self, prompt_ids, prompt_mask, *, max_new_tokens, temperature=1.0, top_p=1.0, n=1, seed=0):
        raise AssertionError("the orchestration must not call the first stage")

    def continue_from(self, prefix_ids, n, max_new_tokens, *, temperature=1.0, top_p=1.0, seed=0):
        self.calls.append(([list(p) for p in prefix_ids], n, list(max_new_tokens)))
        width = max(max_new_tokens)
        out = torch.full((len(prefix_ids) * n, width), EOS)
        for k, (p, b) in enumerate(zip(prefix_ids, max_new_tokens)):
            conts = self.table[tuple(p)]
            assert len(conts) == n
            for j, c in enumerate(conts):
                c = c[:b]  # the backend honours the per-prefix budget
                out[k * n + j, : len(c)] = torch.tensor(c)
        return out


def batch_of(prompts: list[list[int]], completions: list[list[int]], groups: list[int],
             rewards: list[float]) -> RolloutBatch:
    """Rows in the RolloutBatch layout: left-padded prompts, EOS-filled completions."""
    P = max(len(p) for p in prompts)
    L = max(len(c) for c in completions)
    rows, masks, comps, lengths = [], [], [], []
    for g, c in zip(groups, completions):
        p = prompts[g]
        rows.append([PAD] * (P - len(p)) + p)
        masks.append([0] * (P - len(p)) + [1] * len(p))
        comps.append(c + [EOS] * (L - len(c)))
        lengths.append(len(c))
    comp = torch.tensor(comps)
    return RolloutBatch(
        input_ids=torch.cat([torch.tensor(rows), comp], 1),
        attention_mask=torch.cat([torch.tensor(masks), torch.ones_like(comp)], 1),
        prompt_len=P,
        completion_mask=torch.arange(L)[None] < torch.tensor(lengths)[:, None],
        lengths=torch.tensor(lengths),
        rewards=torch.tensor(rewards),
        source=torch.zeros(len(groups), dtype=torch.long),
        group=torch.tensor(groups),
        texts=decode(comp),
        prompt_ids=[f"p{g}" for g in groups],
        hit_limit=torch.zeros(len(groups), dtype=torch.bool),
    )


def run(ro, backend, settings, max_new_tokens=16):
    return estimate_rewards(
        ro, backend, score, decode, [D], EOS, settings, group_centered,
        correct_threshold=1.0, max_new_tokens=max_new_tokens, seed=0,
    )


# Group 0 (prompt [7]) has three rollouts, group 1 (prompt [8, 9]) two. ρ 0.5, N 2, buffer 1.
#   r0 "aaaa|N"  T=4 cut 2 budget 3, wrong;  continuations of [7,a,a]:   "|Y" ✓, "|N" ✗  → r̂ 0.5
#   r1 "aa|Y"    T=2 cut 1 budget 2, right;  continuations of [7,a]:     "a|N" cut to "a|" ✗, "|N" ✗ → r̂ 0
#   r2 "bbbbbb|N" T=6 cut 3 budget 4, wrong; continuations of [7,b,b,b]: "b|Y" ✓, "|Y" ✓  → r̂ 1
#   r3 "aaaa" (no delimiter; "whole": T=4 cut 2 budget 3), wrong; of [8,9,a,a]: "Y" ✓, "N" ✗ → r̂ 0.5
#   r4 "|Y" T=0 cut 0 budget 1, right; of [8,9] (prompt only): "Y…" cut to "Y" ✓, "N" ✗ → r̂ 0.5
PROMPTS = [[7], [8, 9]]
COMPLETIONS = [
    [A, A, A, A, D, N_, EOS],
    [A, A, D, Y, EOS],
    [B_, B_, B_, B_, B_, B_, D, N_, EOS],
    [A, A, A, A, EOS],
    [D, Y, EOS],
]
GROUPS = [0, 0, 0, 1, 1]
ORIGINAL = [0.0, 1.0, 0.0, 0.0, 1.0]
TABLE = {
    (7, A, A): [[D, Y, EOS], [D, N_, EOS]],
    (7, A): [[A, D, N_, EOS], [D, N_, EOS]],
    (7, B_, B_, B_): [[B_, D, Y, EOS], [D, Y, EOS]],
    (8, 9, A, A): [[Y, EOS], [N_, EOS]],
    (8, 9): [[Y, Y, EOS], [N_, EOS]],
}


def test_revised_rewards_replacement_and_advantages_by_hand():
    backend = StubBackend(TABLE)
    ro = batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL)
    est = run(ro, backend, DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=1))
    # one backend call: every prefix = prompt ⊕ t[:floor(ρT)], budgets ceil((1-ρ)T) + 1
    (prefixes, n, budgets), = backend.calls
    assert n == 2
    assert prefixes == [[7, A, A], [7, A], [7, B_, B_, B_], [8, 9, A, A], [8, 9]]
    assert budgets == [3, 2, 4, 3, 1]
    assert est.cont_rewards.tolist() == [[1, 0], [0, 0], [1, 1], [1, 0], [1, 0]]
    assert est.revised.tolist() == [0.5, 0.0, 1.0, 0.5, 0.5]
    # group 0: mean 0.5 → A = [0, -0.5, 0.5]; group 1: all 0.5 → A = 0 (the original rewards differed!)
    assert est.advantages.tolist() == [0.0, -0.5, 0.5, 0.0, 0.0]
    # one-sided: only r2 (A > 0, own answer wrong) is replaced, by its first correct continuation;
    # r1 (right answer, A < 0) is NOT replaced the other way round
    assert est.replaced.tolist() == [-1, -1, 0, -1, -1]
    final = est.rollouts
    assert final.completion_ids[2, :7].tolist() == [B_, B_, B_, B_, D, Y, EOS]  # t[:3] ⊕ "b|Y" EOS
    assert int(final.lengths[2]) == 7 and final.source.tolist() == [0, 0, int(Source.CONTINUATION), 0, 0]
    assert final.completion_mask[2].sum() == 7 and not final.hit_limit[2]
    # the other rows are unchanged; rewards are the revised ones
    assert torch.equal(final.completion_ids[:2], ro.completion_ids[:2])
    assert final.rewards.tolist() == est.revised.tolist()
    assert est.original.tolist() == ORIGINAL
    # generated tokens incl. EOS, after budget cuts: r0 3+3, r1 2+2, r2 4+3, r3 2+2, r4 1+1
    assert est.stage2_tokens == 23


def test_missing_skip_keeps_the_verifier_reward_for_rows_without_delimiter():
    backend = StubBackend(TABLE)
    ro = batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL)
    est = run(ro, backend, DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=1, missing="skip"))
    assert [p for p in backend.calls[0][0]] == [[7, A, A], [7, A], [7, B_, B_, B_], [8, 9]]  # r3 skipped
    assert est.has_continuations.tolist() == [True, True, True, False, True]
    assert est.revised.tolist() == [0.5, 0.0, 1.0, 0.0, 0.5]  # r3 keeps 0
    assert est.advantages[3:].tolist() == [-0.25, 0.25]


# One group of four, ρ 0.5, N 2, buffer 4. r0..r2 are wrong but all their continuations are right (r̂ 1); r3 is
# right but both its continuations are wrong (r̂ 0)
#   r0 "aa|N"      T 2 cut 1 budget 5: "aaa|Y"+EOS is 6 tokens → cut to "aaa|Y" (no EOS), still right
#   r1 "bbbb|N"    T 4 cut 2 budget 6: "|Y"+EOS
#   r2 "ababab|N"  T 6 cut 3 budget 7: "bbb|Y"+EOS
#   r3 "|Y"        T 0 cut 0 budget 4: "N"+EOS twice
BONUS_COMPS = [[A, A, D, N_, EOS], [B_, B_, B_, B_, D, N_, EOS], [A, B_, A, B_, A, B_, D, N_, EOS], [D, Y, EOS]]
BONUS_TABLE = {
    (7, A): [[A, A, A, D, Y, EOS]] * 2,
    (7, B_, B_): [[D, Y, EOS]] * 2,
    (7, A, B_, A): [[B_, B_, B_, D, Y, EOS]] * 2,
    (7,): [[N_, EOS]] * 2,
}


def _bonus_estimate(**kw):
    ro = batch_of([[7]], BONUS_COMPS, [0, 0, 0, 0], [0.0, 0.0, 0.0, 1.0])
    return run(ro, StubBackend(BONUS_TABLE), DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=4,
                                                                   length_bonus=1.0, **kw))


def test_length_bonus_on_positive_advantage_rows_added_after_the_baseline():
    est = _bonus_estimate()
    # r̂ = [1, 1, 1, 0] → A = [.25, .25, .25, -.75]; r0..r2 wrong with A > 0 → replaced by continuation 0
    assert est.revised.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert est.replaced.tolist() == [0, 0, 0, -1]
    # L = tokens of the FINAL row incl. EOS: 1+5 (cut, no EOS), 2+3, 3+6, 3 (r3 unchanged)
    assert est.rollouts.lengths.tolist() == [6, 5, 9, 3]
    assert bool(est.rollouts.hit_limit[0]) and not bool(est.rollouts.hit_limit[1])
    # S = {0, 1, 2}: mean 20/3, population std sqrt(26)/3 ≈ 1.6997; z = [-0.392, -0.981, 1.373];
    # bonus = max(0, -z), upward only: r2 (long) gets none, r3 (not in S) gets none
    s_len = torch.tensor([6.0, 5.0, 9.0], dtype=torch.float64)
    z = (s_len - s_len.mean()) / (s_len.std(unbiased=False) + 1e-6)
    expected_bonus = [float(-z[0]), float(-z[1]), 0.0, 0.0]  # ≈ [0.392, 0.981, 0, 0]
    assert est.bonus.tolist() == pytest.approx(expected_bonus, rel=1e-5)
    final = torch.tensor([1.0, 1.0, 1.0, 0.0]) + torch.tensor(expected_bonus)
    assert torch.allclose(est.rollouts.rewards, final.float())
    # the bonus is added after the revised rewards' baseline (mean 3/4): A = [.25 + .392, .25 + .981, .25, -.75].
    # The replaced long row r2 keeps A = 0.25 > 0: its correct continuation is pushed up, not down
    assert est.advantages.tolist() == pytest.approx([0.25 + expected_bonus[0], 0.25 + expected_bonus[1], 0.25, -0.75],
                                                    rel=1e-5)
    replaced = est.replaced >= 0
    assert (est.advantages[replaced] > 0).all()


def test_length_bonus_in_baseline_is_the_earlier_rule_that_pushes_a_replacement_down():
    est = _bonus_estimate(length_bonus_in_baseline=True)
    # recomputed from r̂ + bonus ≈ [1.392, 1.981, 1, 0]: mean ≈ 1.093, so the replaced long row r2 ends with
    # A = 1 - 1.093 ≈ -0.093: the update would push its correct continuation "bbb|Y" down
    final = est.rollouts.rewards
    assert torch.allclose(est.advantages, group_centered(final, torch.zeros(4, dtype=torch.long)))
    assert est.replaced[2] == 0 and est.advantages[2].item() == pytest.approx(-0.0933, abs=1e-3)


def test_length_bonus_with_the_paper_baseline_keeps_replaced_rows_positive():
    # NeMo-RL's advantage (the paper configs): LOO baseline, divided by the others' sample std (+1e-6) where > 0.
    # r̂ = [1, 1, 1, 0]: rows 0-2's others [1, 1, 0] → b 2/3, σ 1/√3 → A = (1/3)·√3 ≈ 0.577; row 3's others are all
    # 1 → σ 0 → A = -1 undivided. The bonus is added after: A_i += bonus_i/σ_i (σ_i + 1e-6)
    baseline = GroupBaseline(scale_std=True, leave_one_out=True, eps=1e-6, std_of="baseline")
    ro = batch_of([[7]], BONUS_COMPS, [0, 0, 0, 0], [0.0, 0.0, 0.0, 1.0])
    est = estimate_rewards(ro, StubBackend(BONUS_TABLE), score, decode, [D], EOS,
                           DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=4, length_bonus=1.0), baseline,
                           correct_threshold=1.0, max_new_tokens=16, seed=0)
    s = 1 / math.sqrt(3) + 1e-6
    b0, b1 = est.bonus[0].item(), est.bonus[1].item()
    want = [(1 / 3 + b0) / s, (1 / 3 + b1) / s, (1 / 3) / s, -1.0]
    assert est.advantages.tolist() == pytest.approx(want, rel=1e-5)
    assert est.replaced.tolist() == [0, 0, 0, -1] and (est.advantages[:3] > 0).all()


def test_off_and_n1_are_vanilla_grpo_without_a_second_stage():
    ro = batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL)
    for settings in (DoubleRolloutSettings(enabled=False), DoubleRolloutSettings(num_continuations=1)):
        est = run(ro, StubBackend({}), settings)
        assert est.revised.tolist() == ORIGINAL and est.replaced.tolist() == [-1] * 5
        assert torch.equal(est.advantages, group_centered(torch.tensor(ORIGINAL), torch.tensor(GROUPS)))
        assert est.rollouts is ro


def test_grpo_with_the_arora_zanette_penalty_scales_correct_rewards_by_length():
    # stage off: group 0 has correct r1 (5 tokens) only -> z 0, factor 1 - a/2; group 1: correct r4 (3 tokens)
    # only -> same. Add a second correct row to group 0 to get a spread: lengths 5 and 7 -> z -1, +1.
    comps = COMPLETIONS + [[A, A, A, A, D, Y, EOS]]
    ro = batch_of(PROMPTS, comps, GROUPS + [0], ORIGINAL + [1.0])
    est = run(ro, StubBackend({}), DoubleRolloutSettings(enabled=False, length_penalty=0.4))
    sig = 1 / (1 + math.e)  # sigmoid(-1)
    expected = [0.0, 1 - 0.4 * sig, 0.0, 0.0, 0.8, 1 - 0.4 * (1 - sig)]
    assert est.rollouts.rewards.tolist() == pytest.approx(expected, rel=1e-5)
    assert est.original.tolist() == ORIGINAL + [1.0]  # the verifier rewards are kept for the metrics
    assert est.bonus.tolist() == pytest.approx([e - o for e, o in zip(expected, ORIGINAL + [1.0])], abs=1e-6)
    assert torch.allclose(est.advantages, group_centered(torch.tensor(expected), torch.tensor(GROUPS + [0])))
    # the shorter correct rollout now has the larger advantage
    assert est.advantages[1] > est.advantages[5] > 0


def test_length_penalty_and_bonus_are_exclusive():
    with pytest.raises(ValueError, match="length_bonus or length_penalty"):
        DoubleRolloutSettings(length_bonus=1.0, length_penalty=0.1)
    with pytest.raises(ValueError, match="length_penalty"):
        DoubleRolloutSettings(enabled=False, length_penalty=1.0)
    with pytest.raises(ValueError, match="GRPO comparator"):
        DoubleRolloutSettings(length_penalty=0.2)  # second stage on
    DoubleRolloutSettings(num_continuations=1, length_penalty=0.2)  # N 1 is GRPO


def test_budget_capped_at_the_generation_limit():
    backend = StubBackend(TABLE)
    ro = batch_of(PROMPTS, COMPLETIONS, GROUPS, ORIGINAL)
    run(ro, backend, DoubleRolloutSettings(rho=0.5, num_continuations=2, buffer=100), max_new_tokens=5)
    # min(ceil(.5T) + 100, 5 - cut): cuts 2, 1, 3, 2, 0
    assert backend.calls[0][2] == [3, 4, 2, 3, 5]


def test_settings_errors_name_the_flag():
    with pytest.raises(ValueError, match="model.double_rollout.rho"):
        DoubleRolloutSettings(rho=0.0)
    with pytest.raises(ValueError, match="model.double_rollout.replacement"):
        DoubleRolloutSettings(replacement="best")
    with pytest.raises(ValueError, match="model.loss.aggregation"):
        GRPOLossSettings(aggregation="sum")


# -- end to end through the real CLI --------------------------------------------------------------------
def digit_reward(prompts, completions, **kwargs):
    """A TRL-style reward that varies on a random tiny model's output: 0.1 per digit, at most 1."""
    from lit_rl.tasks.rewards import completion_text  # completions come in TRL's conversational form

    return [min(1.0, 0.1 * sum(ch.isdigit() for ch in completion_text(c))) for c in completions]


def _fit(tmp_path, configs, monkeypatch, *extra):
    """``configs``: one config file or a list (a base and its overlays)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # makes `test_double_rollout.digit_reward` importable
    args = [
        "fit",
        *(a for c in ([configs] if isinstance(configs, str) else configs) for a in ("--config", str(ROOT / c))),
        "--config", str(ROOT / "tests/tiny_dr_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "--data.init_args.task.init_args.reward_funcs=[test_double_rollout.digit_reward]",
        "--data.init_args.task.init_args.num_train=50",
        *extra,
    ]
    from lit_rl.cli import run_lightning_cli

    return run_lightning_cli(args)


def _metrics(tmp_path):
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("lit_rl-embedded")
    return client.search_runs([exp.experiment_id])[0].data.metrics


def test_tiny_double_rollout_fit_updates_weights_and_logs_metrics(tmp_path, monkeypatch):
    torch.manual_seed(0)
    cli = _fit(tmp_path, "conf/double_rollout.yaml", monkeypatch)
    module, trainer = cli.model, cli.trainer
    assert isinstance(module, DoubleRolloutGRPO) and module.dr.active
    assert trainer.global_step == 4  # 2 rollout batches x 2 updates
    fresh = type(module.policy)(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    changed = [n for (n, p), (_, q) in zip(module.policy.named_parameters(), fresh.named_parameters())
               if not torch.equal(p.detach(), q)]
    assert len(changed) > 5
    assert trainer.datamodule.cursor == 2 and (tmp_path / "prompt_order.jsonl").exists()
    keys = set(_metrics(tmp_path))
    expected = {
        "train/loss", "train/lr", "train/on_policy/reward_mean", "train/dr/reward_original", "train/dr/reward_revised",
        "train/dr/reward_final", "train/dr/replaced", "train/dr/cont_reward_std", "train/tokens_per_problem",
        "train/cost/tokens_stage1", "train/cost/tokens_stage2", "time/stage1_s", "time/stage2_s",
        "time/stage2_over_stage1", "train/grpo/clip_frac", "val/sudoku/greedy/accuracy", "train/entropy",
        "train/rollout_batch",
    }
    assert expected <= keys, expected - keys


def test_tiny_grpo_baseline_has_no_second_stage(tmp_path, monkeypatch):
    cli = _fit(
        tmp_path, ["conf/double_rollout.yaml", "conf/grpo.yaml"], monkeypatch,
        # a backend factory from the command line: the class with its other args, called with the policy
        "--data.init_args.backend.class_path=lit_rl.generation.ar.HFBackend",
        "--data.init_args.backend.init_args.share_prefix=false",
    )
    assert not cli.model.dr.active and cli.trainer.global_step == 4
    backend = cli.datamodule.engine()  # the run's engine, built for the module's policy
    assert (type(backend).__name__ == "HFBackend" and backend.share_prefix is False
            and backend.policy is cli.model.policy)
    keys = set(_metrics(tmp_path))
    assert "train/on_policy/reward_mean" in keys and "time/stage2_s" not in keys


# -- the module's KL reference ---------------------------------------------------------------------------
def _policy_rows(policy):
    ids, mask = policy.encode_prompts([[{"role": "user", "content": "[1, 2, 3] 6"}],
                                       [{"role": "user", "content": "[4, 5] 9"}]])
    comp, lengths = policy.encode_completions(["<reasoning>1+2=3</reasoning>", "ab"], 12)
    return RolloutBatch(
        input_ids=torch.cat([ids, comp], 1), attention_mask=torch.cat([mask, torch.ones_like(comp)], 1),
        prompt_len=ids.shape[1], completion_mask=torch.arange(12)[None] < lengths[:, None], lengths=lengths,
        rewards=torch.zeros(2), source=torch.zeros(2, dtype=torch.long), group=torch.arange(2), texts=["", ""],
        prompt_ids=["a", "b"], hit_limit=torch.zeros(2, dtype=torch.bool),
    )


@pytest.mark.parametrize("lora", [False, True], ids=["frozen-copy", "adapter-disabled"])
def test_kl_reference_is_the_starting_policy(lora):
    from lit_rl.models import LoraSettings
    from lit_rl.models.ar import TinyCausalLM

    kw = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    policy = TinyCausalLM(**kw, lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None)
    module = DoubleRolloutGRPO(policy, loss=GRPOLossSettings(kl_beta=0.1))
    assert module._reference_mode() == ("adapter" if lora else "copy")
    ro = _policy_rows(policy)
    old, ref, _ = module.loss_fn._fixed_logprobs(ro, module.loss_context(), with_old=True)  # (2, 12) each
    assert torch.allclose(old, ref)  # before training the reference is the policy
    with torch.no_grad():  # "train": move the trainable weights
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    old2, ref2, _ = module.loss_fn._fixed_logprobs(ro, module.loss_context(), with_old=True)
    assert not torch.allclose(old2, old, atol=1e-4)
    assert torch.allclose(ref2, ref, atol=1e-6)  # the reference did not move
    if not lora:
        assert all(not p.requires_grad for p in module.reference.parameters())


def test_the_loss_settings_build_the_estimates_baseline():
    from lit_rl.models.ar import TinyCausalLM

    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    loss = GRPOLossSettings(scale_std=True, leave_one_out=True, std_of="baseline", std_eps=1e-6)
    b = DoubleRolloutGRPO(policy, loss=loss).processors[0].baseline
    assert (b.scale_std, b.leave_one_out, b.std_of, b.eps) == (True, True, "baseline", 1e-6)
    b = DoubleRolloutGRPO(policy).processors[0].baseline  # the default: mean-centred only
    assert (b.scale_std, b.leave_one_out, b.std_of, b.eps) == (False, False, "group", 1e-4)


def test_fsdp2_sharding_is_refused_with_a_clear_error():
    """Under ``ModelParallelStrategy`` Lightning gives the module a device mesh before ``configure_model``;
    the double-rollout module is not FSDP2-ready (per-rank generation lengths would hang the sharded forward
    passes), so it must say so instead of starting. Without a mesh (DDP, one device) nothing happens."""
    from lit_rl.models.ar import TinyCausalLM

    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    module = DoubleRolloutGRPO(policy)
    module.configure_model()  # no mesh: a no-op
    assert all(type(p) is torch.nn.Parameter for p in policy.parameters())
    module._device_mesh = object()  # what ModelParallelStrategy sets (a DeviceMesh)
    with pytest.raises(ValueError, match=r"DoubleRolloutGRPO does not support FSDP2 .*trainer.strategy: ddp"):
        module.configure_model()
