"""Numerical faults in ERILS training: NaN/inf injected in rewards, advantages, loss and gradients.

A real Lightning ``Trainer`` fits the real :class:`ERILSModule` (tiny dLLM, μ = 1 so one training batch is one
optimizer update) on fixed rollout batches (no generation: seconds). For each injected fault the update is
skipped (weights, optimizer and LR-scheduler state bitwise unchanged), ``train/skipped_updates`` is logged,
the next clean update trains normally, and ``max_consecutive_skips`` skips in a row stop the run with
``NonFiniteUpdateError``. Groups whose rewards are all equal get exactly zero advantages, also with std
scaling and ``eps = 0`` (no 0/0).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, IterableDataset

from lit_rl.algorithms.advantages import SourceSpecific
from lit_rl.core.advantages import group_centered, source_specific_advantages
from lit_rl.algorithms.erils import ERILSModule, NonFiniteUpdateError
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.models import TinyDiffusionLM
from lit_rl.optim import ConstantWithWarmup
from lit_rl.batch import PromptBatch, RolloutBatch
from lit_rl.tasks.base import Example

P, LC, GROUPS, G_ON, G_EXT = 6, 8, 2, 3, 1


class MemoryLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def values(self, key: str) -> list[float]:
        return [m[key] for _, m in self.rows if key in m]


def _rollouts(policy: TinyDiffusionLM, step: int, rewards: list[float]) -> RolloutBatch:
    g = torch.Generator().manual_seed(1000 + step)
    N = GROUPS * (G_ON + G_EXT)
    vocab = policy.model.config.vocab_size if hasattr(policy, "model") else 100
    ids = torch.randint(10, vocab, (N, P + LC), generator=g)
    ids[ids == policy.mask_id] = 10
    comp = ids[:, P:]
    comp[:, -2:] = policy.eos_id
    lengths = policy.completion_lengths(comp)
    source = torch.tensor(([0] * G_ON + [1] * G_EXT) * GROUPS)
    group = torch.arange(GROUPS).repeat_interleave(G_ON + G_EXT)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        prompt_len=P,
        completion_mask=torch.arange(LC)[None] < lengths[:, None],
        lengths=lengths,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        source=source,
        group=group,
        texts=[""] * N,
        prompt_ids=[f"p{step}-{i // (G_ON + G_EXT)}" for i in range(N)],
        hit_limit=torch.zeros(N, dtype=torch.bool),
    )


def _clean_rewards(step: int) -> list[float]:
    # varied on-policy rewards so every clean update has a real gradient
    return [float((step + i) % 3 == 0) for i in range(GROUPS * (G_ON + G_EXT))]


class _Stream(IterableDataset):
    def __init__(self, dm: "FixedRollouts") -> None:
        self.dm = dm

    def __iter__(self):
        step = 0
        while True:
            yield PromptBatch(examples=[Example(id=f"p{step}-{k}", question="q", answer="a") for k in range(GROUPS)],
                              step=step)
            step += 1


class FixedRollouts(L.LightningDataModule):
    """Rollout batches built at batch start from fixed random tokens; ``rewards_at[step]`` overrides rewards."""

    def __init__(self, rewards_at: dict[int, list[float]] | None = None) -> None:
        super().__init__()
        self.rewards_at = rewards_at or {}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Stream(self), batch_size=None, num_workers=0)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        policy = self.trainer.lightning_module.policy
        batch.rollouts = _rollouts(policy, batch.step, self.rewards_at.get(batch.step, _clean_rewards(batch.step)))
        return batch


class Snapshots(L.Callback):
    """Weights, optimizer and scheduler state before and after every training batch (= one update, μ = 1)."""

    def __init__(self) -> None:
        self.before: dict[int, Any] = {}
        self.after: dict[int, Any] = {}

    @staticmethod
    def _state(trainer: L.Trainer, module: L.LightningModule) -> Any:
        return (
            {k: v.detach().clone() for k, v in module.policy.state_dict().items()},
            copy.deepcopy(trainer.optimizers[0].state_dict()),
            copy.deepcopy(trainer.lr_scheduler_configs[0].scheduler.state_dict()),
            trainer.global_step,
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before[batch_idx] = self._state(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[batch_idx] = self._state(trainer, pl_module)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


class FaultyAdvantages(SourceSpecific):
    def __init__(self, bad_calls: set[int], value: float) -> None:
        super().__init__()
        self.bad_calls, self.value, self.calls = bad_calls, value, 0

    def __call__(self, rewards, source, group):
        adv, keep = super().__call__(rewards, source, group)
        if self.calls in self.bad_calls:
            adv = adv.clone()
            adv[1] = self.value
        self.calls += 1
        return adv, keep


class FaultySurrogate(SPGSurrogate):
    def __init__(self, bad_calls: set[int], value: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.bad_calls, self.value, self.calls = bad_calls, value, 0

    def __call__(self, *args: Any, **kwargs: Any):
        loss, stats = super().__call__(*args, **kwargs)
        if self.calls in self.bad_calls:
            loss = loss * self.value
        self.calls += 1
        return loss, stats


def _fit(batches: int, module_kw: dict | None = None, dm: FixedRollouts | None = None,
         grad_fault: tuple[set[int], float] | None = None, max_skips: int = 10):
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    kw = dict(
        policy=policy,
        surrogate=SPGSurrogate(num_t=1, block_length=LC),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
        scheduler=lambda o: ConstantWithWarmup(o, warmup_steps=3),
        updates_per_batch=1,
        grad_clip=1.0,
        max_consecutive_skips=max_skips,
    )
    kw.update(module_kw or {})
    module = ERILSModule(**kw)
    if grad_fault is not None:
        bad, value = grad_fault
        counter = {"n": 0}
        param = next(p for p in policy.parameters() if p.requires_grad)

        def hook(grad: torch.Tensor) -> torch.Tensor:
            n = counter["n"]
            counter["n"] += 1
            return grad * value if n in bad else grad

        param.register_hook(hook)
    logger, snaps = MemoryLogger(), Snapshots()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=batches, limit_train_batches=batches, max_epochs=1, logger=logger,
        callbacks=[snaps], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, log_every_n_steps=1,
    )
    err = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(module, datamodule=dm or FixedRollouts())
        except NonFiniteUpdateError as e:
            err = e
    return module, trainer, logger, snaps, err


def _check_skips(snaps: Snapshots, logger: MemoryLogger, bad_batches: set[int], n: int, expect_total: int) -> None:
    for b in range(n):
        before, after = snaps.before[b], snaps.after[b]
        if b in bad_batches:
            assert _same(before[0], after[0]), f"batch {b}: weights changed on a skipped update"
            assert _same(before[1], after[1]), f"batch {b}: optimizer state changed on a skipped update"
            assert _same(before[2], after[2]), f"batch {b}: LR scheduler stepped on a skipped update"
            assert after[3] == before[3], f"batch {b}: global_step advanced on a skipped update"
        else:
            assert not _same(before[0], after[0]), f"batch {b}: a clean update did not train"
            assert after[3] == before[3] + 1
        assert all(torch.isfinite(v).all() for v in after[0].values() if v.is_floating_point())
    logged = logger.values("train/skipped_updates")
    assert logged and max(logged) == float(expect_total), logged


N = 4
FAULTS = {
    # name -> (kwargs for _fit, batches with a fault)
    "reward_inf": (lambda: {"dm": FixedRollouts({1: [math.inf] + _clean_rewards(1)[1:]})}, {1}),
    "reward_-inf_external": (
        lambda: {"dm": FixedRollouts({2: _clean_rewards(2)[:G_ON] + [-math.inf] + _clean_rewards(2)[G_ON + 1:]})}, {2}),
    "advantage_nan": (lambda: {"module_kw": {"advantages": FaultyAdvantages({1}, math.nan)}}, {1}),
    "advantage_inf": (lambda: {"module_kw": {"advantages": FaultyAdvantages({2}, math.inf)}}, {2}),
    "loss_nan": (lambda: {"module_kw": {"surrogate": FaultySurrogate({1}, math.nan, num_t=1, block_length=LC)}}, {1}),
    "loss_inf": (lambda: {"module_kw": {"surrogate": FaultySurrogate({2}, math.inf, num_t=1, block_length=LC)}}, {2}),
    "grad_nan": (lambda: {"grad_fault": ({1}, math.nan)}, {1}),
    "grad_inf": (lambda: {"grad_fault": ({2}, math.inf)}, {2}),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_non_finite_update_is_skipped_counted_and_leaves_weights_unchanged(name):
    make, bad = FAULTS[name]
    module, trainer, logger, snaps, err = _fit(N, **make())
    assert err is None
    assert module.skipped_updates == len(bad)
    assert module.consecutive_skips == 0  # reset by the next clean update
    assert trainer.global_step == N - len(bad)
    _check_skips(snaps, logger, bad, N, len(bad))


def test_nan_reward_drops_the_rollout_not_the_update():
    """A NaN reward (a verifier or reward function failed on one rollout) removes that rollout from the group
    statistics and the loss (advantage processor, nan_policy='drop'); the rest of the batch still trains."""
    rewards = _clean_rewards(1)
    rewards[0] = math.nan
    module, trainer, logger, snaps, err = _fit(3, dm=FixedRollouts({1: rewards}))
    assert err is None and module.skipped_updates == 0 and trainer.global_step == 3
    assert not _same(snaps.before[1][0], snaps.after[1][0])
    kept = logger.values("train/rollouts_kept")
    assert kept[1] == kept[0] - 1


def test_consecutive_skips_stop_the_run_with_a_clear_error():
    module, trainer, logger, snaps, err = _fit(
        8, module_kw={"surrogate": FaultySurrogate(set(range(2, 100)), math.nan, num_t=1, block_length=LC)}, max_skips=3
    )
    assert isinstance(err, NonFiniteUpdateError)
    assert "3 consecutive updates had a non-finite loss or gradient" in str(err)
    assert "model.max_consecutive_skips = 3" in str(err)
    assert str(err).endswith("; the last rollout batch's rewards ranged from 0 to 1"), str(err)  # 0/1 rewards
    assert module.skipped_updates == 3 and trainer.global_step == 2
    # the weights are those after the last clean update
    assert _same(snaps.after[1][0], {k: v for k, v in module.policy.state_dict().items()})


def test_all_equal_reward_groups_give_zero_advantages_without_division_by_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    source = torch.tensor([0, 0, 0, 1, 0, 0, 0, 1, 0, 0])
    for scale_std in (False, True):
        for eps in (0.0, 1e-4):
            adv = source_specific_advantages(rewards, source, group, scale_std=scale_std, eps=eps)
            assert torch.isfinite(adv).all(), (scale_std, eps, adv)
            assert adv[source == 0].eq(0).all(), adv  # every on-policy group is constant
            assert adv[3] == 0.5 and adv[7] == 1.0  # external A = r
            ga = group_centered(rewards, group, scale_std=scale_std, eps=eps)
            assert torch.isfinite(ga).all()
            assert ga[8:].eq(0).all()
            gc = group_centered(rewards, group, torch.ones_like(group, dtype=torch.bool), scale_std=scale_std, eps=eps)
            assert torch.isfinite(gc).all() and gc[8:].eq(0).all()
    # groups of one
    assert group_centered(torch.tensor([3.0]), torch.tensor([0]), scale_std=True, eps=0.0).item() == 0.0


def test_all_equal_rewards_train_without_a_skip():
    """Through the module: every group constant (on-policy 1.0, external 0) with std scaling and eps = 0."""
    const = {b: [1.0] * G_ON + [0.0] * G_EXT for b in range(3)}
    const = {b: v * GROUPS for b, v in const.items()}
    module, trainer, logger, snaps, err = _fit(3, module_kw={"advantages": SourceSpecific(scale_std=True, eps=0.0)},
                                               dm=FixedRollouts(const))
    assert err is None and module.skipped_updates == 0
    # every row's advantage is exactly 0: mean and std over each source's rows, every batch
    for key in ("on_policy/advantage_mean", "on_policy/advantage_std", "external/advantage_mean",
                "external/advantage_std"):
        values = logger.values(f"train/{key}")
        assert values and all(v == 0.0 for v in values), (key, values)
    assert all(math.isfinite(v) for v in logger.values("train/loss"))
