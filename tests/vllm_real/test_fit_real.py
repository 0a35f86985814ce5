"""A double-rollout GRPO fit whose rollouts, continuations and evaluation come from the real vLLM engine
(conf/vllm/chainsum.yaml), through the real CLI."""

import copy
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from lit_rl.cli import run_lightning_cli
from lit_rl.generation.ar import HFBackend, VLLMBackend

ROOT = Path(__file__).resolve().parents[2]

TINY = {  # conf/double_rollout_chainsum.yaml in seconds: head_dim 32 (vLLM's CPU attention refuses 16)
    "threads": 1,
    "trainer": {
        "max_steps": 4, "val_check_interval": 2, "num_sanity_val_steps": 0, "enable_checkpointing": False,
        "callbacks": [
            {"class_path": "callbacks.RolloutTracker"},
            {"class_path": "callbacks.ar_warmup.ScriptedSFTWarmup",
             "init_args": {"steps": 300, "batch_size": 16, "max_completion_len": 48, "cache_dir": None}},
        ],
    },
    "model": {"init_args": {
        "policy": {"class_path": "lit_rl.models.ar.TinyCausalLM",
                   "init_args": {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 128,
                                 "max_positions": 128}},
        "double_rollout": {"num_continuations": 2, "buffer": 8},
        "optimizer": {"init_args": {"lr": 0.01}},  # large steps: each update changes the greedy decodes
    }},
    "data": {"init_args": {
        "prompts_per_batch": 2, "num_generations": 4, "eval_size": 8, "eval_batch_size": 8,
        "task": {"init_args": {"num_train": 50}},
        "backend": {"init_args": {"llm_kwargs": {"disable_log_stats": False}}},  # read the prefix-cache counters
    }},
}


def test_double_rollout_fit_with_vllm_rollouts_keeps_the_engine_in_sync(tmp_path):
    overlay = tmp_path / "tiny.yaml"
    overlay.write_text(yaml.safe_dump(TINY))
    cli = run_lightning_cli([
        "fit", "--config", str(ROOT / "conf/double_rollout.yaml"),
        "--config", str(ROOT / "conf/double_rollout_chainsum.yaml"),
        "--config", str(ROOT / "conf/vllm/chainsum.yaml"), "--config", str(overlay),
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    ])
    module, dm, trainer = cli.model, cli.datamodule, cli.trainer
    assert trainer.global_step == 4
    engine = dm.engine()
    assert isinstance(engine, VLLMBackend)
    metrics = trainer.callback_metrics
    assert float(metrics["train/cost/tokens_stage2"]) > 0, "continuations were sampled (from the engine)"
    # continuations share their prefix blocks with the first-stage rows: the cache was hit
    queried, hit = engine.prefix_cache_counts()
    assert 0 < hit < queried
    # the engine decodes as the trained policy: the last evaluation (at step 4) pushed step 4's weights ...
    assert dm._synced_step == 4
    policy = module.policy.eval()
    examples = list(dm.task.eval_examples())[:8]
    ids, mask = policy.encode_prompts([dm.task.messages(e) for e in examples], 32)
    ours = engine.generate(ids, mask, max_new_tokens=48, temperature=0.0)  # no push here
    assert torch.equal(ours, HFBackend(policy).generate(ids, mask, max_new_tokens=48, temperature=0.0))
    # ... and not as the checkpoint it started from (the warm start, exported before the first update)
    start = copy.deepcopy(policy)
    start.model.load_state_dict(load_file(str(Path(engine.model_path) / "model.safetensors")), strict=False)
    assert not torch.equal(ours, HFBackend(start).generate(ids, mask, max_new_tokens=48, temperature=0.0))
    engine.close()
