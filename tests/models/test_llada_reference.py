"""lit_rl against the OFFICIAL LLaDA-8B-Instruct remote code (tiny random checkpoint built from it).

Claims (2) and (3); claim (1), that the official files load on the installed transformers through the shim
(:mod:`lit_rl.models.remote_compat`) and that a model that still fails names the fix, is test_remote_compat.py.
(2) The native LLaDA (:mod:`lit_rl.models.llada`) computes the official network: the same logits without padding,
and under left padding each row's logits equal the prompt alone (the official code's do not: it ignores the mask);
(3) the native path trains as the paper runs it (4-bit NF4 + LoRA on the official module names, activation
checkpointing) and its adapters load onto the official code with peft.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lit_rl.models import LoraSettings, NativeLLaDA, QuantizationSettings
from lit_rl.models.llada import NativeLLaDAConfig, NativeLLaDAModel
from lit_rl.models.remote_compat import load_remote_model
from support.reference import LLADA_DIR, left_padded, tiny_official_llada

OFFICIAL_TARGETS = {"q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"}


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """Folder of a tiny random checkpoint written by the official remote code."""
    return tiny_official_llada(tmp_path_factory.mktemp("official_llada"))


def native_model(path, **kw) -> NativeLLaDAModel:
    return NativeLLaDAModel.from_pretrained(path, config=NativeLLaDAConfig.from_llada_json(path),
                                            dtype=torch.float32, **kw).eval()


# -- (2) parity --------------------------------------------------------------------------------------------
def test_native_logits_equal_the_official_code_without_padding(official):
    ref = load_remote_model(str(official), dtype=torch.float32).eval()
    nat = native_model(official)
    _, ids, _ = left_padded(lens=(11, 11, 11))
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits, nat(input_ids=ids).logits
    assert want.abs().max() > 1.0  # a random model whose logits move with the input
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_native_rows_under_left_padding_equal_each_prompt_alone_and_official_do_not(official):
    ref = load_remote_model(str(official), dtype=torch.float32).eval()
    nat = native_model(official)
    rows, ids, mask = left_padded()
    T = ids.shape[1]
    with torch.no_grad():
        batch_nat = nat(input_ids=ids, attention_mask=mask).logits
        batch_ref = ref(input_ids=ids, attention_mask=mask).logits
        worst_ref = 0.0
        for i, r in enumerate(rows):
            alone = ref(input_ids=r[None]).logits[0]  # the official code on an unpadded prompt: the truth
            torch.testing.assert_close(batch_nat[i, T - len(r):], alone, rtol=0, atol=1e-5)
            worst_ref = max(worst_ref, (batch_ref[i, T - len(r):] - alone).abs().max().item())
    assert worst_ref > 0.05, "the official code ignores the padding mask (upstream LLaDA #89/#90)"


def test_native_bfloat16_logits_equal_the_official_code_without_padding(official):
    ref = load_remote_model(str(official), dtype=torch.bfloat16).eval()
    nat = NativeLLaDAModel.from_pretrained(official, config=NativeLLaDAConfig.from_llada_json(official),
                                           dtype=torch.bfloat16).eval()
    assert nat.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE frequencies are not rounded to bf16
    _, ids, _ = left_padded(lens=(11, 11, 11))
    with torch.no_grad():
        want, got = ref(input_ids=ids).logits.float(), nat(input_ids=ids).logits.float()
    assert (got - want).abs().max() <= 1e-2  # measured: 0.0 (same bf16 ops in the same order)


def test_native_eager_and_sdpa_kernels_agree_under_padding(official):
    _, ids, mask = left_padded()
    with torch.no_grad():
        sdpa = native_model(official, attn_implementation="sdpa")(input_ids=ids, attention_mask=mask).logits
        eager = native_model(official, attn_implementation="eager")(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(eager, sdpa, rtol=0, atol=1e-5)


def test_native_loads_a_sharded_checkpoint_by_its_index(official, tmp_path):
    ref = load_remote_model(str(official), dtype=torch.float32).eval()
    sharded = tmp_path / "sharded"
    ref.save_pretrained(sharded, max_shard_size="100KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert set(index["weight_map"]) == set(native_model(official).state_dict())  # the official names
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(official / f, sharded / f)
    _, ids, _ = left_padded(lens=(9, 9))
    with torch.no_grad():
        torch.testing.assert_close(native_model(sharded)(input_ids=ids).logits, ref(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)


def test_unsupported_official_option_is_named(official, tmp_path):
    from lit_rl.errors import ConfigError

    cfg = json.loads((official / "config.json").read_text()) | {"alibi": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config.json: alibi=True is not supported.*PretrainedDiffusionLM"):
        NativeLLaDAConfig.from_llada_json(tmp_path)
    cfg.pop("alibi")
    cfg.pop("block_type")  # absent: the official default ("sequential") applies, as in the official code
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"block_type='sequential' \(absent: the official default\)"):
        NativeLLaDAConfig.from_llada_json(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match=r"model_type='bert' is not LLaDA"):
        NativeLLaDAConfig.from_llada_json(tmp_path)


def test_absent_fields_take_the_official_defaults_not_the_8b_values(official, tmp_path):
    cfg = json.loads((official / "config.json").read_text())
    for field in ("rope_theta", "max_sequence_length", "rms_norm_eps"):
        cfg.pop(field)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = NativeLLaDAConfig.from_llada_json(tmp_path)
    assert (got.rope_theta, got.max_sequence_length, got.rms_norm_eps) == (10000.0, 1024, 1e-5)


def test_a_checkpoint_whose_weights_do_not_match_is_refused(official, tmp_path):
    from safetensors.torch import load_file, save_file

    from lit_rl.errors import ConfigError

    copy = shutil.copytree(official, tmp_path / "renamed")
    state = load_file(copy / "model.safetensors")
    state["model.transformer.blocks.0.q_proj_renamed.weight"] = state.pop("model.transformer.blocks.0.q_proj.weight")
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError,
                       match=r"do not match NativeLLaDAModel: missing \['model.transformer.blocks.0.q_proj.weight'\]"):
        NativeLLaDA(str(copy), mask_id=None, eos_id=None, dtype="float32")


def test_bundled_official_config_is_the_8b_shape():
    if not LLADA_DIR.is_dir():
        pytest.skip("../shared/reference_models is absent")
    cfg = NativeLLaDAConfig.from_llada_json(LLADA_DIR)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.mlp_hidden_size) == (4096, 32, 32, 32, 12288)
    assert (cfg.embedding_size, cfg.mask_token_id, cfg.rope_theta) == (126464, 126336, 500000.0)
    with torch.device("meta"):
        model = NativeLLaDAModel(cfg)
    index = json.loads((LLADA_DIR / "model.safetensors.index.json").read_text())
    assert set(model.state_dict()) == set(index["weight_map"])  # every official weight, nothing else
    assert sum(p.numel() for p in model.parameters()) * 2 == index["metadata"]["total_size"]  # bf16 bytes


# -- (3) training path and adapters on the official code --------------------------------------------------
def test_native_policy_4bit_lora_targets_the_official_names_and_keeps_the_head(official):
    policy = NativeLLaDA(
        str(official), mask_id=None, eos_id=None, dtype="float32",
        quantization=QuantizationSettings(compute_dtype="float32"), lora=LoraSettings(r=4, alpha=8, dropout=0.0),
        gradient_checkpointing=True,
    )
    assert policy.mask_id == 2 and policy.accepts_position_ids
    adapted = {n.split(".")[-1] for n, m in policy.model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == OFFICIAL_TARGETS
    assert not hasattr(policy.model.get_base_model().model.transformer.ff_out, "lora_A")  # the LM head
    assert policy.checkpointing == "hf"
    from lit_rl.models.quantization import linear4bit_modules

    assert len(linear4bit_modules(policy.model)) == 2 * 7  # every block projection; the head stays dense


def test_activation_checkpointing_gives_the_same_gradients(official):
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        policy = NativeLLaDA(str(official), mask_id=None, eos_id=None, dtype="float32",
                             lora=LoraSettings(r=4, alpha=8, dropout=0.0), gradient_checkpointing=ckpt)
        blocks = policy.model.get_base_model().model.transformer.blocks
        assert all(b.gradient_checkpointing is ckpt for b in blocks)  # checkpointing really switched on / off
        with torch.no_grad():
            for n, p in sorted(policy.named_parameters()):
                if "lora_B" in n:
                    p.fill_(0.01)
        _, ids, mask = left_padded()
        policy.train()
        policy(ids, mask).float().logsumexp(-1).mean().backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 2 * 2 * 7
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7)


def test_adapter_trained_on_native_loads_onto_the_official_code_with_peft(official, tmp_path):
    from peft import PeftModel

    policy = NativeLLaDA(str(official), mask_id=None, eos_id=None, dtype="float32",
                         lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in sorted(policy.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    policy.model.save_pretrained(tmp_path / "adapter")
    ref = PeftModel.from_pretrained(load_remote_model(str(official), dtype=torch.float32), tmp_path / "adapter").eval()
    policy.eval()
    _, ids, _ = left_padded(lens=(10, 10))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        base = ref.get_base_model()
        with ref.disable_adapter():
            plain = base(input_ids=ids).logits
        got = policy(ids)
    assert (want - plain).abs().max() > 0.05  # the adapters change the official model's output
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_fit_with_incompatible_remote_code_prints_the_shim_error_not_jsonargparse_union(official, tmp_path, capsys):
    from lit_rl.cli import main

    copy = shutil.copytree(official, tmp_path / "broken")
    code = (copy / "modeling_llada.py").read_text()
    (copy / "modeling_llada.py").write_text(
        code.replace("        if not model:\n", "        config.lit_rl_missing_attribute\n        if not model:\n", 1))
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        "model:\n  init_args:\n    policy:\n      class_path: lit_rl.models.PretrainedDiffusionLM\n"
        f"      init_args: {{path: {copy}, mask_id: null, eos_id: null, dtype: float32}}\n"
        "data:\n  init_args:\n    generation: {cache: none, threshold: null}\n"  # its own forward: no KV cache
    )
    from support.reference import ROOT

    rc = main([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(overlay), f"--trainer.default_root_dir={tmp_path}/run",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    ])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: policy.path: the remote code of" in err and "lit_rl_missing_attribute" in err
    assert "Union subtypes" not in err


@pytest.mark.slow
@pytest.mark.parametrize("policy_class", ["NativeLLaDA", "PretrainedDiffusionLM"])
def test_paper_policy_path_fits_validates_and_exports_on_the_official_checkpoint(official, tmp_path, policy_class):
    """The paper configs' policy path (4-bit NF4 + LoRA + checkpointing) through the real CLI on the official
    tiny checkpoint: 4 ERILS updates, validate from the checkpoint, export; the adapter loads on the official code."""
    from peft import PeftModel

    from lit_rl.cli import run_lightning_cli
    from lit_rl.models.export_cli import main as export_main
    from support.reference import ROOT

    remote = "trust_remote_code: true" if policy_class == "PretrainedDiffusionLM" else ""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"""
