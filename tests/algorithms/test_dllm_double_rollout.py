"""conf/spg_double_rollout.yaml through the real CLI on the tiny dLLM: the double-rollout estimate runs as a
processor of the ERILS module with the dLLM's continuations."""

from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.algorithms.dr_estimate import DoubleRolloutEstimate
from lit_rl.cli import run_lightning_cli
from lit_rl.generation.continuations import DiffusionContinuations

ROOT = Path(__file__).resolve().parents[2]


def _fit(tmp_path, overlay: str, *extra: str):
    """The tiny dLLM through the real CLI: conf/erils.yaml + ``overlay`` + tests/tiny_overlay.yaml; returns the
    CLI and the run's logged metrics."""
    torch.manual_seed(0)
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / overlay),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"), f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db", *extra,
    ])
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    return cli, run.data.metrics


@pytest.mark.parametrize("masks", ["whole", "tail"])
def test_dllm_double_rollout_fits_through_the_cli(tmp_path, masks, monkeypatch):
    calls = []
    real = DiffusionContinuations.continue_from

    def spy(self, *a, **k):
        out = real(self, *a, **k)
        calls.append(out.shape)
        return out

    monkeypatch.setattr(DiffusionContinuations, "continue_from", spy)
    cli, metrics = _fit(tmp_path, "conf/spg_double_rollout.yaml",
                        f"--model.init_args.surrogate.init_args.continuation_masks={masks}")
    module = cli.model
    assert isinstance(module.processors[0], DoubleRolloutEstimate)
    assert module.surrogate.continuation_masks == masks
    assert cli.trainer.global_step == 4
    assert len(calls) == 2  # one second stage per rollout batch, N = 4 continuations of each of 2 x 4 rows
    assert all(shape[0] == 2 * 4 * 4 for shape in calls)
    assert {"train/dr/reward_original", "train/dr/reward_revised", "train/dr/replaced", "time/stage2_s",
            "time/stage2_over_stage1", "train/cost/tokens_stage2", "train/spg/loss"} <= set(metrics)
    assert metrics["train/dr/with_continuations_frac"] == 1.0  # missing: whole


def test_erils_double_rollout_continues_only_the_on_policy_rows(tmp_path, monkeypatch):
    from lit_rl.algorithms.advantages import SourceSpecific
    from lit_rl.batch import Source

    seen, out = [], []
    real_est, real_ss = DoubleRolloutEstimate._estimate, SourceSpecific.process

    def est_spy(self, ro, batch):
        seen.append(ro.source.clone())
        return real_est(self, ro, batch)

    def ss_spy(self, ro, batch):
        res = real_ss(self, ro, batch)
        out.append(res)
        return res

    monkeypatch.setattr(DoubleRolloutEstimate, "_estimate", est_spy)
    monkeypatch.setattr(SourceSpecific, "process", ss_spy)
    cli, metrics = _fit(tmp_path, "conf/erils_double_rollout.yaml")
    assert cli.model.processors[0].rows == "on_policy"
    assert cli.trainer.global_step == 4 and len(seen) == 2
    assert all((s == int(Source.ON_POLICY)).all() and len(s) == 2 * 2 for s in seen)  # 2 prompts x G_on 2
    for ro in out:  # the whole mixed group reaches Eq. 9: pool rows A = r, the policy's rows centred per group
        ext = ro.source == int(Source.EXTERNAL)
        assert int(ext.sum()) == 2 * 2 and torch.equal(ro.advantages[ext], ro.rewards[ext].to(ro.advantages.dtype))
        for g in ro.group.unique():
            own = (ro.group == g) & ~ext
            assert abs(float(ro.advantages[own].sum())) < 1e-5
    assert {"train/dr/reward_revised", "train/external/reward_mean", "train/spg/loss"} <= set(metrics)


def test_rows_must_be_all_or_on_policy():
    with pytest.raises(ValueError, match="rows: must be .all. or .on_policy."):
        DoubleRolloutEstimate(rows="external")
