"""lit_rl.algorithms.surrogates: the SPG surrogate module (mask routing by row kind, micro-batches, validation)
against the pure functions of lit_rl.core.spg (tested by hand in tests/core/test_spg.py)."""

import pytest
import torch

from lit_rl.core.masks import apply_masks
from lit_rl.errors import FieldError
from lit_rl.algorithms.surrogates import SPGSurrogate
from lit_rl.core.sources import rows_where
from lit_rl.core.spg import elbo, eubo, mix, spg_loss, spg_select, token_logprobs_from_logits


class TinyLogits(torch.nn.Module):
    """A differentiable bidirectional toy 'model': embedding + context mean -> vocab logits."""

    def __init__(self, vocab=10, dim=8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)
        self.calls = []

    def forward(self, ids, attn):
        self.calls.append(ids.shape)
        h = self.emb(ids) * attn[..., None]
        h = h + h.mean(1, keepdim=True)
        return self.out(h)


def _batch():
    # prompt width 2 (row 1 left-padded), completion width 8
    ids = torch.tensor(
        [
            [1, 2, 3, 4, 5, 6, 7, 8, 2, 2],
            [0, 2, 3, 3, 4, 5, 6, 2, 2, 2],
            [1, 2, 7, 6, 5, 4, 3, 2, 1, 2],
        ]
    )
    attn = torch.tensor([[1] * 10, [0] + [1] * 9, [1] * 10])
    cm = torch.arange(8)[None, :] < torch.tensor([7, 6, 8])[:, None]
    source = torch.tensor([0, 0, 1])
    adv = torch.tensor([0.5, -0.5, 1.0])
    return ids, attn, cm, source, adv


@pytest.mark.parametrize("mode, weighting",
                         [("mix", "length"), ("eubo", "length"), ("elbo", "length"), ("mix", "rollout")])
def test_spg_surrogate_matches_pure_functions(mode, weighting):
    ids, attn, cm, source, adv = _batch()
    model = TinyLogits()
    spg = SPGSurrogate(beta=1.5, num_t=2, mode=mode, block_length=4, mask_id=9, weighting=weighting)
    loss, stats = spg(model, ids, attn, 2, cm, source, adv, torch.Generator().manual_seed(0))
    assert model.calls == [(6, 10)]  # num_t·B rows in one forward
    loss.backward()
    assert model.out.weight.grad is not None and torch.isfinite(model.out.weight.grad).all()
    assert all(not v.requires_grad for v in stats.values())

    # same pipeline by hand with the same seed
    masks = spg.build_masks(cm, attn[:, :2], source, torch.Generator().manual_seed(0))
    noisy = apply_masks(ids, masks, 2, 9)  # (2, 3, 10)
    with torch.no_grad():
        logits = model(noisy.reshape(6, 10), attn.repeat(2, 1))[:, 2:]  # (6, 8, V)
        logp = token_logprobs_from_logits(logits, ids[:, 2:].repeat(2, 1)).reshape(2, 3, 8)
        lengths = cm.sum(-1)
        lo = elbo(logp, masks.loss)
        up = eubo(logp, masks.loss, lengths, 1.5)
        neg = {"mix": mix(lo, up, 0.5), "eubo": up, "elbo": lo}[mode]
        weights = lengths if weighting == "length" else torch.ones_like(lengths)
        expected, _ = spg_loss(adv, spg_select(lo, neg, adv), weights)
    torch.testing.assert_close(loss.detach(), expected)
    assert stats["completion_length_mean"].item() == pytest.approx(7.0)  # lengths [7, 6, 8], either weighting
    # per-source ELBO diagnostics: rows 0-1 on-policy, row 2 external
    torch.testing.assert_close(stats["elbo_on_policy"], lo[:2].mean())
    torch.testing.assert_close(stats["elbo_external"], lo[2])


def test_spg_surrogate_routes_sources_and_microbatches():
    ids, attn, cm, source, adv = _batch()
    spg = SPGSurrogate(num_t=2, block_length=4, mask_id=9, p_mask_prompt=0.0, p_mask_clean=0.0)
    masks = spg.build_masks(cm, attn[:, :2], source, torch.Generator().manual_seed(1))
    # on-policy rows: block structure (once a position is masked, the rest of the completion is too,
    # apart from within the chosen block); external row: any subset of valid positions
    for j in range(2):
        for b in (0, 1):
            row = masks.completion[j, b]
            k = int(row.nonzero()[0]) // 4
            assert row[(k + 1) * 4 :].all() and not row[: k * 4].any()
    assert not masks.prompt.any()
    model = TinyLogits()
    full, _ = spg(model, ids, attn, 2, cm, source, adv, torch.Generator().manual_seed(1))
    assert model.calls == [(6, 10)]  # num_t·B rows in one forward: the module's micro_batch_size bounds B
    with pytest.raises(FieldError, match="micro_batch_size.*model.init_args.micro_batch_size"):
        SPGSurrogate(micro_batch_size=4)  # one setting: the module's


