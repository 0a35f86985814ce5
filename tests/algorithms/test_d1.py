"""d1 and wd1 as losses of the pipeline (lit_rl/algorithms/d1.py): the one-step estimator's inputs, π_old per
update draw, hand-computed losses, micro-batch equivalence, the KL reference, and a fit through the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.algorithms.advantages import OnPolicyOnly
from lit_rl.algorithms.d1 import D1Loss, WD1Loss
from lit_rl.algorithms.estimators import OneStep
from lit_rl.algorithms.erils import ERILSModule
from lit_rl.cli import run_lightning_cli
from lit_rl.core.spg import wd1_loss
from lit_rl.models import TinyDiffusionLM
from lit_rl.batch import RolloutBatch

ROOT = Path(__file__).resolve().parents[2]
B, P, L = 4, 3, 5


def _policy(seed: int = 0) -> TinyDiffusionLM:
    torch.manual_seed(seed)
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)


def _rows(adv=(1.0, -1.0, 0.5, -0.5)) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40, (B, P + L), generator=g)
    attn = torch.ones_like(ids)
    attn[0, 0] = 0  # a left-padded prompt: its pad is never masked
    lengths = torch.tensor([5, 2, 4, 1])
    ro = RolloutBatch(
        input_ids=ids, attention_mask=attn, prompt_len=P, completion_mask=torch.arange(L)[None] < lengths[:, None],
        lengths=lengths, rewards=torch.zeros(B), source=torch.zeros(B, dtype=torch.long),
        group=torch.tensor([0, 0, 1, 1]), texts=[""] * B, prompt_ids=["a", "a", "b", "b"],
        hit_limit=torch.zeros(B, dtype=torch.bool), eval_total=None,
    )
    return ro.with_advantages(torch.tensor(adv))


def _bare(ids: torch.Tensor, attn: torch.Tensor, prompt_len: int) -> RolloutBatch:
    n, width = ids.shape[0], ids.shape[1] - prompt_len
    return RolloutBatch(
        input_ids=ids, attention_mask=attn, prompt_len=prompt_len,
        completion_mask=torch.ones(n, width, dtype=torch.bool),
        lengths=torch.full((n,), width), rewards=torch.zeros(n), source=torch.zeros(n, dtype=torch.long),
        group=torch.zeros(n, dtype=torch.long), texts=[""] * n, prompt_ids=["p"] * n,
        hit_limit=torch.zeros(n, dtype=torch.bool),
    )


def one_step_prompt_masks(prompt_mask, seeds, p_mask_prompt):  # OneStep.draw on bare rows with this prompt mask
    n = prompt_mask.shape[0]
    ids = torch.zeros(n, prompt_mask.shape[1] + 1, dtype=torch.long)
    attn = torch.cat([prompt_mask.long(), torch.ones(n, 1, dtype=torch.long)], 1)
    return OneStep(p_mask_prompt).draw(_bare(ids, attn, prompt_mask.shape[1]), seeds)["prompt_masked"]


def one_step_logprobs(policy, ids, attn, prompt_len, prompt_masked):  # OneStep.score: (b, L) log-probs, entropy
    scores = OneStep().score(policy, _bare(ids, attn, prompt_len), {"prompt_masked": prompt_masked})
    return scores.per_token(), scores.per_token_entropy()


def _module(loss, mu: int = 1, micro: int | None = None, seed: int = 0) -> ERILSModule:
    module = ERILSModule(_policy(seed), processors=[OnPolicyOnly()], loss_fn=loss, updates_per_batch=mu,
                         micro_batch_size=micro)
    module.manual_backward = lambda loss: loss.backward()  # no trainer needed for the accumulation itself
    return module


def test_prompt_masks_follow_the_row_seed_and_skip_padding():
    pm = torch.ones(3, 400, dtype=torch.bool)
    pm[2, :200] = False
    m = one_step_prompt_masks(pm, [1, 2, 3], 0.15)
    assert m.shape == (3, 400) and not m[2, :200].any()
    assert abs(float(m[:2].float().mean()) - 0.15) < 0.03  # ~Bernoulli(0.15)
    assert torch.equal(one_step_prompt_masks(pm[:1], [1], 0.15), m[:1])  # a row's draw ignores its batch-mates
    assert not torch.equal(one_step_prompt_masks(pm[:1], [9], 0.15), m[:1])
    assert not one_step_prompt_masks(pm, [1, 2, 3], 0.0).any()


def test_one_step_input_masks_the_whole_completion_and_the_drawn_prompt_tokens():
    policy = _policy()
    ro = _rows()
    seen = []
    real = policy.forward
    policy.forward = lambda ids, attn=None: (seen.append(ids.clone()), real(ids, attn))[1]
    prompt_masked = torch.tensor([[False, True, False]] * B)
    logp, ent = one_step_logprobs(policy, ro.input_ids, ro.attention_mask, P, prompt_masked)
    noisy = seen[0]
    assert (noisy[:, P:] == policy.mask_id).all()
    assert (noisy[:, 1] == policy.mask_id).all() and torch.equal(noisy[:, [0, 2]], ro.input_ids[:, [0, 2]])
    # the scores are the original tokens' log-probs under that input
    logits = real(noisy, ro.attention_mask)[:, P:]
    want = torch.log_softmax(logits.float(), -1).gather(-1, ro.input_ids[:, P:, None])[..., 0]
    torch.testing.assert_close(logp, want)
    assert ent.shape == (B, L) and (ent >= 0).all()


def test_d1_with_one_update_is_the_token_mean_policy_gradient():
    # μ = 1: π_old = π_θ detached (d1), ratio 1, β = 0: loss = −Σ_i A_i·L_i / Σ_i L_i, hand-computed
    module = _module(D1Loss(beta=0.0))
    p = module.loss_fn.prepare(_rows(), module.loss_context())
    assert p.old_logp is None and p.ref_logp is None
    loss, stats = module.loss_backward(p, 0)
    want = -(1.0 * 5 - 1.0 * 2 + 0.5 * 4 - 0.5 * 1) / (5 + 2 + 4 + 1)
    assert float(loss) == pytest.approx(want, abs=1e-6)
    assert float(stats["ratio_mean"]) == pytest.approx(1.0)
    assert 0.0 < float(stats["entropy"]) <= math.log(len(module.policy.tokenizer)) + 1e-4


def test_d1_takes_pi_old_of_each_updates_draw_before_the_first_update():
    module = _module(D1Loss(beta=0.0), mu=2)
    ro = _rows()
    p = module.loss_fn.prepare(ro, module.loss_context())
    assert p.old_logp.shape == (2, B, L) and len(p.draws) == 2 and p.draws[0]["prompt_masked"].shape == (B, P)
    assert not torch.equal(p.draws[0]["prompt_masked"], p.draws[1]["prompt_masked"])  # a fresh draw per update
    for k in range(2):  # π_old of draw k is the one-step score under draw k of the starting policy
        with torch.no_grad():
            want, _ = one_step_logprobs(module.policy.eval(), ro.input_ids, ro.attention_mask, P,
                                        p.draws[k]["prompt_masked"])
        torch.testing.assert_close(p.old_logp[k], want)
    module.policy.train()
    _, stats = module.loss_backward(p, 0)  # update 0: the policy has not moved, ratio exactly 1
    assert float(stats["ratio_mean"]) == pytest.approx(1.0, abs=1e-6)
    with torch.no_grad():  # "an optimizer step"
        for q in module.policy.parameters():
            q.add_(0.05 * torch.randn_like(q))
    _, stats = module.loss_backward(p, 1)  # update 1: draw 1 against its own π_old
    assert abs(float(stats["ratio_mean"]) - 1.0) > 1e-4


def test_d1_kl_reference_is_the_starting_policy():
    module = _module(D1Loss(beta=0.04), mu=2)
    module.on_train_start()  # the frozen copy, taken when training starts
    assert module.reference is not None and not any(q.requires_grad for q in module.reference.parameters())
    p = module.loss_fn.prepare(_rows(), module.loss_context())
    torch.testing.assert_close(p.ref_logp, p.old_logp)  # before training, π_ref = π_old on every draw
    with torch.no_grad():
        for q in module.policy.parameters():
            q.add_(0.05 * torch.randn_like(q))
    p2 = module.loss_fn.prepare(_rows(), module.loss_context())
    torch.testing.assert_close(p2.ref_logp, p.ref_logp)  # the reference did not move
    _, stats = module.loss_backward(p2, 0)
    assert float(stats["kl"]) > 0


@pytest.mark.parametrize("reduction,groups", [("sum", 1), ("mean", 2)])
def test_wd1_loss_matches_the_pure_function_by_group(reduction, groups):
    module = _module(WD1Loss(group_reduction=reduction))
    ro = _rows()
    p = module.loss_fn.prepare(ro, module.loss_context())
    # group [1, -1]: softmax(A) = (e/(e+1/e), ...) so w− − w+ = (−0.7616, 0.7616); group [0.5, −0.5]: ∓0.4621;
    # "mean" divides by the batch's 2 groups
    torch.testing.assert_close(p.weights, torch.tensor([-math.tanh(1.0), math.tanh(1.0), -math.tanh(0.5),
                                                        math.tanh(0.5)]) / groups)
    loss, _ = module.loss_backward(p, 0)
    with torch.no_grad():
        logp, _ = one_step_logprobs(module.policy, ro.input_ids, ro.attention_mask, P, p.draws[0]["prompt_masked"])
    seq = torch.where(ro.completion_mask, logp, 0.0).sum(-1)
    want, _ = wd1_loss(seq, ro.advantages, ro.group)
    assert float(loss) == pytest.approx(float(want) / groups, rel=1e-5)


@pytest.mark.parametrize("make", [lambda: D1Loss(beta=0.04), WD1Loss], ids=["d1", "wd1"])
@pytest.mark.parametrize("micro", [1, 3])
def test_micro_batches_match_the_full_batch(make, micro):
    def grads(mb):
        module = _module(make(), mu=2, micro=mb)
        module.on_train_start()
        p = module.loss_fn.prepare(_rows(), module.loss_context())
        loss, _ = module.loss_backward(p, 0)
        return float(loss), {n: q.grad.clone() for n, q in module.policy.named_parameters() if q.grad is not None}

    full_loss, full = grads(None)
    loss, part = grads(micro)
    assert loss == pytest.approx(full_loss, rel=1e-5, abs=1e-7)
    assert full and part.keys() == full.keys()
    for n in full:
        torch.testing.assert_close(part[n], full[n], rtol=1e-4, atol=1e-6, msg=n)


def _hinted_rows() -> RolloutBatch:
    ro = _rows()
    ro.hint_mask = torch.zeros(B, L, dtype=torch.bool)
    ro.hint_mask[0, :4] = True  # row 0 (length 5): 4 hint positions
    ro.hint_mask[2, 1:3] = True  # row 2 (length 4): 2 hint positions
    ro.hint_mask[3, 2:] = True  # row 3 (length 1): hints only after its EOS, never scored
    return ro


def test_d1_hint_filter_is_hand_computed_with_one_update():
    # μ = 1, β = 0: loss = −Σ_i A_i·n_i / Σ_i n_i over each row's scored positions n_i. keep ratio 0.5: row 0 keeps
    # 2 of its 4 hints (5 − 4 + 2 = 3 positions), row 2 1 of 2 (4 − 2 + 1 = 3); rows 1 and 3 keep 2 and 1
    module = _module(D1Loss(beta=0.0, hint_keep_ratio=0.5))
    p = module.loss_fn.prepare(_hinted_rows(), module.loss_context())
    assert p.old_logp is None and p.loss_masks.shape == (1, B, L)
    assert p.loss_masks[0].sum(-1).tolist() == [3, 2, 3, 1]
    assert p.metrics["train/d1/hint_tokens"] == 6 and p.metrics["train/d1/hint_tokens_kept"] == 3
    loss, _ = module.loss_backward(p, 0)
    assert float(loss) == pytest.approx(-(1.0 * 3 - 1.0 * 2 + 0.5 * 3 - 0.5 * 1) / 9, abs=1e-6)
    plain = _module(D1Loss(beta=0.0))  # without the filter hints are scored like any position
    p = plain.loss_fn.prepare(_hinted_rows(), plain.loss_context())
    assert p.loss_masks is None
    assert float(plain.loss_backward(p, 0)[0]) == pytest.approx(-(5 - 2 + 0.5 * 4 - 0.5 * 1) / 12, abs=1e-6)


def test_d1_hint_filter_keeps_pi_olds_highest_entropy_hints_under_each_updates_draw():
    from lit_rl.core.inpainting import keep_high_entropy_hints

    module = _module(D1Loss(beta=0.0, hint_keep_ratio=0.5), mu=2)
    ro = _hinted_rows()
    p = module.loss_fn.prepare(ro, module.loss_context())
    completion = ro.completion_mask.bool()
    for k in range(2):  # the entropy of the starting policy's one-step forward under draw k
        with torch.no_grad():
            _, ent = one_step_logprobs(module.policy.eval(), ro.input_ids, ro.attention_mask, P,
                                       p.draws[k]["prompt_masked"])
        want = keep_high_entropy_hints(completion, ro.hint_mask & completion, ent, 0.5)
        assert torch.equal(p.loss_masks[k], want)
        top = ent[0, :4].argsort(descending=True)[:2].sort().values.tolist()
        assert torch.nonzero(p.loss_masks[k][0, :4]).flatten().tolist() == top  # row 0's two kept hints
        assert torch.equal(p.loss_masks[k][:, 4:] | ro.hint_mask[:, 4:], completion[:, 4:] | ro.hint_mask[:, 4:])
        assert torch.equal(p.loss_masks[k][1], completion[1])  # no hints: unchanged


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="hint_keep_ratio"):
        D1Loss(hint_keep_ratio=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        D1Loss(epsilon=1.5)
    with pytest.raises(ValueError, match="beta"):
        D1Loss(beta=-1)
    with pytest.raises(ValueError, match="p_mask_prompt"):
        WD1Loss(p_mask_prompt=1.0)
    with pytest.raises(ValueError, match="group_reduction"):
        WD1Loss(group_reduction="max")


@pytest.mark.parametrize("name,prefix", [("d1", "train/d1"), ("wd1", "train/wd1"), ("erils_d1", "train/d1")])
def test_the_configs_fit_through_the_cli(tmp_path, name, prefix):
    torch.manual_seed(0)
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / f"conf/{name}.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"), f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    ])
    module = cli.model
    assert isinstance(module.loss_fn, WD1Loss if name == "wd1" else D1Loss)
    assert cli.trainer.global_step == 4
    assert (module.reference is not None) == (name != "wd1")  # d1's KL reference, taken at train start
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    keys = set(run.data.metrics)
    assert {f"{prefix}/entropy", "train/loss", "val/sudoku/greedy/accuracy"} <= keys
    # d1 / wd1: all on-policy; erils_d1: ERILS's mixed groups (pool rows) under d1's loss
    assert ("train/external/reward_mean" in keys) == (name == "erils_d1")
    if name != "wd1":
        assert {"train/d1/kl", "train/d1/clip_frac", "train/d1/ratio_mean"} <= keys


def test_d1_hint_filter_runs_its_entropy_pass_on_batches_without_hints_too():
    # the pass count must not depend on a rank's rows (FSDP forwards are collectives): with the filter set, a
    # batch without hints still runs the no-gradient pass, and its loss masks are the completion masks
    module = _module(D1Loss(beta=0.0, hint_keep_ratio=0.5))
    calls = []
    real = module.loss_fn.fixed_logprobs
    module.loss_fn.fixed_logprobs = lambda *a, **kw: (calls.append(kw.get("with_entropy")), real(*a, **kw))[1]
    p = module.loss_fn.prepare(_rows(), module.loss_context())
    assert calls == [True] and p.old_logp is None
    assert torch.equal(p.loss_masks[0], _rows().completion_mask)
