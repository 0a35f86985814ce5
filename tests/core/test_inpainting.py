"""lit_rl.core.inpainting: IGPO's entropy filter over hint positions, against hand-computed masks."""

from __future__ import annotations

import pytest
import torch

from lit_rl.core.inpainting import keep_high_entropy_hints

T, F = True, False


def test_keeps_the_top_share_of_scored_hints_by_entropy_and_leaves_the_rest_alone():
    loss = torch.tensor([[T, T, T, T, T, T, T, F],
                         [T, T, T, T, F, F, F, F],
                         [T, T, T, T, T, T, T, T]])
    hint = torch.tensor([[F, T, T, T, T, T, F, T],   # 5 scored hints (position 7 is not scored)
                         [F, F, F, F, F, F, F, F],   # no hints: unchanged
                         [T, T, T, T, T, T, T, T]])  # 8 hints
    ent = torch.tensor([[9.0, 0.1, 0.9, 0.5, 0.3, 0.7, 9.0, 5.0],
                        [0.0] * 8,
                        [0.8, 0.1, 0.6, 0.2, 0.9, 0.3, 0.5, 0.4]])
    out = keep_high_entropy_hints(loss, hint, ent, 0.4)
    # row 0: floor(0.4 * 5) = 2 kept: entropies 0.9 (pos 2) and 0.7 (pos 5); pos 7's 5.0 is not a candidate
    #        (unscored), non-hint positions 0 and 6 stay whatever their entropy
    assert out[0].tolist() == [T, F, T, F, F, T, T, F]
    assert out[1].tolist() == loss[1].tolist()
    # row 2: floor(0.4 * 8) = 3 kept: 0.9 (pos 4), 0.8 (pos 0), 0.6 (pos 2)
    assert out[2].tolist() == [T, F, T, F, T, F, F, F]


def test_at_least_one_hint_stays_and_floor_not_round():
    loss = torch.ones(2, 4, dtype=torch.bool)
    hint = torch.tensor([[T, T, F, F], [T, T, T, T]])
    ent = torch.tensor([[0.2, 0.7, 0.0, 0.0], [0.1, 0.4, 0.3, 0.2]])
    out = keep_high_entropy_hints(loss, hint, ent, 0.2)
    # row 0: floor(0.2 * 2) = 0 -> at least 1: pos 1; row 1: floor(0.2 * 4) = 0 -> 1 (round would also give 1)
    assert out.tolist() == [[F, T, T, T], [F, T, F, F]]
    out = keep_high_entropy_hints(loss, hint, ent, 0.6)
    # row 1: floor(0.6 * 4) = 2 (round(2.4) = 2, ceil would give 3): 0.4 (pos 1) and 0.3 (pos 2)
    assert out[1].tolist() == [F, T, T, F]


def test_ties_keep_the_earlier_position_and_ratio_one_keeps_every_hint():
    loss = torch.ones(1, 4, dtype=torch.bool)
    hint = torch.tensor([[T, T, T, F]])
    ent = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    assert keep_high_entropy_hints(loss, hint, ent, 0.5).tolist() == [[T, F, F, T]]
    assert keep_high_entropy_hints(loss, hint, ent, 1.0).tolist() == [[T, T, T, T]]
    with pytest.raises(ValueError, match="keep_ratio"):
        keep_high_entropy_hints(loss, hint, ent, 0.0)
