"""Tests for lit_rl.generation.diffusion (LLaDA-style low-confidence remasking decoding)."""

import math

import pytest
import torch

from lit_rl.generation import (
    diffusion_generate,
    hf_model_fn,
    num_transfer_tokens,
    position_ids_from_attention_mask,
)

V = 12
MASK = 11


class FakeModel:
    """Deterministic bidirectional 'model': logits from fixed random maps of the token and of the context
    mean, plus a per-position sharpness, so predictions depend on the whole sequence. Records every call."""

    def __init__(self, seed=0, vocab=V):
        g = torch.Generator().manual_seed(seed)
        self.tok = torch.randn(vocab, vocab, generator=g)
        self.ctx = torch.randn(vocab, vocab, generator=g)
        self.calls = []

    def __call__(self, ids, attn):
        self.calls.append((ids.clone(), attn.clone()))
        onehot = torch.nn.functional.one_hot(ids, self.tok.shape[0]).float() * attn[..., None]  # (B, T, V)
        ctx = onehot.sum(1, keepdim=True) / attn.sum(1, keepdim=True)[..., None]  # (B, 1, V)
        pos = torch.arange(ids.shape[1], dtype=torch.float32)[None, :, None]  # (1, T, 1)
        return (onehot @ self.tok + ctx @ self.ctx) * (1 + 0.1 * pos)


def _prompts():
    # two prompts, the first left-padded by 2 (pad id 0 at prompt_mask 0)
    ids = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    return ids, mask


def test_num_transfer_tokens_schedule():
    # 5 masks over 2 steps: 5 // 2 = 2 each, and the first 5 % 2 = 1 step reveals one more -> [3, 2]
    # 4 masks over 3 steps: [2, 1, 1]; 0 masks: [0, 0, 0]
    assert num_transfer_tokens(torch.tensor([5]), 2).tolist() == [[3, 2]]
    assert num_transfer_tokens(torch.tensor([4, 0]), 3).tolist() == [[2, 1, 1], [0, 0, 0]]


def test_position_ids_from_attention_mask():
    # left padding by 2: positions start at 0 on the first real token
    assert position_ids_from_attention_mask(torch.tensor([[0, 0, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2]]


def test_greedy_is_deterministic_and_complete():
    ids, mask = _prompts()
    kw = dict(gen_length=8, block_length=4, steps=4, temperature=0.0, mask_id=MASK)
    a = diffusion_generate(FakeModel(), ids, mask, **kw)
    b = diffusion_generate(FakeModel(), ids, mask, **kw)
    assert a.shape == (2, 5 + 8)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :5], ids)  # prompt (and its padding) never changed
    assert not (a == MASK).any()


def test_reveals_exactly_n_i_per_step_block_by_block():
    ids, mask = _prompts()
    model = FakeModel()
    # gen 10, block 5, steps 4 -> 2 blocks, 2 steps per block, n = [3, 2] per block
    out = diffusion_generate(model, ids, mask, gen_length=10, block_length=5, steps=4, temperature=0.0, mask_id=MASK)
    counts = [(c[0][:, 5:] == MASK).sum(1).tolist() for c in model.calls]
    # masks seen by each of the 4 forward passes: 10, 10-3, 10-3-2, 10-5-3; then 0 at the end
    assert counts == [[10, 10], [7, 7], [5, 5], [2, 2]]
    assert (out[:, 5:] == MASK).sum().item() == 0
    # while block 0 is decoded, block 1 stays fully masked
    for c in model.calls[:2]:
        assert (c[0][:, 10:] == MASK).all()
    # the attention mask passed to the model is [prompt_mask | ones]
    for _, attn in model.calls:
        assert torch.equal(attn, torch.cat([mask, torch.ones(2, 10, dtype=torch.long)], 1))


def test_steps_beyond_block_length_skip_empty_steps():
    ids, mask = _prompts()
    model = FakeModel()
    # block 2, 3 steps per block -> n = [1, 1, 0]: the third step reveals nothing and runs no forward
    out = diffusion_generate(model, ids, mask, gen_length=4, block_length=2, steps=6, temperature=0.0, mask_id=MASK)
    assert len(model.calls) == 4
    assert not (out == MASK).any()


def test_reveals_the_most_confident_positions():
    # logits sharpen with position, so within a block the last positions are the most confident
    def model_fn(ids, attn):
        B, T = ids.shape
        logits = torch.zeros(B, T, V)
        logits[:, :, 7] = torch.arange(T, dtype=torch.float32)  # p(7) grows with position
        return logits

    ids = torch.tensor([[1, 2]])
    mask = torch.ones_like(ids)
    seen = []

    def spy(ids_, attn):
        seen.append(ids_.clone())
        return model_fn(ids_, attn)

    diffusion_generate(spy, ids, mask, gen_length=4, block_length=4, steps=2, temperature=0.0, mask_id=MASK)
    # step 1 reveals the 2 most confident positions (completion positions 2, 3); step 2 the others
    assert seen[1][0, 2:].tolist() == [MASK, MASK, 7, 7]


