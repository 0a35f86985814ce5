import pytest
import torch
import torch.nn.functional as F

from lit_rl.models import LoraSettings
from lit_rl.models.ar import PretrainedCausalLM, TinyCausalLM, position_ids_from_mask


def tiny(**kw) -> TinyCausalLM:
    args = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=128)
    args.update(kw)
    return TinyCausalLM(**args).eval()


def test_tiny_causal_lm_is_seeded_and_uses_the_char_tokenizer():
    a, b = tiny(seed=3), tiny(seed=3)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na
    assert a.model.config.model_type == "llama"
    assert a.eos_id == a.tokenizer.eos_token_id and a.pad_id == a.tokenizer.pad_token_id
    # the reasoning delimiter is one atomic token, so a cut in token space never splits it
    assert len(a.think_end_ids()) == 1
    assert a.tokenizer.convert_ids_to_tokens(a.think_end_ids()) == ["</reasoning>"]


def test_token_logprobs_match_hand_computed_log_softmax_gather():
    p = tiny()
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])  # prompt [10, 11, 12], completion [13, 14, 15]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got = p.token_logprobs(ids, mask, prompt_len=3)  # (1, 3)
        logits = p.model(input_ids=ids).logits[0]  # (6, V)
    # token at position t is scored by the logits at t-1: completion tokens 13, 14, 15 by positions 2, 3, 4
    logp = F.log_softmax(logits.float(), -1)
    expected = torch.stack([logp[2, 13], logp[3, 14], logp[4, 15]])
    assert got.shape == (1, 3)
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
    # temperature divides the logits before the softmax
    with torch.no_grad():
        hot = p.token_logprobs(ids, mask, prompt_len=3, temperature=2.0)
    expected_hot = F.log_softmax(logits.float() / 2.0, -1)[[2, 3, 4], [13, 14, 15]]
    torch.testing.assert_close(hot[0], expected_hot, atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_completion_logprobs():
    p = tiny()
    ids, mask = p.encode_prompts([[{"role": "user", "content": "12"}], [{"role": "user", "content": "123456"}]])
    completion = torch.tensor([[20, 21, 22, 3], [30, 31, 3, 3]])  # EOS id 3 fills the tail
    assert completion[0, -1].item() == p.eos_id
    batch_ids = torch.cat([ids, completion], 1)
    batch_mask = torch.cat([mask, torch.ones_like(completion)], 1)
    alone_ids, alone_mask = p.encode_prompts([[{"role": "user", "content": "12"}]])
    with torch.no_grad():
        batched = p.token_logprobs(batch_ids, batch_mask, prompt_len=ids.shape[1])  # (2, 4)
        alone = p.token_logprobs(
            torch.cat([alone_ids, completion[:1]], 1),
            torch.cat([alone_mask, torch.ones_like(completion[:1])], 1),
            prompt_len=alone_ids.shape[1],
        )  # (1, 4)
    # "12\n" is 3 tokens, padded by 4 in the batch: positions from the mask make the padding invisible
    assert mask[0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=1e-5)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_text_helpers_are_the_dllm_policy_ones():
    p = tiny()
    comp, lengths = p.encode_completions(["ab", "abcdefgh"], 5)
    assert lengths.tolist() == [3, 5]
    assert p.completion_lengths(comp).tolist() == [3, 5]
    assert p.decode_completions(comp) == ["ab", "abcd"]
    assert p.count_tokens("<reasoning>12</reasoning>") == 4
    assert p.tokenizer_name == "lit_rl/char"


def test_lora_wraps_the_llama_projections_and_init_checkpoint_loads(tmp_path):
    base = tiny(seed=1)
    path = tmp_path / "w.pt"
    torch.save(base.model.state_dict(), path)
    p = tiny(seed=2, init_checkpoint=str(path), lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    trainable = [n for n, q in p.named_parameters() if q.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[10, 11, 12, 13]])
    with torch.no_grad():  # LoRA B starts at zero: same function as the loaded base
        torch.testing.assert_close(p(ids, torch.ones_like(ids)), base(ids, torch.ones_like(ids)))


def test_pretrained_causal_lm_loads_a_saved_checkpoint(tmp_path):
    src = tiny(seed=5)
    src.model.save_pretrained(tmp_path)
    src.tokenizer.save_pretrained(tmp_path)
    p = PretrainedCausalLM(str(tmp_path), dtype="float32", think_end="</reasoning>").eval()
    assert p.eos_id == src.eos_id and p.pad_id == src.pad_id
    assert p.think_end_ids() == src.think_end_ids()
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(p.token_logprobs(ids, mask, 2), src.token_logprobs(ids, mask, 2))


def _scored(p, ids, mask, prompt_len, temperature=1.0):
    """(log-probs, entropy, gradient of the LoRA params under sum(log-probs * w)) of one scoring pass."""
    p.zero_grad(set_to_none=True)
    logp, ent = p.completion_scores(ids, mask, prompt_len, temperature)
    w = torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)  # a loss that weighs every position differently
    (logp * w).sum().backward()
    grads = {n: q.grad.clone() for n, q in p.named_parameters() if q.requires_grad}
    return logp.detach(), ent, grads


