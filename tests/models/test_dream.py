"""A Dream-style dLLM through the paper's policy path on CPU: remote code + 4-bit NF4 + LoRA + logit shift.

``tests/fixtures/tiny_dream`` is a tiny Dream-style model (Qwen2 layout, bidirectional attention, model type
"Dream") with its own modeling file, loaded with ``trust_remote_code=True`` through
:class:`PretrainedDiffusionLM`. Dream was initialised from an AR model and keeps its convention: the logits
at position ``t - 1`` predict the token at ``t``. ``logits_shift=True`` moves them one position right, so
everything downstream (surrogate, decoding) reads position ``t`` for token ``t`` as with LLaDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from lit_rl.core.masks import DiffusionMasks  # noqa: E402
from lit_rl.algorithms.surrogates import SPGSurrogate, elbo  # noqa: E402
from lit_rl.generation.diffusion import diffusion_generate  # noqa: E402
from lit_rl.generation.settings import DecodeSettings  # noqa: E402
from lit_rl.models import PretrainedDiffusionLM  # noqa: E402
from lit_rl.models.policy import LORA_TARGETS, resolve_lora_targets  # noqa: E402
from lit_rl.models.quantization import PACKING_FLAG, linear4bit_modules, packed_layers  # noqa: E402
from support.pretrained import (  # noqa: E402
    PROMPTS, adapter_grads, assert_trap, build_pretrained, eval_pass, fit_tiny_erils, randomize_adapters)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/tiny_dream"
ATTN, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
LAYERS = 2
# every Linear of the blocks, by full name (under the peft wrapper: base_model.model.<name>)
BLOCK_LINEARS = {f"model.layers.{i}.self_attn.{p}" for i in range(LAYERS) for p in ATTN} | {
    f"model.layers.{i}.mlp.{p}" for i in range(LAYERS) for p in MLP
}


def build(**kw) -> PretrainedDiffusionLM:
    return build_pretrained(FIXTURE, logits_shift=True, **kw)


def raw_logits(policy: PretrainedDiffusionLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The model's own logits, unshifted: ``(B, T, V)``, position t-1 predicts token t (positions counted
    over real tokens, as Dream's own generation does for left-padded batches)."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    return policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits


@pytest.fixture(scope="module")
def policy() -> PretrainedDiffusionLM:
    p = build()
    randomize_adapters(p)  # adapters that change the logits (lora_B = 0 at init)
    return p.eval()


# -- loading --------------------------------------------------------------------------------------------
def test_remote_code_4bit_lora_loading(policy):
    base = policy.model.get_base_model()
    # the fixture's own modeling file, loaded through trust_remote_code (transformers_modules.*)
    assert type(base).__name__ == "DreamModel" and "transformers_modules" in type(base).__module__
    assert base.config.model_type == "Dream" and policy.logits_shift
    # targets from LORA_TARGETS["dream"] although model_type is capitalised
    assert resolve_lora_targets(base, None) == LORA_TARGETS["dream"] == [*ATTN, *MLP]
    # every block projection is 4-bit NF4 and adapted; lm_head is neither
    q4 = {n.removesuffix(".base_layer"): m for n, m in linear4bit_modules(base)}
    assert set(q4) == BLOCK_LINEARS
    assert all(m.weight.quant_state.quant_type == "nf4" for m in q4.values())
    assert all(getattr(m, PACKING_FLAG) is False for m in q4.values())
    # policy.model.base_model.model.<name>.lora_A.default.weight
    adapted = {n.split(".lora_A")[0].split("base_model.model.", 1)[1] for n, _ in policy.named_parameters()
               if ".lora_A." in n}
    assert adapted == BLOCK_LINEARS
    assert type(base.lm_head) is torch.nn.Linear and not hasattr(base.lm_head, "lora_A")
    assert all("lora_" in n for n, q in policy.named_parameters() if q.requires_grad)
    # ids from the tokenizer (Dream's <|mask|> / <|endoftext|>), left padding
    tok = policy.tokenizer
    assert ((policy.mask_id, policy.eos_id, policy.pad_id) == (tok.mask_token_id, tok.eos_token_id, tok.pad_token_id)
            == (2, 0, 0))
    ids, mask = policy.encode_prompts(PROMPTS)
    assert mask[1, 0] == 0 and ids[1, 0] == policy.pad_id
    assert tok.decode(ids[1, mask[1].bool()]).startswith("<|im_start|>system")


# -- the shift ------------------------------------------------------------------------------------------
def test_position_ids_from_the_attention_mask_reach_the_model(policy, monkeypatch):
    """Dream's forward takes position ids, so the policy passes them (counted over real tokens, as Dream's
    own generation does); LLaDA's forward has none. With rotary positions and masked padding the logits of a
    left-padded prompt equal the prompt's alone either way (relative offsets are unchanged), from its
    second token on: the first token's shifted logits come from the pad position before it."""
    assert policy.accepts_position_ids
    ids, mask = policy.encode_prompts(PROMPTS)  # (2, P): row 1 is left-padded
    seen = {}
    inner = policy.model.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return inner(*args, **kwargs)

    monkeypatch.setattr(policy.model, "forward", spy)
    alone, alone_mask = policy.encode_prompts(PROMPTS[1:])  # (1, P1)
    with torch.no_grad():
        batched = policy(ids, mask)[1, -alone.shape[1]:]  # (P1, V)
        expected = (mask.cumsum(-1) - 1).clamp(min=0)
        assert torch.equal(seen["position_ids"], expected)
        single = policy(alone, alone_mask)[0]  # (P1, V)
    torch.testing.assert_close(batched[1:], single[1:], rtol=1e-4, atol=1e-5)


