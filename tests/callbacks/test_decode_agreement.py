"""DecodeAgreement (callbacks/decode_agreement.py): the training decode against the exact one on the policy being
trained, at the start and the end of a real fit, and the per-batch confidence / forward-pass curves."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch

from callbacks import DecodeAgreement
from lit_rl.cli import run_lightning_cli
from lit_rl.errors import FieldError
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM

ROOT = Path(__file__).resolve().parents[2]


def _dm(generation: DecodeSettings):
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    ids = torch.randint(5, 40, (6, 5), generator=torch.Generator().manual_seed(0))
    dm = SimpleNamespace(generation=generation, train_examples=list(range(6)),
                         encode_prompts=lambda policy, ex: (ids[: len(ex)], torch.ones(len(ex), 5, dtype=torch.long)))
    return policy, dm


def test_an_exact_training_decode_agrees_with_itself_and_a_threshold_takes_fewer_passes():
    exact = DecodeSettings(gen_length=16, block_length=8, steps=16, temperature=1.0)
    policy, dm = _dm(exact)
    m = DecodeAgreement(num_prompts=4).measure(policy, dm)
    assert m["decode_agreement/token"] == 1.0 and m["decode_agreement/completion"] == 1.0
    assert m["decode_agreement/train_passes"] == m["decode_agreement/exact_passes"] == 16
    policy, dm = _dm(DecodeSettings(gen_length=16, block_length=8, steps=16, temperature=1.0, threshold=0.01))
    m = DecodeAgreement(num_prompts=4).measure(policy, dm)
    # greedy (the default): the argmax confidence is >= 1/V > 0.01, so a block takes one pass
    assert m["decode_agreement/train_passes"] == 2 < m["decode_agreement/exact_passes"] == 16
    assert 0.0 <= m["decode_agreement/token"] <= 1.0
    with pytest.raises(FieldError, match="num_prompts"):
        DecodeAgreement(num_prompts=0)


def test_a_fit_logs_agreement_at_start_and_end_and_confidence_every_batch(tmp_path):
    torch.manual_seed(0)
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/db",
        "--data.init_args.generation.cache=dual", "--data.init_args.generation.threshold=0.5",
        "--trainer.callbacks+=callbacks.DecodeAgreement", "--trainer.callbacks.num_prompts=4",
    ])
    assert cli.trainer.global_step == 4
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/db")
    run = client.search_runs([client.get_experiment_by_name("lit_rl-embedded").experiment_id])[0]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "decode_agreement/token")]
    assert sorted(steps) == [0, 4]  # the starting policy and the final one
    conf = client.get_metric_history(run.info.run_id, "train/on_policy/confidence_mean")
    passes = client.get_metric_history(run.info.run_id, "train/on_policy/forward_passes")
    assert len(conf) == 2 and all(0 < m.value <= 1 for m in conf)  # one per rollout batch
    assert all(1 <= m.value <= 64 for m in passes)  # a threshold: at most one pass per token
