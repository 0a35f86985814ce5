"""lit_rl/optim.py: the LR schedules' factors against hand-computed values, through a real optimizer."""

import math

import pytest
import torch

from lit_rl.errors import FieldError
from lit_rl.optim import ConstantWithWarmup, WarmupCosine, erils_adamw


def _lrs(make, steps):
    """The LR each of ``steps`` optimizer steps uses (peak LR 1.0)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_constant_with_warmup_ramps_then_holds():
    assert _lrs(lambda o: ConstantWithWarmup(o, warmup_steps=4), 6) == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    assert _lrs(lambda o: ConstantWithWarmup(o), 2) == [1.0, 1.0]


def test_warmup_cosine_by_hand():
    # w 2, T 10, m 0.1: 1/2, 2/2, then 0.1 + 0.9 (1 + cos(pi (s - 2) / 8)) / 2, constant 0.1 from step 10
    lrs = _lrs(lambda o: WarmupCosine(o, total_steps=10, warmup_steps=2, min_ratio=0.1), 13)
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert lrs[6] == pytest.approx(0.55)  # halfway down the cosine
    assert lrs[4] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)  # 0.868...
    assert lrs[10:] == pytest.approx([0.1, 0.1, 0.1])
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))  # never rises after the warm-up


def test_warmup_cosine_without_warmup_starts_at_the_peak_and_resumes_from_its_state():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = WarmupCosine(opt, total_steps=4)
    assert opt.param_groups[0]["lr"] == 2.0
    for _ in range(2):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)  # cos(pi / 2): half the peak
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    resumed = WarmupCosine(opt2, total_steps=4)
    resumed.load_state_dict(sched.state_dict())
    opt2.step()
    resumed.step()
    opt.step()
    sched.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])


@pytest.mark.parametrize("kwargs, field", [
    ({"total_steps": 5, "warmup_steps": 5}, "total_steps"),
    ({"total_steps": 5, "warmup_steps": -1}, "warmup_steps"),
    ({"total_steps": 5, "min_ratio": 1.5}, "min_ratio"),
])
def test_warmup_cosine_refuses_bad_settings(kwargs, field):
    with pytest.raises(FieldError) as err:
        WarmupCosine(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), **kwargs)
    assert err.value.field == field


def test_erils_default_optimizer_is_table_viii():
    opt = erils_adamw([torch.nn.Parameter(torch.zeros(1))])
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (3e-6, (0.9, 0.99), 0.1)


def test_warmup_cosine_without_total_steps_holds_the_peak_until_told_where_it_ends():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosine(opt, warmup_steps=2)
    for _ in range(4):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == 1.0  # step 4, past the warm-up, no end known: the peak
    sched.set_total_steps(10)  # the current step's LR follows at once: 0.5 (1 + cos(pi 2 / 8))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(FieldError, match="trainer.max_steps is unlimited"):
        WarmupCosine(opt).set_total_steps(-1)
    short = _lrs(lambda o: _bound(WarmupCosine(o, warmup_steps=8), 4), 4)  # a 4-update run inside the warm-up
    assert short == pytest.approx([1 / 8, 2 / 8, 3 / 8, 4 / 8])
    assert _bound(WarmupCosine(opt, warmup_steps=8, min_ratio=0.1), 4).factor(9) == 0.1  # past both: the end


def _bound(sched, total):
    sched.set_total_steps(total)
    return sched


def test_a_fit_decays_the_cosine_over_its_own_max_steps(tmp_path):
    """conf/erils.yaml leaves total_steps unset: the module gives the schedule trainer.max_steps, so a run made
    shorter on the command line still ends its cosine at its last update."""
    from pathlib import Path

    from lit_rl.cli import run_lightning_cli

    root = Path(__file__).resolve().parents[1]
    cli = run_lightning_cli([
        "fit", "--config", str(root / "conf/erils.yaml"), "--config", str(root / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/m.db",
        "--model.init_args.scheduler.init_args.warmup_steps=1", "--trainer.max_steps=4"])
    sched = cli.trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(sched, WarmupCosine) and sched.total_steps == 4 and sched.last_epoch == 4
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # the cosine's end


def test_a_resume_keeps_the_runs_own_total_steps_and_sets_the_lr_of_its_step():
    """A checkpoint of a 300-update run resumed with trainer.max_steps 600: the cosine now ends at 600 (the
    checkpoint's 300 would leave the lr at 0 for the rest of the run), from the checkpoint's step."""
    old_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    old = WarmupCosine(old_opt)
    old.set_total_steps(300)
    for _ in range(300):
        old_opt.step()
        old.step()
    assert old_opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    new_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    new = WarmupCosine(new_opt)
    new.set_total_steps(600)  # what configure_optimizers does, before Lightning restores the scheduler
    new.load_state_dict(old.state_dict())
    assert new.last_epoch == 300 and new.total_steps == 600
    assert new_opt.param_groups[0]["lr"] == pytest.approx(0.5) == new.get_last_lr()[0]  # cos(pi/2): halfway
    same = WarmupCosine(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=300)
    same.load_state_dict(old.state_dict())  # an explicit total_steps is the checkpoint's, as any setting
    assert same.total_steps == 300