def test_policy_logits_are_the_raw_logits_shifted_one_position_right(policy):
    ids, mask = policy.encode_prompts(PROMPTS)  # (2, P)
    ids = ids.clone()
    ids[:, -5:] = policy.mask_id
    with torch.no_grad():
        raw = raw_logits(policy, ids, mask)  # (2, P, V)
        out = policy(ids, mask)  # (2, P, V)
    assert out.shape == raw.shape
    # out[:, t] = raw[:, t-1] for t >= 1; position 0 (never scored: it is a prompt token) keeps raw[:, 0]
    torch.testing.assert_close(out[:, 1:], raw[:, :-1], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 0], raw[:, 0], rtol=0, atol=0)
    assert not torch.allclose(out[:, 1:], raw[:, 1:])  # the shift is not a no-op on this model


def test_surrogate_scores_a_masked_token_with_the_logits_one_position_earlier(policy):
    """One hand-computed log-prob: completion token j (sequence position P + j) under the noisy input
    with that position masked is ``log softmax(raw[P + j - 1])[token]``, and is the ELBO of that draw."""
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)  # (2, P)
    B, P = prompt_ids.shape
    completion = torch.tensor([[60, 61, 62, 0], [70, 71, 0, 0]])  # (2, L=4), EOS-padded
    ids = torch.cat([prompt_ids, completion], 1)  # (2, T)
    attn = torch.cat([prompt_mask, torch.ones_like(completion)], 1)  # (2, T)
    j = 1  # mask and score completion position 1 only, in both rows
    sel = torch.zeros(1, B, 4, dtype=torch.bool)
    sel[:, :, j] = True
    masks = DiffusionMasks(completion=sel, loss=sel)
    sur = SPGSurrogate(num_t=1, mask_id=policy.mask_id)
    with torch.no_grad():
        logp = sur.token_logprobs(policy, ids, attn, P, masks)  # (1, 2, 4)
        noisy = ids.clone()
        noisy[:, P + j] = policy.mask_id
        raw = raw_logits(policy, noisy, attn)  # (2, T, V)
    for b in range(B):
        want = torch.log_softmax(raw[b, P + j - 1].float(), -1)[ids[b, P + j]]  # the token's predictor: t - 1
        unshifted = torch.log_softmax(raw[b, P + j].float(), -1)[ids[b, P + j]]
        torch.testing.assert_close(logp[0, b, j], want)
        assert not torch.isclose(logp[0, b, j], unshifted)
    torch.testing.assert_close(elbo(logp, masks.loss), logp[0, :, j])  # one scored position: ELBO = its log-prob


