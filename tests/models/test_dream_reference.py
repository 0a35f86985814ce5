"""lit_rl against the OFFICIAL Dream-v0-Instruct remote code (tiny random checkpoint built from it).

On transformers 5 the official Dream code fails to load in three ways and, once loaded, computes with
uninitialised rotary frequencies; the shim covers all four (:mod:`lit_rl.models.remote_compat`). Its forward
takes the attention mask as an SDPA mask (a 2-D padding mask crashes it), which the policy supplies
(``mask_format``). The native Dream (:mod:`lit_rl.models.dream`) computes the same logits and, under left
padding, each row's logits equal the prompt alone.
"""

from __future__ import annotations

import pytest
import torch

from lit_rl.models import LoraSettings, NativeDream, PretrainedDiffusionLM
from lit_rl.models.dream import NativeDreamModel, qwen2_config_from_dream
from lit_rl.models.remote_compat import load_remote_model, reinit_rotary_buffers
from support.reference import DREAM_ROPE_THETA, left_padded, tiny_official_dream


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    return tiny_official_dream(tmp_path_factory.mktemp("official_dream"))


def native_model(path) -> NativeDreamModel:
    return NativeDreamModel.from_pretrained(path, config=qwen2_config_from_dream(path), dtype=torch.float32).eval()


def test_official_dream_loads_through_the_shim_with_real_rotary_frequencies(official):
    model = load_remote_model(str(official), dtype=torch.float32).eval()
    assert type(model).__name__ == "DreamModel" and type(model).__module__.startswith("transformers_modules")
    rotary = [m for m in model.modules() if "rotary" in type(m).__name__.lower()]
    assert rotary
    head_dim = 64 // 4
    want = 1.0 / (DREAM_ROPE_THETA ** (torch.arange(0, head_dim, 2).float() / head_dim))
    for m in rotary:
        torch.testing.assert_close(m.inv_freq, want)
    _, ids, _ = left_padded()
    assert torch.isfinite(model(input_ids=ids).logits).all()
    from transformers import modeling_rope_utils

    # the 4.x default RoPE is registered only while loading: transformers 5 merges the registry over every
    # model's own default RoPE (a global entry would break e.g. Phi's partial rotary)
    assert (modeling_rope_utils.ROPE_INIT_FUNCTIONS.get("default") is None
            or int(__import__("transformers").__version__[0]) < 5)


def test_reinit_rotary_buffers_repairs_garbage_frequencies(official):
    model = load_remote_model(str(official), dtype=torch.float32).eval()
    _, ids, _ = left_padded(lens=(8, 8))
    with torch.no_grad():
        good = model(input_ids=ids).logits
        for m in model.modules():
            if "rotary" in type(m).__name__.lower():
                m.inv_freq.fill_(float("nan"))  # what meta-device loading can leave behind
        bad = model(input_ids=ids).logits
        # NaN frequencies make the logits wrong: NaN on some torch / transformers builds, finite but different
        # on others (measured 3.95 off with torch 2.13 + transformers 5.23/5.24, whose attention drops the NaN)
        assert (bad - good).abs().nan_to_num(nan=1.0).max() > 1e-3
        assert reinit_rotary_buffers(model)
        torch.testing.assert_close(model(input_ids=ids).logits, good, rtol=0, atol=0)


def test_remote_policy_rows_under_left_padding_equal_each_prompt_alone(official):
    policy = PretrainedDiffusionLM(str(official), mask_id=None, eos_id=None, dtype="float32", logits_shift=True).eval()
    assert policy.mask_format == "additive_4d" and policy.accepts_position_ids and policy.mask_id == 3
    rows, ids, mask = left_padded()
    T = ids.shape[1]
    with torch.no_grad():
        batch = policy(ids, mask)
        for i, r in enumerate(rows):
            alone = policy(r[None], torch.ones(1, len(r), dtype=torch.long))[0]
            # the first real position's shifted logits come from its left neighbour (padding vs none): skip it
            torch.testing.assert_close(batch[i, T - len(r) + 1:], alone[1:], rtol=0, atol=1e-5)


def test_native_dream_logits_equal_the_official_code(official):
    ref = load_remote_model(str(official), dtype=torch.float32).eval()
    nat = native_model(official)
    assert set(nat.state_dict()) == set(ref.state_dict())  # Dream's names are Qwen2's
    _, ids, _ = left_padded(lens=(11, 11, 11))
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits, nat(input_ids=ids).logits
    assert want.abs().max() > 1.0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_native_dream_rows_under_left_padding_equal_each_prompt_alone(official):
    ref = load_remote_model(str(official), dtype=torch.float32).eval()
    nat = native_model(official)
    rows, ids, mask = left_padded()
    T = ids.shape[1]
    with torch.no_grad():
        batch = nat(input_ids=ids, attention_mask=mask).logits
        for i, r in enumerate(rows):
            torch.testing.assert_close(batch[i, T - len(r):], ref(input_ids=r[None]).logits[0], rtol=0, atol=1e-5)


def test_native_dream_reads_the_dream_config_and_refuses_other_folders(official, tmp_path):
    import json

    from lit_rl.errors import ConfigError

    cfg = qwen2_config_from_dream(official)
    assert (cfg.rope_parameters["rope_theta"] == DREAM_ROPE_THETA and cfg.rms_norm_eps == 1e-5
            and cfg.num_key_value_heads == 2)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llada"}))
    with pytest.raises(ConfigError, match=r"model_type='llada' is not Dream"):
        qwen2_config_from_dream(tmp_path)


def test_native_dream_is_bidirectional(official):
    nat = native_model(official)
    _, ids, _ = left_padded(lens=(9,))
    later = ids.clone()
    later[0, -1] = (later[0, -1] + 1) % 128
    with torch.no_grad():
        a, b = nat(input_ids=ids).logits, nat(input_ids=later).logits
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-3  # the first position sees the last token


def test_native_dream_policy_shifts_and_adapts_qwen2_names(official):
    policy = NativeDream(str(official), dtype="float32", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    assert policy.logits_shift and policy.mask_id == 3
    adapted = {n.split(".")[-1] for n, m in policy.model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    _, ids, mask = left_padded(lens=(9, 9))
    policy.eval()
    with torch.no_grad():
        raw = policy.model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(policy(ids, mask)[:, 1:], raw[:, :-1], rtol=0, atol=0)
