"""The paper's policy path on CPU: remote-code dLLM + 4-bit NF4 base + LoRA (+ checkpointing, export).

``tests/fixtures/tiny_llada`` is a tiny LLaDA-style model with its own modeling file, loaded with
``trust_remote_code=True`` through :class:`PretrainedDiffusionLM` exactly as LLaDA-8B-Instruct is.

The gradient check guards against the bitsandbytes CPU packing trap (:mod:`lit_rl.models.quantization`):
an eval-mode no-grad forward (Lightning's sanity check, greedy evaluation, rollout generation) must not
change the LoRA gradients of later training steps. The trap needs ``Linear4bit.support_avx512bf16_for_cpu``,
which bitsandbytes sets from the CPU's AVX512-BF16 flag; ``simulated_avx512bf16`` patches that probe so
the check exercises the trap on any CPU (the packed path then runs bitsandbytes' generic CPU kernel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from lit_rl.models import PretrainedDiffusionLM  # noqa: E402
from lit_rl.models.quantization import PACKING_FLAG, linear4bit_modules, packed_layers  # noqa: E402
from support.pretrained import (  # noqa: E402
    PROMPTS, adapter_grads, assert_trap, build_pretrained, eval_pass, fit_tiny_erils, randomize_adapters)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/tiny_llada"
BLOCK_TARGETS = {"q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"}


def cpu_has_avx512bf16() -> bool:
    """Whether bitsandbytes packs here: the detection ``Linear4bit`` reads (``bnb.nn.modules``), so a suite
    run with ``LIT_RL_FORCE_AVX512BF16=0`` on an AVX512-BF16 CPU skips the native control as a CPU without
    it would (the library's own ``functional.has_avx512bf16`` would still say yes)."""
    return bool(bnb.nn.modules.has_avx512bf16())


@pytest.fixture(params=["native", "simulated_avx512bf16", "forced_off"])
def cpu_flag(request, monkeypatch):
    """``native``: this CPU's bitsandbytes behaviour; ``simulated_avx512bf16``: as on an AVX512-BF16 CPU;
    ``forced_off``: as on a CPU without it (detection forced both ways, whatever this CPU has)."""
    if request.param == "simulated_avx512bf16":
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    if request.param == "forced_off":
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: False)
    return request.param


def build(**kw) -> PretrainedDiffusionLM:
    return build_pretrained(FIXTURE, **kw)


# -- loading --------------------------------------------------------------------------------------------
def test_remote_code_4bit_lora_loading():
    p = build()
    base = p.model.get_base_model()
    # the fixture's own modeling file, loaded through trust_remote_code (transformers_modules.*)
    assert type(base).__name__ == "LLaDAModelLM" and "transformers_modules" in type(base).__module__
    assert base.config.model_type == "llada"
    # every block projection is 4-bit NF4; the LM head (model.transformer.ff_out) is not quantised ...
    q4 = dict(linear4bit_modules(base))
    assert ({n.removesuffix(".base_layer").rsplit(".", 1)[-1] for n in q4} == BLOCK_TARGETS
            and len(q4) == 2 * len(BLOCK_TARGETS))
    assert all(m.weight.quant_state.quant_type == "nf4" for m in q4.values())
    assert all(getattr(m, PACKING_FLAG) is False for m in q4.values())
    # ... and not adapted, although its name (ff_out) is a LLaDA LoRA target
    adapted = {n.split(".lora_A")[0] for n, _ in p.named_parameters() if ".lora_A." in n}
    assert len(adapted) == 2 * len(BLOCK_TARGETS)
    assert not any(n.endswith("transformer.ff_out") for n in adapted)
    assert all("lora_" in n for n, q in p.named_parameters() if q.requires_grad)
    # ids from the tokenizer, LLaDA call shape, left padding
    tok = p.tokenizer
    assert (p.mask_id, p.eos_id) == (tok.mask_token_id, tok.eos_token_id) == (2, 0)
    ids, mask = p.encode_prompts(PROMPTS)
    assert mask[1, 0] == 0 and ids[1, 0] == p.pad_id
    assert p(ids, mask).shape == (2, ids.shape[1], base.config.vocab_size)


def test_4bit_forward_tracks_the_full_precision_model():
    """NF4 is a close approximation of the float32 weights (same logits up to quantisation error)."""
    torch.manual_seed(0)
    q = build()
    full = PretrainedDiffusionLM(str(FIXTURE), mask_id=None, eos_id=None, dtype="float32").eval()
    ids, mask = q.encode_prompts(PROMPTS)
    with torch.no_grad():
        a, b = q.eval()(ids, mask), full(ids, mask)
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.95


# -- the gradient check (bitsandbytes CPU packing trap) ---------------------------------------------------
def test_eval_pass_keeps_lora_gradients(cpu_flag):
    trained = build()
    randomize_adapters(trained)
    eval_pass(trained)  # Lightning's sanity check
    assert packed_layers(trained) == []
    got = adapter_grads(trained)
    fresh = build()
    randomize_adapters(fresh)
    want = adapter_grads(fresh)  # never ran eval
    assert got.keys() == want.keys() and len(got) == 4 * len(BLOCK_TARGETS)
    for n in want:
        assert want[n].abs().sum() > 0, f"{n}: zero gradient"
        torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("native", [False, True], ids=["simulated", "native"])