trainer:
  max_steps: 4
  enable_checkpointing: true
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {tmp_path}/run/checkpoints, save_last: true, save_top_k: 0}}
model:
  init_args:
    policy:
      class_path: lit_rl.models.{policy_class}
      init_args:
        path: {official}
        mask_id: null
        eos_id: null
        dtype: float32
        {remote}
        quantization: {{load_in_4bit: true, quant_type: nf4, compute_dtype: float32}}
        lora: {{r: 8, alpha: 16, dropout: 0.05}}
        gradient_checkpointing: true
data:
  init_args:
    max_prompt_len: 64
    pool_path: {ROOT}/data/pools/sudoku_scripted.jsonl.gz
    generation: {{cache: none, threshold: null}}   # a checkpoint's own forward has no KV cache
""")
    common = [
        "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        "--config", str(overlay),
        f"--trainer.default_root_dir={tmp_path}/run", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    ]
    torch.manual_seed(0)
    cli = run_lightning_cli(["fit", *common])
    assert cli.trainer.global_step == 4 and cli.model.surrogate.mask_id == 2  # from config.json via the policy
    ckpt = tmp_path / "run/checkpoints/last.ckpt"
    val = run_lightning_cli(["validate", *common, f"--ckpt_path={ckpt}"])
    assert "val/sudoku/greedy/accuracy" in val.trainer.callback_metrics
    assert export_main(["--ckpt", str(ckpt), "--out", str(tmp_path / "export"),
                        "--config", str(tmp_path / "run/config.yaml"), "--dtype", "float32", "--merge"]) == 0
    ref = PeftModel.from_pretrained(load_remote_model(str(official), dtype=torch.float32),
                                    tmp_path / "export/adapter").eval()
    trained = {n.removeprefix("policy.model."): p for n, p in cli.model.named_parameters() if "lora_" in n}
    loaded = {n.replace(".default", ""): p for n, p in ref.named_parameters() if "lora_" in n}
    assert len(loaded) == len(trained) == 2 * 7 * 2
    for n, p in trained.items():
        torch.testing.assert_close(loaded[n.replace(".default", "")], p.detach().float())
    # the merged model loads on the official code (official config.json + modeling files) and on NativeLLaDA
    merged = tmp_path / "export/merged"
    assert json.loads((merged / "config.json").read_text())["model_type"] == "llada"
    on_official = load_remote_model(str(merged), dtype=torch.float32).eval()
    on_native = native_model(merged)
    _, ids, _ = left_padded(lens=(10, 10))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        torch.testing.assert_close(on_official(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(on_native(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