def test_spg_surrogate_validation():
    with pytest.raises(ValueError, match="mode"):
        SPGSurrogate(mode="x")
    with pytest.raises(ValueError, match="beta"):
        SPGSurrogate(beta=0.0)
    ids, attn, cm, source, adv = _batch()
    spg = SPGSurrogate(block_length=4, mask_id=9)
    with pytest.raises(ValueError, match="source"):
        spg(TinyLogits(), ids, attn, 2, cm, torch.tensor([0, 7, 1]), adv)
    with pytest.raises(ValueError, match="completion_mask"):
        spg(TinyLogits(), ids, attn, 3, cm, source, adv)


def _is_block_suffix(row: torch.Tensor, valid: torch.Tensor, bl: int) -> bool:
    """A block mask (p_mask_clean 0): clean before block k, some of block k, every later valid position."""
    pos = row.nonzero().flatten()
    if not len(pos):
        return False
    k = int(pos[0]) // bl
    blocks = torch.arange(row.shape[0]) // bl
    return bool(row[valid & (blocks > k)].all()) and not bool(row[blocks < k].any())


def test_external_rows_get_uniform_masks_and_on_policy_rows_block_masks():
    # independent of the code under test: over many seeds, on-policy rows' scored sets always have SPG's block
    # structure, external rows' often do not (a uniform subset); and each row's masks are the pure function's
    # from that row's own seed (so swapping the routing, or sharing one stream, fails)
    from lit_rl import rng
    from lit_rl.core.masks import spg_block_masks, uniform_random_masks

    L, bl = 12, 4
    cm = torch.arange(L)[None, :] < torch.tensor([12, 10, 12, 11])[:, None]
    source = torch.tensor([0, 0, 1, 1])
    spg = SPGSurrogate(num_t=2, block_length=bl, mask_id=9, p_mask_prompt=0.0, p_mask_clean=0.0)
    non_block_ext = 0
    for s in range(50):
        seeds = [1000 * s + i for i in range(4)]
        masks = spg.build_masks(cm, torch.ones(4, 3), source, seeds=seeds)
        for j in range(2):
            for b in (0, 1):
                assert _is_block_suffix(masks.loss[j, b], cm[b], bl)
            for b in (2, 3):
                assert masks.loss[j, b].any() and not (masks.loss[j, b] & ~cm[b]).any()
                non_block_ext += not _is_block_suffix(masks.loss[j, b], cm[b], bl)
        for b in range(4):
            g = rng.cpu_generator(seeds[b])
            if b < 2:
                want = spg_block_masks(cm[b : b + 1], bl, 2, g, p_mask_clean=0.0)
            else:
                want = uniform_random_masks(cm[b : b + 1], 2, g)
            assert (torch.equal(masks.loss[:, b], want.loss[:, 0])
                    and torch.equal(masks.completion[:, b], want.completion[:, 0]))
    assert non_block_ext > 50  # of 200 external draws; a uniform subset of 10-12 tokens is rarely a block suffix


def test_row_masks_do_not_depend_on_the_other_rows():
    ids, attn, cm, source, adv = _batch()
    spg = SPGSurrogate(num_t=2, block_length=4, mask_id=9)
    seeds = [11, 22, 33]
    full = spg.build_masks(cm, attn[:, :2], source, seeds=seeds)
    for b in range(3):
        one = spg.build_masks(cm[b : b + 1], attn[b : b + 1, :2], source[b : b + 1], seeds=seeds[b : b + 1])
        assert (torch.equal(one.completion[:, 0], full.completion[:, b])
                and torch.equal(one.prompt[:, 0], full.prompt[:, b]))