def test_chunked_scoring_matches_the_whole_pass_values_entropy_and_gradients():
    p = tiny(seed=4, lora=LoraSettings(r=4, alpha=8, dropout=0.0)).train()
    for n, q in p.named_parameters():  # LoRA B starts at zero: give it values so its gradient path is real
        if "lora_B" in n:
            torch.nn.init.normal_(q, std=0.05, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(5, 40, (3, 23), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    whole = _scored(p, ids, mask, prompt_len=6, temperature=0.7)
    for chunk in (1, 5, 17, 64):  # one position per pass, uneven blocks, one block larger than L = 17
        p.logprob_chunk = chunk
        got = _scored(p, ids, mask, prompt_len=6, temperature=0.7)
        torch.testing.assert_close(got[0], whole[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], whole[1], atol=1e-5, rtol=1e-5)
        assert got[1].requires_grad is False and got[0].shape == (3, 17)
        for n in whole[2]:
            torch.testing.assert_close(got[2][n], whole[2][n], atol=1e-5, rtol=1e-4, msg=n)
        with torch.no_grad():  # token_logprobs takes the chunked path too (pi_ref, SFT)
            torch.testing.assert_close(p.token_logprobs(ids, mask, 6, 0.7), whole[0], atol=1e-5, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in whole[2].values())


def test_chunked_scoring_refuses_a_model_whose_forward_changes_its_head():
    p = tiny()
    p.logprob_chunk = 4
    p.model.config.final_logit_softcapping = 30.0  # Gemma 2's: its forward caps the logits after the head
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    with pytest.raises(ValueError, match="logprob_chunk: LlamaForCausalLM changes its LM head's output"):
        p.token_logprobs(ids, torch.ones_like(ids), 2)


def test_chunked_scoring_refuses_a_forward_that_rescales_what_no_config_says():
    """A remote-code model whose forward rescales the logits after the head, with nothing in its config (as
    Falcon-H1's ``lm_head_multiplier`` once was, or MiniCPM's hidden-state scale): the first chunked call compares
    ``head(body(x))`` with the forward on a few tokens and refuses."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    p = tiny()
    p.logprob_chunk = 4
    real = p.model.forward
    p.model.forward = lambda *a, **k: CausalLMOutputWithPast(logits=real(*a, **k).logits * 0.5)
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    with pytest.raises(ValueError, match=r"forward does more than its LM head on its hidden states \(logits differ"):
        p.token_logprobs(ids, torch.ones_like(ids), 2)
    p.model.forward = real  # the plain model passes the check once and is not checked again
    p.token_logprobs(ids, torch.ones_like(ids), 2)
    assert p._head_checked is True