# -- generation -----------------------------------------------------------------------------------------
def test_generation_keeps_the_prompt_and_is_deterministic_at_temperature_zero(policy):
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)  # (2, P)
    P = prompt_ids.shape[1]
    settings = DecodeSettings(gen_length=16, block_length=8, steps=8, temperature=0.0)
    policy.train()  # generate() switches to eval and back
    a = policy.generate(prompt_ids, prompt_mask, settings, seed=1)  # (2, 16)
    assert policy.training
    b = policy.generate(prompt_ids, prompt_mask, settings, seed=2)  # seed unused at T=0
    assert a.shape == (2, 16) and torch.equal(a, b)
    assert not (a == policy.mask_id).any()
    # generate() is the decoder run on the shifted logits, returning the completion after an unchanged prompt
    policy.eval()
    with torch.no_grad():
        full = diffusion_generate(
            lambda i, m: policy(i, m), prompt_ids, prompt_mask, gen_length=16, block_length=8, steps=8,
            temperature=0.0, mask_id=policy.mask_id,
        )  # (2, P + 16)
    assert torch.equal(full[:, :P], prompt_ids) and torch.equal(full[:, P:], a)


# -- the gradient check (bitsandbytes CPU packing trap) ---------------------------------------------------
@pytest.mark.parametrize("cpu_flag", ["native", "simulated_avx512bf16", "forced_off"])
def test_eval_pass_keeps_lora_gradients(cpu_flag, monkeypatch):
    if cpu_flag == "simulated_avx512bf16":  # as on an AVX512-BF16 CPU, where bitsandbytes packs in eval
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    if cpu_flag == "forced_off":  # as on a CPU without it (on this machine's own detection either way)
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: False)
    trained = build()
    randomize_adapters(trained)
    want = adapter_grads(trained)  # before any eval pass
    eval_pass(trained)  # Lightning's sanity check
    assert packed_layers(trained) == []
    got = adapter_grads(trained)
    assert got.keys() == want.keys() and len(got) == 2 * len(BLOCK_LINEARS)  # lora_A and lora_B per Linear
    for n in want:
        assert want[n].abs().sum() > 0, f"{n}: zero gradient"
        torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}")


def test_gradient_check_catches_the_trap_without_the_guard(monkeypatch):
    """Control: with lit_rl's packing guard disabled, the same check fails (AVX512-BF16 detection forced on).

    The trap shows in one of two forms. Where the CPU lacks AVX512-BF16, bitsandbytes registers no fused CPU
    gemv kernel and the packed weights give silently WRONG gradients. Where the CPU has it natively, the fused
    kernel's backward raises "a view of a leaf Variable that requires grad is being used in an in-place
    operation" (seen on an AMD EPYC with avx512_bf16). The control accepts either; the guarded check passes
    on both.
    """
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr("lit_rl.models.quantization.disable_cpu_weight_packing", lambda model: 0)
    trained = build()
    randomize_adapters(trained)
    want = adapter_grads(trained)
    eval_pass(trained)
    assert packed_layers(trained), "the eval pass should have packed the 4-bit weights"
    assert_trap(trained, want)  # wrong gradients, or (native AVX512-BF16) the fused kernel's error


def test_hf_gradient_checkpointing_gives_the_same_gradients():
    plain = build()
    randomize_adapters(plain)
    ckpt = build(gradient_checkpointing=True)
    randomize_adapters(ckpt)
    assert ckpt.checkpointing == "hf"  # Dream declares supports_gradient_checkpointing
    a, b = adapter_grads(plain), adapter_grads(ckpt)
    for n in a:
        torch.testing.assert_close(b[n], a[n])


# -- ERILS through the CLI ------------------------------------------------------------------------------
def test_erils_fit_with_4bit_lora_dream_policy(tmp_path):
    """A few ERILS steps through the real CLI (sanity check on): every adapter moves, the 4-bit base does not."""
    cli = fit_tiny_erils(FIXTURE, "tests/models/tiny_dream_4bit.yaml", tmp_path)
    trainer, policy = cli.trainer, cli.model.policy
    assert trainer.global_step == 4 and trainer.datamodule.cursor == 2
    assert policy.logits_shift and policy.checkpointing == "hf" and cli.model.surrogate.mask_id == 2
    assert packed_layers(policy) == []
    fresh = build(lora_dropout=0.05)
    now = dict(policy.named_parameters())
    lora = [n for n, _ in fresh.named_parameters() if "lora_" in n]
    changed = [n for n, p in fresh.named_parameters() if "lora_" in n and not torch.equal(now[n].detach(), p.detach())]
    assert len(lora) == 2 * len(BLOCK_LINEARS) and changed == lora  # every adapter matrix moved
    for (n, m), (_, m0) in zip(linear4bit_modules(policy), linear4bit_modules(fresh)):
        assert torch.equal(m.weight.data, m0.weight.data), n  # the frozen 4-bit base did not
    assert (tmp_path / "checkpoints/last.ckpt").exists()
