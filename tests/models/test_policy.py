import pytest
import torch

from lit_rl.models import LoraSettings, TinyDiffusionLM


def test_char_tokenizer_roundtrip_and_atomic_tags():
    p = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    text = "<reasoning>112</reasoning>\n<answer>1234</answer>"
    ids = p.tokenizer(text, add_special_tokens=False)["input_ids"]
    # 4 tags + "112" + "\n" + "1234" = 4 + 3 + 1 + 4 tokens
    assert len(ids) == 12
    assert p.tokenizer.decode(ids) == text


def test_encode_prompts_left_pads():
    p = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    ids, mask = p.encode_prompts([[{"role": "user", "content": "12"}], [{"role": "user", "content": "1234"}]])
    # chat template adds "\n": lengths 3 and 5, padded on the left to 5
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert ids[0, :2].tolist() == [p.pad_id, p.pad_id]


def test_completion_lengths_decode_and_encode():
    p = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    comp, lengths = p.encode_completions(["ab", "abcdefgh"], 5)
    # "ab"+EOS = 3 tokens then EOS padding; "abcdefgh" is cut to 4 tokens + EOS = 5
    assert lengths.tolist() == [3, 5]
    assert p.completion_lengths(comp).tolist() == [3, 5]
    assert p.decode_completions(comp) == ["ab", "abcd"]
    no_eos = torch.full((1, 4), p.tokenizer.convert_tokens_to_ids("x"))
    assert p.completion_lengths(no_eos).tolist() == [4]


@pytest.mark.parametrize("architecture", ["bert", "llada"])
def test_position_ids_make_left_padding_invisible(architecture):
    torch.manual_seed(0)
    p = TinyDiffusionLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                        architecture=architecture).eval()
    ids, mask = p.encode_prompts([[{"role": "user", "content": "12"}], [{"role": "user", "content": "123456"}]])
    with torch.no_grad():
        batched = p(ids, mask)[0, -3:]
        alone_ids, alone_mask = p.encode_prompts([[{"role": "user", "content": "12"}]])
        alone = p(alone_ids, alone_mask)[0]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("architecture", ["bert", "llada"])
def test_lora_trains_only_adapters(architecture):
    p = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                        lora=LoraSettings(r=4, alpha=8, dropout=0.0), architecture=architecture)
    trainable = [n for n, q in p.named_parameters() if q.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids, mask = p.encode_prompts([[{"role": "user", "content": "12"}]])
    p(ids, mask).sum().backward()
    assert all(q.grad is not None for n, q in p.named_parameters() if q.requires_grad and "lora_B" in n)


def test_generate_draws_its_gumbel_noise_on_the_prompts_device(monkeypatch):
    # (N, V) noise per decoding step: a generator on the device, never a CPU one whose draws are copied
    from lit_rl import rng
    from lit_rl.generation.settings import DecodeSettings
    from lit_rl.models import TinyDiffusionLM

    calls = []
    real = rng.device_generator
    monkeypatch.setattr(rng, "device_generator",
                        lambda seed, device: calls.append((seed, str(device))) or real(seed, device))
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)
    ids, mask = policy.encode_prompts([[{"role": "user", "content": "12"}]])
    policy.generate(ids, mask, DecodeSettings(8, 8, 4, 1.0), seed=5)
    assert calls == [(5, "cpu")]


def test_tiny_llada_architecture_is_the_native_llada_seeded_and_bidirectional():
    from lit_rl.models.llada import NativeLLaDAModel

    a = TinyDiffusionLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, architecture="llada", seed=3)
    b = TinyDiffusionLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, architecture="llada", seed=3)
    c = TinyDiffusionLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, architecture="llada", seed=4)
    assert isinstance(a.model, NativeLLaDAModel)
    assert {n for n, _ in a.model.named_parameters()} >= {"model.transformer.blocks.0.ff_proj.weight",
                                                          "model.transformer.ff_out.weight"}
    sa, sb, sc = a.model.state_dict(), b.model.state_dict(), c.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and not all(torch.equal(sa[k], sc[k]) for k in sa)
    ids = torch.tensor([[10, 11, 12, 13]])
    later = ids.clone()
    later[0, -1] = 14
    with torch.no_grad():
        assert (a(ids)[0, 0] - a(later)[0, 0]).abs().max() > 1e-4  # the first position sees the last token


def test_tiny_unknown_architecture_is_named():
    with pytest.raises(ValueError, match=r"architecture: must be one of \('bert', 'llada'\), got 'gpt'"):
        TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, architecture="gpt")
