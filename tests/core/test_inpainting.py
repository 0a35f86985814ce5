"""lit_rl.core.inpainting: IGPO's trigger, hint placement and entropy filter, against hand-computed values."""

from __future__ import annotations

import random

import pytest
import torch

from lit_rl.core.inpainting import hint_canvas, hint_chunks, keep_high_entropy_hints, triggered_groups

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


def test_a_group_fires_only_when_it_has_on_policy_rows_and_none_reaches_the_threshold():
    # groups: 0 all on-policy wrong (partial credit 0.75 < 1) -> fires; 1 has a correct on-policy row -> not;
    # 2 has only a correct EXTERNAL row besides wrong on-policy rows -> fires (the pool's row does not count);
    # 3 has no on-policy row -> not
    rewards = torch.tensor([0.75, 0.0, 1.0, 0.5, 0.25, 0.5, 1.0, 1.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])
    on = torch.tensor([T, T, T, T, T, T, F, F])
    assert triggered_groups(rewards, group, on, 1.0, 4).tolist() == [T, F, T, F]
    # a lower threshold counts 0.75 as correct
    assert triggered_groups(rewards, group, on, 0.75, 4).tolist() == [F, F, T, F]


def test_chunks_are_consecutive_from_the_start_and_a_short_remainder_is_dropped():
    class Fixed(random.Random):  # sizes 3, 2, 3, then 3 again but only 1 token is left (< chunk_min 2): dropped
        def __init__(self, sizes):
            super().__init__(0)
            self.sizes = iter(sizes)

        def randint(self, a, b):
            return next(self.sizes)

    assert hint_chunks(9, 2, 3, Fixed([3, 2, 3, 3])) == [(0, 3), (3, 5), (5, 8)]
    # the last chunk is cut to what is left when that is at least chunk_min
    assert hint_chunks(7, 2, 4, Fixed([4, 4])) == [(0, 4), (4, 7)]
    assert hint_chunks(1, 2, 3, Fixed([])) == []
    sizes = [b - a for a, b in hint_chunks(200, 5, 10, random.Random(1))]
    assert min(sizes) >= 5 and max(sizes) <= 10 and sum(sizes) >= 200 - 4
    with pytest.raises(ValueError, match="chunk_min"):
        hint_chunks(9, 3, 2, random.Random(0))


def test_the_canvas_shows_the_drawn_chunks_at_their_own_positions_and_always_the_last():
    trace = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    chunks = [(0, 2), (2, 4), (4, 6), (6, 9)]  # n = 4

    class Pick(random.Random):
        def sample(self, population, k):
            assert list(population) == [0, 1, 2] and k == 2  # int(4 * (1 - 0.4)) = 2 hidden, never the last
            return [0, 2]

    M = 99
    canvas, hint = hint_canvas(trace, chunks, 0.4, 12, M, Pick(0))
    assert canvas.tolist() == [M, M, 12, 13, M, M, 16, 17, 18, M, M, M]
    assert hint.tolist() == [F, F, T, T, F, F, T, T, T, F, F, F]
    # over random draws the last chunk is always shown and the hidden count is int(n (1 - shown))
    for seed in range(20):
        c, h = hint_canvas(trace, chunks, 0.2, 12, M, random.Random(seed))
        assert h[6:9].all() and int(h.sum()) == 9 - sum(b - a for k, (a, b) in enumerate(chunks) if not h[a])
        assert sum(not h[a] for a, _ in chunks) == int(4 * (1 - 0.2))
        assert (c[h] == torch.tensor(trace)[h[:9]]).all() and (c[~h] == M).all()
    # no chunks: all masked; a chunk past the width is not placed
    c, h = hint_canvas(trace, [], 0.5, 5, M, random.Random(0))
    assert (c == M).all() and not h.any()
    c, h = hint_canvas(trace, [(0, 2), (2, 9)], 1.0, 5, M, random.Random(0))
    assert h.tolist() == [T, T, F, F, F]
