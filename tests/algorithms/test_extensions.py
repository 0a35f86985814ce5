"""The extension bar of the composable core, measured: a new processor is one class plus one YAML line for
either algorithm, a new loss one class plus one line, and GRPO with external pool rows (ERILS's idea on an
AR policy) is configuration only. Each runs a tiny fit through the real CLI."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from lit_rl.algorithms.loss_api import Loss, Prepared
from lit_rl.algorithms.processors import GroupBaseline, Processor
from lit_rl.core.sources import Source

ROOT = Path(__file__).resolve().parents[2]
POOL = str(ROOT / "data/pools/sudoku_grid.jsonl.gz")


class SignOnly(Processor):  # the whole extension: a processor that keeps only the sign of GRPO's advantages
    def process(self, rollouts, batch):
        return rollouts.with_advantages(torch.sign(GroupBaseline()(rollouts.rewards.float(), rollouts.group)))


class Reinforce(Loss):  # the whole extension: REINFORCE on the policy's sequence log-likelihood
    stats_prefix = "train/reinforce"

    def prepare(self, rollouts, ctx):
        return Prepared(rollouts.select(rollouts.keep))

    def micro_batch_loss(self, p, sl, ctx):  # the module splits the rows and calls manual_backward
        ro = p.rows.slice_rows(sl)
        logp = ctx.policy.token_logprobs(ro.input_ids, ro.attention_mask, ro.prompt_len)  # (b, L)
        loss = -(ro.advantages[:, None] * logp * ro.completion_mask).sum() / p.rows.completion_mask.sum()
        return loss, {"loss": loss.detach()}


def _fit(tmp_path, monkeypatch, overlay: dict, *extra: str):
    from lit_rl.cli import run_lightning_cli

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # makes `test_extensions.*` importable
    path = tmp_path / "ext.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/double_rollout.yaml"), "--config", str(ROOT / "conf/grpo.yaml"),
        "--config", str(ROOT / "tests/tiny_dr_overlay.yaml"),
        "--config", str(path), f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "--data.init_args.task.init_args.num_train=50", *extra,
    ])


def test_a_new_processor_and_a_new_loss_are_one_class_and_one_line_each(tmp_path, monkeypatch):
    cli = _fit(tmp_path, monkeypatch, {"model": {"init_args": {
        "processors": [{"class_path": "test_extensions.SignOnly"}],
        "loss_fn": {"class_path": "test_extensions.Reinforce"},
    }}})
    module, dm = cli.model, cli.datamodule
    assert [type(p).__name__ for p in module.processors] == ["SignOnly"]
    assert type(module.loss_fn).__name__ == "Reinforce"
    assert cli.trainer.global_step == 4 and "train/reinforce/loss" in cli.trainer.logged_metrics
    batch = dm.prompt_batch(0)
    adv = module.processors[0].process(dm.produce_rollouts(batch, module), batch).advantages
    assert set(adv.unique().tolist()) <= {-1.0, 0.0, 1.0}


def test_grpo_with_external_pool_rows_is_configuration_only(tmp_path, monkeypatch):
    # G_on = 3 sampled + G_ext = 2 pool rows per prompt, ERILS's source-specific advantages (on-policy rows
    # centred within their group, external rows A = r), the clipped policy gradient with pi_old of every
    # row computed by the trainer before the update (the off-policy ratio of an external row starts at 1)
    cli = _fit(tmp_path, monkeypatch, {
        "data": {"init_args": {"sources": [
            {"class_path": "datamodules.sources.AROnPolicy",
             "init_args": {"num": 3, "generation": {"max_new_tokens": 24, "temperature": 1.0}}},
            {"class_path": "datamodules.sources.ExternalPool",
             "init_args": {"num": 2, "pool_path": POOL, "min_width": 24}},
        ]}},
        "model": {"init_args": {"processors": [{"class_path": "lit_rl.algorithms.advantages.SourceSpecific"}]}},
    }, "--data.init_args.task.init_args.num_train=1000")  # the pool's prompts
    assert cli.trainer.global_step == 4
    ro = cli.datamodule.produce_rollouts(cli.datamodule.prompt_batch(0), cli.model)
    assert ro.source.tolist() == [Source.ON_POLICY] * 6 + [Source.EXTERNAL] * 4  # 2 prompts x (3 + 2)
    ext = ro.source == int(Source.EXTERNAL)
    assert ro.rewards[ext].min() > 0.5  # the pool's (mostly right) grid traces, re-scored by this run


def test_the_committed_grpo_external_config_fits(tmp_path, monkeypatch):
    # conf/grpo_external.yaml as shipped (12 sampled + 4 pool rows per prompt) on the tiny overlay's budget
    cli = _fit(tmp_path, monkeypatch, yaml.safe_load((ROOT / "conf/grpo_external.yaml").read_text()),
               "--data.init_args.task.init_args.num_train=1000")
    assert [type(p).__name__ for p in cli.model.processors] == ["SourceSpecific"]
    assert cli.trainer.global_step == 4
    ro = cli.datamodule.produce_rollouts(cli.datamodule.prompt_batch(0), cli.model)
    n = len(cli.datamodule.prompt_batch(0).examples)
    assert ro.source.tolist() == [Source.ON_POLICY] * (12 * n) + [Source.EXTERNAL] * (4 * n)
