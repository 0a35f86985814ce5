"""The weight-sync helpers of lit_rl.generation.vllm_engine that need no engine: names, merging, export and the
name/shape check. The engine itself is exercised for real in tests/vllm_real (run in .venv-vllm)."""

import pytest
import torch

from lit_rl.generation.vllm_engine import (
    WeightSyncError,
    check_weights,
    checkpoint_shapes,
    engine_shapes,
    export_policy,
    policy_weights,
)
from lit_rl.models import LoraSettings
from lit_rl.models.ar import TinyCausalLM


def tiny(**kw) -> TinyCausalLM:
    return TinyCausalLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=64, **kw).eval()


def test_a_policy_and_its_bare_hf_model_push_the_same_hf_names():
    p = tiny()
    from_policy, from_model = policy_weights(p), policy_weights(p.model)
    assert from_policy.keys() == from_model.keys() == p.model.state_dict().keys()
    # the bare *ForCausalLM keeps its "model." prefix (taking its .model would drop it and lm_head)
    assert "model.embed_tokens.weight" in from_model and "lm_head.weight" in from_model


def test_lora_is_merged_into_the_pushed_weights_and_the_policy_left_unmerged():
    p = tiny(lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for n, q in p.model.named_parameters():
            if "lora_B" in n:
                q.normal_()
    ids = torch.tensor([[10, 11, 12]])
    before = p(ids, torch.ones_like(ids)).detach()
    state = policy_weights(p)
    assert not any("lora_" in k or "base_layer" in k or k.startswith("base_model") for k in state)
    layer = p.model.base_model.model.model.layers[0].self_attn.q_proj
    # alpha / r = 2: the pushed q_proj is W + 2 B A
    expected = layer.base_layer.weight + 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    torch.testing.assert_close(state["model.layers.0.self_attn.q_proj.weight"], expected)
    torch.testing.assert_close(p(ids, torch.ones_like(ids)), before)  # unmerged again


def test_export_writes_a_checkpoint_whose_names_the_policy_pushes(tmp_path):
    p = tiny()
    out = export_policy(p, tmp_path / "ckpt")
    assert (out / "config.json").exists()
    shapes, tied = engine_shapes(out)
    assert tied and "lm_head.weight" not in shapes  # tied to the embeddings: stored once
    assert shapes["model.embed_tokens.weight"] == tuple(p.model.model.embed_tokens.weight.shape)
    check_weights(policy_weights(p), shapes, where=str(out), tied=tied)  # the policy's own names pass
    assert checkpoint_shapes(tmp_path / "nothing-here") is None  # a hub name: no local check


def test_a_mismatch_names_the_first_key_and_both_sides():
    expected = {"model.layers.0.w": (2, 2), "model.norm.weight": (2,)}
    # a prefix dropped: the first pushed name is not in the checkpoint
    with pytest.raises(WeightSyncError, match=r"'layers.0.w' is pushed but not in the engine's checkpoint /ck "
                                              r".*Pushed names: 'layers.0.w', 'norm.weight'; "
                                              r"checkpoint names: 'model.layers.0.w', 'model.norm.weight'"):
        check_weights({"layers.0.w": torch.zeros(2, 2), "norm.weight": torch.zeros(2)}, expected, where="/ck")
    with pytest.raises(WeightSyncError, match=r"'model.norm.weight' is in the engine's checkpoint /ck but not pushed"):
        check_weights({"model.layers.0.w": torch.zeros(2, 2)}, expected, where="/ck")
    with pytest.raises(WeightSyncError, match=r"'model.layers.0.w' has shape \(3, 2\) .* and \(2, 2\)"):
        check_weights({"model.layers.0.w": torch.zeros(3, 2), "model.norm.weight": torch.zeros(2)}, expected, "/ck")
    # lm_head beside a tied checkpoint is fine, elsewhere it is not
    ok = {"model.layers.0.w": torch.zeros(2, 2), "model.norm.weight": torch.zeros(2), "lm_head.weight": torch.zeros(1)}
    check_weights(ok, expected, "/ck", tied=True)
    with pytest.raises(WeightSyncError, match="'lm_head.weight' is pushed"):
        check_weights(ok, expected, "/ck", tied=False)


def test_a_moe_model_pushes_the_checkpoints_per_expert_names(tmp_path):
    """transformers 5 fuses Qwen3-MoE's experts into 3-D tensors in memory; save_pretrained (and an engine) use the
    per-expert names. The pushed weights are in the checkpoint's form."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, num_experts=4,
                         num_experts_per_tok=2, head_dim=16)
    model = Qwen3MoeForCausalLM(cfg)
    assert "model.layers.0.mlp.experts.gate_up_proj" in model.state_dict()  # fused in memory
    model.save_pretrained(tmp_path)
    shapes, tied = engine_shapes(tmp_path)
    pushed = policy_weights(model)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in pushed
    assert {k: tuple(v.shape) for k, v in pushed.items()} == shapes
    check_weights(pushed, shapes, where=str(tmp_path), tied=tied)