def test_gradient_check_catches_the_trap_without_the_guard(native, monkeypatch):
    """Control: with the guard disabled, the same check fails (here, or natively on an AVX512-BF16 CPU)."""
    if native and not cpu_has_avx512bf16():
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never packs 4-bit weights here")
    if not native:
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr("lit_rl.models.quantization.disable_cpu_weight_packing", lambda model: 0)
    trained = build()
    randomize_adapters(trained)
    eval_pass(trained)
    assert packed_layers(trained), "the eval pass should have packed the 4-bit weights"
    fresh = build()
    randomize_adapters(fresh)
    assert_trap(trained, adapter_grads(fresh))  # wrong gradients, or (native AVX512-BF16) the fused kernel's error


def test_gradient_checkpointing_gives_the_same_gradients():
    plain = build()
    randomize_adapters(plain)
    ckpt = build(gradient_checkpointing=True)
    randomize_adapters(ckpt)
    assert ckpt.checkpointing == "whole_layer"  # LLaDA's own mechanism (no HF gradient_checkpointing_enable)
    a, b = adapter_grads(plain), adapter_grads(ckpt)
    for n in a:
        torch.testing.assert_close(b[n], a[n])


# -- ERILS through the CLI, then export -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A few ERILS steps through the real CLI with the 4-bit + LoRA remote-code policy (sanity check on)."""
    tmp = tmp_path_factory.mktemp("llada_fit")
    return fit_tiny_erils(FIXTURE, "tests/models/tiny_llada_4bit.yaml", tmp), tmp


def test_erils_fit_with_4bit_lora_remote_code_policy(fitted):
    cli, tmp = fitted
    trainer, policy = cli.trainer, cli.model.policy
    assert trainer.global_step == 4 and trainer.datamodule.cursor == 2
    assert packed_layers(policy) == []  # the sanity check and greedy evaluation did not pack anything
    assert policy.model.training  # LoRA dropout active (from_pretrained returns eval mode)
    fresh = build(lora_dropout=0.05)
    now = dict(policy.named_parameters())
    changed = [n for n, p in fresh.named_parameters() if "lora_" in n and not torch.equal(now[n].detach(), p.detach())]
    assert len(changed) == 4 * len(BLOCK_TARGETS)  # every adapter matrix moved
    # the frozen 4-bit base did not
    for (n, m), (_, m0) in zip(linear4bit_modules(policy), linear4bit_modules(fresh)):
        assert torch.equal(m.weight.data, m0.weight.data), n
    assert (tmp / "checkpoints/last.ckpt").exists() and (tmp / "config.yaml").exists()


def test_export_adapters_in_peft_format_and_merge(fitted, tmp_path):
    from peft import PeftModel
    # through the folder's own auto_map (lit_rl's loader), not AutoModel: once the official LLaDA code has been
    # imported in this process (tests/models/test_llada_reference.py) it is registered for every "llada" folder
    from lit_rl.models.remote_compat import load_remote_model

    from lit_rl.models.export_cli import main

    cli, run = fitted
    out = tmp_path / "export"
    assert main(["--ckpt_path", str(run / "checkpoints/last.ckpt"), "--out", str(out), "--merge",
                 "--dtype", "float32"]) == 0
    adapter_cfg = json.loads((out / "adapter/adapter_config.json").read_text())
    assert adapter_cfg["r"] == 8 and adapter_cfg["lora_alpha"] == 16
    assert (out / "adapter/adapter_model.safetensors").exists()
    # PEFT loads the adapters onto the (full-precision) base: same logits as the trained policy's adapters
    # on a full-precision base
    base = load_remote_model(str(FIXTURE), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    trained = {n.split("base_model.model.", 1)[-1]: p for n, p in cli.model.policy.model.named_parameters()
               if "lora_" in n}
    loaded = {n.split("base_model.model.", 1)[-1]: p for n, p in peft_model.named_parameters() if "lora_" in n}
    assert trained.keys() == loaded.keys()
    for n in trained:
        torch.testing.assert_close(loaded[n], trained[n].detach())
    # the merged export: a plain remote-code model directory with the adapters folded in
    merged = load_remote_model(str(out / "merged"), dtype=torch.float32).eval()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert (out / "merged/modeling_tinyllada.py").exists() and (out / "merged/tokenizer.json").exists()
    ids = torch.tensor([[1, 4, 41, 39, 2, 2, 2]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, peft_model(ids).logits, atol=1e-4, rtol=1e-4)
        plain = load_remote_model(str(FIXTURE), dtype=torch.float32).eval()
        assert not torch.allclose(merged(ids).logits, plain(ids).logits, atol=1e-4)  # the adapters mattered
