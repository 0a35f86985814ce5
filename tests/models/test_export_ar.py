"""``export`` of causal (double-rollout GRPO) policies: LoRA adapters in PEFT format and a merged model that
transformers' own ``AutoModelForCausalLM`` loads, with the trained policy's logits."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from lit_rl.models import LoraSettings
from lit_rl.models.ar import PretrainedCausalLM, TinyCausalLM
from lit_rl.models.export_cli import main as export_main

IDS = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])


def _saved_base(path):
    src = TinyCausalLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=128, seed=5)
    src.model.save_pretrained(path)
    src.tokenizer.save_pretrained(path)
    return path


def _run(tmp_path, policy_cfg: dict, policy: torch.nn.Module):
    """A run folder as ``fit`` leaves it: config.yaml and a checkpoint holding ``policy.*`` weights."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {
        "class_path": "lit_rl.algorithms.double_rollout.DoubleRolloutGRPO", "init_args": {"policy": policy_cfg}}}))
    torch.save({"state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()}},
               run / "checkpoints/last.ckpt")
    return run


def test_lora_causal_policy_exports_peft_adapters_and_a_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _saved_base(tmp_path / "base")
    lora = {"r": 4, "alpha": 8, "dropout": 0.0}
    policy_cfg = {"class_path": "lit_rl.models.ar.PretrainedCausalLM",
                  "init_args": {"path": str(base), "dtype": "float32", "lora": lora, "think_end": "</reasoning>"}}
    trained = PretrainedCausalLM(str(base), dtype="float32", lora=LoraSettings(**lora), think_end="</reasoning>").eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "training": every adapter matrix moves (B starts at zero)
        for n, p in trained.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    run = _run(tmp_path, policy_cfg, trained)
    out = tmp_path / "export"
    assert export_main(["--ckpt_path", str(run / "checkpoints/last.ckpt"), "--out", str(out), "--merge",
                        "--dtype", "float32"]) == 0
    manifest = json.loads((out / "export.json").read_text())
    # 2 layers x A,B x 7 targets
    assert manifest["policy"] == "lit_rl.models.ar.PretrainedCausalLM" and manifest["adapter_tensors"] == 2 * 2 * 7
    with torch.no_grad():
        want = trained.model(input_ids=IDS).logits
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(out / "adapter")).eval()
        torch.testing.assert_close(peft_model(input_ids=IDS).logits, want, atol=1e-5, rtol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
        assert not any("lora_" in n for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=IDS).logits, want, atol=1e-4, rtol=1e-4)
        plain = AutoModelForCausalLM.from_pretrained(base).eval()
        assert not torch.allclose(plain(input_ids=IDS).logits, want, atol=1e-3)  # the adapters mattered


def test_fully_trained_tiny_causal_policy_exports_a_merged_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "max_positions": 128}
    trained = TinyCausalLM(**args, seed=1).eval()
    with torch.no_grad():
        next(trained.parameters()).add_(0.5)  # differs from a fresh TinyCausalLM(seed=0), what the export builds
    run = _run(tmp_path, {"class_path": "lit_rl.models.ar.TinyCausalLM", "init_args": args}, trained)
    out = tmp_path / "export"
    # the old flag still works
    assert export_main(["--ckpt", str(run / "checkpoints/last.ckpt"), "--out", str(out), "--dtype", "float32"]) == 0
    assert not (out / "adapter").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    tok = AutoTokenizer.from_pretrained(out / "merged")
    assert tok.convert_tokens_to_ids("</reasoning>") == trained.think_end_ids()[0]
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=IDS).logits, trained.model(input_ids=IDS).logits)


def test_export_refuses_a_config_whose_policy_is_not_a_policy(tmp_path):
    run = _run(tmp_path, {"class_path": "torch.nn.Linear", "init_args": {"in_features": 2, "out_features": 2}},
               torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="not a DiffusionPolicy or CausalPolicy"):
        export_main(["--ckpt_path", str(run / "checkpoints/last.ckpt"), "--out", str(tmp_path / "x")])
