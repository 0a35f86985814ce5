"""DecodeStats from both decoders (lit_rl/generation/diffusion.py, cached.py): forward passes per rollout and
the revealed tokens' confidence, by hand on a stub denoiser, and the decode itself unchanged by counting."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rl.generation.cached import cached_diffusion_generate
from lit_rl.generation.diffusion import DecodeStats, diffusion_generate
from lit_rl.models import TinyDiffusionLM

MASK, V = 3, 4


def fixed_logits(ids, mask):
    """Every position: logits [0, 0, log 3, 0], so token 2 is chosen with softmax 3 / (3 + 1 + 1 + 1) = 0.5."""
    out = torch.zeros(*ids.shape, V)
    out[..., 2] = math.log(3.0)
    return out


def _prompts(B=2, P=3):
    return torch.full((B, P), 1), torch.ones(B, P, dtype=torch.long)


@pytest.mark.parametrize("decoder", ["exact", "cached_none", "threshold"])
def test_passes_and_confidence_by_hand(decoder):
    ids, mask = _prompts()
    stats = DecodeStats()
    common = dict(gen_length=8, block_length=4, steps=4, temperature=0.0, mask_id=MASK, stats=stats)
    if decoder == "exact":
        out = diffusion_generate(fixed_logits, ids, mask, **common)
    else:
        out = cached_diffusion_generate(ids, mask, model_fn=fixed_logits, cache="none",
                                        threshold=0.4 if decoder == "threshold" else None, **common)
    assert (out[:, 3:] == 2).all()
    assert stats.rows == 2 and stats.revealed == 2 * 8
    assert stats.confidence_mean() == pytest.approx(0.5)
    # the fixed schedule: 2 blocks x 2 steps each; a threshold of 0.4 < 0.5 reveals a whole block per pass
    assert stats.passes_per_row() == (2 if decoder == "threshold" else 4)


def test_counting_does_not_change_the_decode():
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    ids = torch.randint(5, 40, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    fn = lambda i, m: policy(i, m)  # noqa: E731
    kw = dict(gen_length=8, block_length=4, steps=8, temperature=1.0, mask_id=policy.mask_id)
    a = diffusion_generate(fn, ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    stats = DecodeStats()
    b = diffusion_generate(fn, ids, mask, generator=torch.Generator().manual_seed(1), stats=stats, **kw)
    assert torch.equal(a, b) and stats.passes_per_row() == 8 and 0 < stats.confidence_mean() <= 1
    assert math.isnan(DecodeStats().confidence_mean())