def test_never_reveals_mask_token():
    # a model that loves [MASK]: the argmax excludes it, so decoding still terminates mask-free
    def model_fn(ids, attn):
        logits = torch.zeros(*ids.shape, V)
        logits[..., MASK] = 10.0
        logits[..., 3] = 1.0
        return logits

    ids, mask = _prompts()
    out = diffusion_generate(model_fn, ids, mask, gen_length=4, block_length=4, steps=4, temperature=0.0, mask_id=MASK)
    assert (out[:, 5:] == 3).all()
    for sampler in ("gumbel", "inverse_cdf"):
        out = diffusion_generate(
            model_fn, ids, mask, gen_length=4, block_length=4, steps=4, temperature=1.0, mask_id=MASK,
            generator=torch.Generator().manual_seed(0), sampler=sampler,
        )
        assert not (out == MASK).any()


def test_sampling_reproducible_with_generator():
    ids, mask = _prompts()
    kw = dict(gen_length=8, block_length=4, steps=4, temperature=1.0, mask_id=MASK)
    a = diffusion_generate(FakeModel(), ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    b = diffusion_generate(FakeModel(), ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    c = diffusion_generate(FakeModel(), ids, mask, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(a[:, :5], ids)


@pytest.mark.parametrize("sampler", ["gumbel", "inverse_cdf"])
def test_sampling_matches_tempered_softmax(sampler):
    # one position, logits [0, log 2, log 4, -inf...] at T=1 -> probabilities 1/7, 2/7, 4/7;
    # at T=0.5 the logits double -> 1/21, 4/21, 16/21
    base = torch.full((V,), -1e9)
    base[:3] = torch.tensor([0.0, math.log(2), math.log(4)])

    def model_fn(ids, attn):
        return base.expand(*ids.shape, V).clone()

    n = 20000
    ids = torch.ones(n, 1, dtype=torch.long)
    for T, expected in [(1.0, [1 / 7, 2 / 7, 4 / 7]), (0.5, [1 / 21, 4 / 21, 16 / 21])]:
        out = diffusion_generate(
            model_fn, ids, torch.ones_like(ids), gen_length=1, block_length=1, steps=1, temperature=T,
            mask_id=MASK, generator=torch.Generator().manual_seed(0), sampler=sampler,
        )
        freq = torch.bincount(out[:, 1], minlength=V)[:3].float() / n
        assert torch.allclose(freq, torch.tensor(expected), atol=0.015), (T, freq)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(gen_length=10, block_length=4, steps=4), "block_length"),
        (dict(gen_length=8, block_length=4, steps=3), "steps"),
        (dict(gen_length=8, block_length=4, steps=0), "steps"),
        (dict(gen_length=8, block_length=4, steps=4, temperature=-1.0), "temperature"),
        (dict(gen_length=8, block_length=4, steps=4, sampler="nope"), "sampler"),
    ],
)
def test_argument_validation(kw, match):
    ids, mask = _prompts()
    kw = {"temperature": 0.0, **kw}
    with pytest.raises(ValueError, match=match):
        diffusion_generate(FakeModel(), ids, mask, mask_id=MASK, **kw)


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg).eval().double()


def test_batch_independence_with_left_padding_tiny_bert():
    model = _tiny_bert()
    fn = hf_model_fn(model)  # passes position ids from the attention mask
    mask_id = 39
    short = torch.tensor([[5, 6, 7]])
    long = torch.tensor([[8, 9, 10, 11, 12, 13]])
    kw = dict(gen_length=8, block_length=4, steps=4, temperature=0.0, mask_id=mask_id)
    alone = diffusion_generate(fn, short, torch.ones_like(short), **kw)
    batch_ids = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])  # left-pad short
    batch_mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    together = diffusion_generate(fn, batch_ids, batch_mask, **kw)
    assert torch.equal(together[0, 6:], alone[0, 3:])
    assert torch.equal(together[:, :6], batch_ids)
    assert not (together == mask_id).any()


def test_left_padding_without_position_ids_shifts_bert():
    # documents why hf_model_fn passes position ids: without them the padded row sees shifted positions
    model = _tiny_bert()
    short = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[0, 0, 0, 5, 6, 7]])
    pmask = torch.tensor([[0, 0, 0, 1, 1, 1]])
    kw = dict(gen_length=8, block_length=8, steps=1, temperature=0.0, mask_id=39)
    with_pos = diffusion_generate(hf_model_fn(model), padded, pmask, **kw)
    alone = diffusion_generate(hf_model_fn(model), short, torch.ones_like(short), **kw)
    without = diffusion_generate(hf_model_fn(model, pass_position_ids=False), padded, pmask, **kw)
    assert torch.equal(with_pos[0, 6:], alone[0, 3:])
    assert not torch.equal(without[0, 6:], alone[0, 3:])