def test_length_weighting_is_eq10_with_the_sum_form_elbo_times_one_factor_per_batch():
    """Eq. 10 with App. A's sum-form ELBO S_i = L_i · s_i is (1/B) Σ A_i ∇S_i. By hand, A = [1, 1], L = [10, 100]:
    Eq. 10's gradient in s is [10/2, 100/2] = [5, 50]; the default (length) loss gives [10/110, 100/110], Eq. 10 ×
    2/110 for both rollouts; weighting "rollout" gives [1/2, 1/2]."""
    from lit_rl.core.spg import spg_loss

    A, L = torch.tensor([1.0, 1.0]), torch.tensor([10.0, 100.0])
    s = torch.tensor([-0.5, -0.7], requires_grad=True)
    eq10 = -(A * (L * s)).mean()  # the paper's estimator on the sum-form ELBO (B = 2)
    (g_eq10,) = torch.autograd.grad(eq10, s)
    (g_len,) = torch.autograd.grad(spg_loss(A, s, L)[0], s)
    (g_rollout,) = torch.autograd.grad(spg_loss(A, s, torch.ones(2))[0], s)
    assert torch.allclose(-g_eq10, torch.tensor([5.0, 50.0]))
    assert torch.allclose(-g_len, torch.tensor([10 / 110, 100 / 110]))
    assert torch.allclose(g_len, g_eq10 * 2 / 110)  # one factor, B / Σ L, for the whole batch
    assert torch.allclose(-g_rollout, torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("external_rule,block_choice,num_t,continuation",
                         [("count", "spg", 3, "whole"), ("bernoulli", "spg", 3, "tail"),
                          ("count", "uniform", 7, "tail")])  # 7 draws: more than the 5 blocks
def test_seeded_masks_drawn_together_are_bitwise_each_rows_own_draw_alone(external_rule, block_choice, num_t,
                                                                         continuation):
    """The rows of one kind draw through one RowStreams (one generator per row, the arithmetic batched): every
    row's masks equal the pure functions run on that row alone with a torch.Generator from its seed (the
    one-row-at-a-time path this replaced), with prompt and clean-token masking on, all four row kinds, mixed
    widths, continuation rows' kept prefixes and two rows sharing a seed."""
    from lit_rl import rng
    from lit_rl.core.masks import mask_prompt_tokens, spg_block_masks, uniform_random_masks

    B, L, P, bl = 24, 20, 5, 4
    g = torch.Generator().manual_seed(7)
    cm = torch.arange(L)[None, :] < torch.randint(1, L + 1, (B,), generator=g)[:, None]  # (B, L)
    pm = torch.arange(P)[None, :] >= torch.randint(0, 3, (B,), generator=g)[:, None]  # (B, P) left-padded
    source = torch.tensor([0, 1, 2, 3, 1, 0] * 4)  # on-policy, external, continuation, inpainted
    width = torch.tensor([20, 16, 12, 20, 20, 16] * 4)  # each row's own generation width
    kept = torch.where(source == 2, torch.randint(0, 8, (B,), generator=g), 0)  # (B,) continuation prefixes
    seeds = [rng.derive_seed(5, i) for i in range(B)]
    seeds[7] = seeds[1]  # two external rows with one seed draw the same numbers, each from its own stream
    spg = SPGSurrogate(num_t=num_t, block_length=bl, mask_id=9, p_mask_prompt=0.3, p_mask_clean=0.2,
                       external_rule=external_rule, block_choice=block_choice, continuation_masks=continuation)
    got = spg.build_masks(cm, pm, source, seeds=seeds, gen_width=width, kept_prefix=kept)
    decoded = rows_where(source, decoded=True)
    for b in range(B):
        gen = rng.cpu_generator(seeds[b])
        if decoded[b]:
            want = spg_block_masks(cm[b:b + 1], bl, num_t, gen, block_choice=block_choice, p_mask_clean=0.2,
                                   gen_width=int(width[b]))
        else:
            want = uniform_random_masks(cm[b:b + 1], num_t, gen, rule=external_rule)
        want = mask_prompt_tokens(want, pm[b:b + 1], 0.3, gen)
        comp, loss = want.completion[:, 0], want.loss[:, 0]
        if continuation == "tail":  # the kept prefix: clean context, not scored
            prefix = torch.arange(L) < kept[b]
            comp, loss = comp & ~prefix, loss & ~prefix
        assert torch.equal(got.completion[:, b], comp) and torch.equal(got.loss[:, b], loss), b
        assert torch.equal(got.prompt[:, b], want.prompt[:, 0]), b
    assert got.prompt.any() and got.loss.any()  # the draws were live


def test_a_users_block_choice_still_draws_with_a_torch_generator():
    """A user's callable (here an unhashable one: a dataclass instance) gets a torch.Generator, one row at a time."""
    import dataclasses

    calls = []

    @dataclasses.dataclass
    class FirstBlock:
        def __call__(self, valid_blocks, num_blocks, num_t, generator):
            calls.append(type(generator))
            return torch.zeros(num_t, valid_blocks.shape[0], dtype=torch.long)

    _, attn, cm, source, _ = _batch()
    spg = SPGSurrogate(num_t=2, block_length=4, mask_id=9, block_choice=FirstBlock())
    spg.build_masks(cm, attn[:, :2], source, seeds=[1, 2, 3])
    assert calls == [torch.Generator, torch.Generator]  # the two on-policy rows, one at a time
