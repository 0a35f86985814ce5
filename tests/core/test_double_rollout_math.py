"""Hand-computed tests for lit_rl.core.double_rollout (DR §2)."""

import math
from fractions import Fraction

import pytest
import torch

from lit_rl.core.advantages import group_centered
from lit_rl.core.double_rollout import (
    continuation_budget,
    cut_index,
    length_bonus,
    length_penalty_az,
    one_sided_replacement,
    pass_rate_filter,
    revised_rewards,
    split_thinking,
    split_thinking_text,
)

THINK_END = [98, 99]  # a two-token delimiter, like "</reasoning>" split by a BPE tokenizer


# ----------------------------------------------------------------------------- split_thinking
class TestSplitThinking:
    def test_delimiter_found(self):
        # trace = [10, 11, 12]; delimiter starts at index 3
        assert split_thinking([10, 11, 12, 98, 99, 13], THINK_END) == 3

    def test_first_occurrence_wins(self):
        assert split_thinking([98, 99, 1, 98, 99], THINK_END) == 0
        assert split_thinking([1, 98, 2, 98, 99], THINK_END) == 3  # a lone 98 is not the delimiter

    def test_single_token_delimiter(self):
        assert split_thinking([1, 2, 151668, 5], [151668]) == 2

    def test_missing_rules(self):
        ids = [1, 2, 3, 98]  # only a partial delimiter at the end
        assert split_thinking(ids, THINK_END) == 4  # default "whole": the whole completion is the trace
        assert split_thinking(ids, THINK_END, missing="whole") == 4
        assert split_thinking(ids, THINK_END, missing="skip") is None
        assert split_thinking([], THINK_END) == 0
        with pytest.raises(ValueError):
            split_thinking(ids, THINK_END, missing="drop")
        with pytest.raises(ValueError):
            split_thinking(ids, [])

    def test_text_variant(self):
        assert split_thinking_text("abc</think>xyz") == 3
        # earliest of several delimiters
        assert split_thinking_text("ab</reasoning>c</think>", ("</think>", "</reasoning>")) == 2
        assert split_thinking_text("no end", "</think>") == 6
        assert split_thinking_text("no end", "</think>", missing="skip") is None


# ----------------------------------------------------------------------------- cut / budget
class TestCutAndBudget:
    @pytest.mark.parametrize(
        "T, rho, expected",
        [
            (10, 0.9, 9),  # floor(9.0)
            (7, 0.5, 3),  # floor(3.5) = 3 (floor, not round)
            (100, 0.29, 29),  # 0.29 * 100 = 28.999999999999996 in floats; still 29
            (1, 0.9, 0),  # floor(0.9) = 0: prefix is the prompt alone (no 1-token minimum)
            (0, 0.9, 0),
            (5, 1.0, 5),
            (1000, 0.99, 990),
        ],
    )
    def test_cut_index(self, T, rho, expected):
        assert cut_index(T, rho) == expected

    @pytest.mark.parametrize("rho", [0.0, -0.1, 1.5])
    def test_rho_range(self, rho):
        with pytest.raises(ValueError):
            cut_index(10, rho)

    @pytest.mark.parametrize(
        "T, rho, buffer, expected",
        [
            (10, 0.9, 1024, 1025),  # ceil(0.1 * 10) = 1, + 1024
            (7, 0.5, 0, 4),  # ceil(3.5) = 4
            (100, 0.29, 0, 71),  # ceil(71) = 71
            (1000, 0.9, 1024, 1124),  # 100 + 1024 (paper's math setting)
            (3, 1.0, 4096, 4096),  # rho = 1: only the buffer (code setting)
        ],
    )
    def test_continuation_budget(self, T, rho, buffer, expected):
        assert continuation_budget(T, rho, buffer) == expected

    def test_budget_is_ceil_of_remainder_exactly(self):
        # exact rational check of floor(rho T) and ceil((1 - rho) T) over a grid of rho = p/100
        for p in range(1, 101):
            rho = p / 100
            for T in (0, 1, 7, 33, 100, 999, 4096):
                assert cut_index(T, rho) == math.floor(Fraction(p, 100) * T)
                assert continuation_budget(T, rho, 5) == math.ceil((1 - Fraction(p, 100)) * T) + 5


# ----------------------------------------------------------------------------- rewards
def test_revised_rewards_mean_and_skip():
    q = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    # means: [3/4, 0, 1]
    torch.testing.assert_close(revised_rewards(q), torch.tensor([0.75, 0.0, 1.0]))
    # row 1 had no delimiter under missing="skip": keeps its original reward 1.0
    out = revised_rewards(q, original=torch.tensor([0.0, 1.0, 0.0]),
                          has_continuations=torch.tensor([True, False, True]))
    torch.testing.assert_close(out, torch.tensor([0.75, 1.0, 1.0]))
    # bool correctness works too
    torch.testing.assert_close(revised_rewards(q.bool()), torch.tensor([0.75, 0.0, 1.0]))


# ----------------------------------------------------------------------------- replacement
class TestOneSidedReplacement:
    # row 0: A > 0, own wrong, correct continuations at 1 and 2 -> replaced
    # row 1: A > 0, own correct                                  -> -1
    # row 2: A < 0, own wrong, a correct continuation             -> -1 (never the other way round)
    # row 3: A > 0, own wrong, no correct continuation            -> -1
    # row 4: A = 0 (not > 0)                                      -> -1
    adv = torch.tensor([0.5, 0.5, -0.5, 0.5, 0.0])
    own = torch.tensor([False, True, False, False, False])
    cont = torch.tensor(
        [[False, True, True], [True, True, True], [True, False, False], [False, False, False], [True, True, True]]
    )

    def test_first(self):
        assert one_sided_replacement(self.adv, self.own, self.cont).tolist() == [1, -1, -1, -1, -1]

    def test_shortest(self):
        lengths = torch.tensor([[3, 9, 7], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
        # row 0 correct candidates: j=1 (9 tokens), j=2 (7 tokens) -> 2 (the wrong j=0 is shorter but ignored)
        out = one_sided_replacement(self.adv, self.own, self.cont, "shortest", lengths)
        assert out.tolist() == [2, -1, -1, -1, -1]
        # tie 7 vs 7 -> lowest index 1
        lengths[0] = torch.tensor([3, 7, 7])
        assert one_sided_replacement(self.adv, self.own, self.cont, "shortest", lengths)[0] == 1
        with pytest.raises(ValueError):
            one_sided_replacement(self.adv, self.own, self.cont, "shortest")

    def test_random_picks_only_correct_and_is_seeded(self):
        seen = set()
        for seed in range(40):
            g = torch.Generator().manual_seed(seed)
            out = one_sided_replacement(self.adv, self.own, self.cont, "random", generator=g)
            assert out[1:].tolist() == [-1, -1, -1, -1]
            seen.add(int(out[0]))
        assert seen == {1, 2}
        a = one_sided_replacement(self.adv, self.own, self.cont, "random", generator=torch.Generator().manual_seed(3))
        b = one_sided_replacement(self.adv, self.own, self.cont, "random", generator=torch.Generator().manual_seed(3))
        assert torch.equal(a, b)

    def test_bad_rule(self):
        with pytest.raises(ValueError):
            one_sided_replacement(self.adv, self.own, self.cont, "best")


# ----------------------------------------------------------------------------- length bonus
class TestLengthBonus:
    def test_population_std(self):
        # S = rows {0, 1, 2} (A > 0); lengths 10, 20, 30: mean 20, population std sqrt(200/3) = 8.165
        # z = [-1.2247, 0, 1.2247] -> bonus = max(0, -z) = [1.2247, 0, 0]; row 3 (A < 0, shortest) untouched
        revised = torch.tensor([1.0, 1.0, 1.0, 0.0])
        adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
        lengths = torch.tensor([10, 20, 30, 5])
        out = length_bonus(revised, adv, lengths, torch.zeros(4, dtype=torch.long), lam=1.0, eps=0.0)
        z0 = 10 / math.sqrt(200 / 3)
        torch.testing.assert_close(out, torch.tensor([1.0 + z0, 1.0, 1.0, 0.0]))

    def test_sample_std_and_lambda(self):
        # sample std sqrt(200/2) = 10 -> z0 = -1 -> lam 3 adds 3
        revised = torch.tensor([1.0, 1.0, 1.0, 0.0])
        adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
        lengths = torch.tensor([10.0, 20.0, 30.0, 5.0])
        out = length_bonus(revised, adv, lengths, torch.zeros(4, dtype=torch.long), lam=3.0, eps=0.0, unbiased_std=True)
        torch.testing.assert_close(out, torch.tensor([4.0, 1.0, 1.0, 0.0]))

    def test_groups_independent_and_small_s(self):
        # group 5: S = {0, 1}, lengths [10, 20]: mean 15, population std 5 -> z = [-1, 1] -> bonus [2, 0] (lam 2)
        # group 9: S = {2} only (|S| = 1) -> no bonus, even though row 3 is much longer
        revised = torch.tensor([0.5, 0.5, 0.75, 0.25])
        adv = torch.tensor([0.1, 0.1, 0.2, -0.2])
        lengths = torch.tensor([10, 20, 3, 100])
        group = torch.tensor([5, 5, 9, 9])
        out = length_bonus(revised, adv, lengths, group, lam=2.0, eps=0.0)
        torch.testing.assert_close(out, torch.tensor([2.5, 0.5, 0.75, 0.25]))

    def test_no_positive_or_zero_lambda_is_identity(self):
        r = torch.tensor([0.2, 0.4])
        g = torch.zeros(2, dtype=torch.long)
        assert torch.equal(length_bonus(r, torch.tensor([-1.0, 0.0]), torch.tensor([1, 9]), g, lam=3.0), r)
        assert torch.equal(length_bonus(r, torch.tensor([1.0, 1.0]), torch.tensor([1, 9]), g, lam=0.0), r)


# ----------------------------------------------------------------------------- data profiling
def test_pass_rate_filter():
    # drop 0% and 100%
    assert pass_rate_filter(torch.tensor([0.0, 0.25, 1.0, 0.5])).tolist() == [False, True, False, True]
    # (P, n) correctness: rates [1, 0.5, 0]
    assert pass_rate_filter(torch.tensor([[1, 1], [0, 1], [0, 0]])).tolist() == [False, True, False]
    # custom band keeps 0.25 < p < 0.75
    assert pass_rate_filter(torch.tensor([0.25, 0.5, 0.75]), low=0.25, high=0.75).tolist() == [False, True, False]


# ----------------------------------------------------------------------------- the pieces together
def test_double_rollout_step_by_hand():
    """One group of G = 3 rollouts, N = 2 continuations, composed the way DR §2 describes.

    original rewards r = [1, 0, 0] (rollout 0 guessed right; rollout 1's trace was on track)
    continuation rewards q = [[0, 0], [1, 1], [0, 1]] -> r̂ = [0, 1, 0.5]
    advantages (mean 0.5) = [-0.5, 0.5, 0]
    replacement: rollout 1 has A > 0, own answer wrong, continuation 0 correct -> 0; rollout 0 is correct
    but A < 0 -> stays (punished for guessing); rollout 2 has A = 0 -> stays
    """
    group = torch.zeros(3, dtype=torch.long)
    own_correct = torch.tensor([True, False, False])
    q = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    r_hat = revised_rewards(q)
    torch.testing.assert_close(r_hat, torch.tensor([0.0, 1.0, 0.5]))
    adv = group_centered(r_hat, group)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5, 0.0]))
    assert one_sided_replacement(adv, own_correct, q > 0).tolist() == [-1, 0, -1]
    # length bonus with |S| = 1 changes nothing: added after the baseline (the default) or recomputed, A is the same
    out = length_bonus(r_hat, adv, torch.tensor([50, 40, 60]), group, lam=3.0)
    torch.testing.assert_close(group_centered(r_hat, group, bonus=out - r_hat), adv)
    torch.testing.assert_close(group_centered(out, group), adv)


class TestLengthPenaltyAZ:
    def test_hand_computed_group(self):
        # correct lengths 10, 20, 30: mean 20, population std sqrt(200/3) = 8.165; z = -1.2247, 0, +1.2247
        r = torch.tensor([1.0, 1.0, 1.0, 0.0])
        c = torch.tensor([True, True, True, False])
        out = length_penalty_az(r, c, torch.tensor([10, 20, 30, 5]), torch.zeros(4, dtype=torch.long),
                                alpha=0.2, eps=0.0)
        sig = 1 / (1 + math.exp(1.224744871))  # sigmoid(-1.2247) = 0.22704
        expected = torch.tensor([1 - 0.2 * sig, 1 - 0.2 * 0.5, 1 - 0.2 * (1 - sig), 0.0])  # 0.95459, 0.9, 0.84541, 0
        assert torch.allclose(out, expected, atol=1e-6)
        # shorter correct > longer correct > wrong (the short wrong one gains nothing)
        assert out[0] > out[1] > out[2] > out[3]

    def test_groups_are_separate_and_single_correct_is_constant(self):
        r = torch.tensor([1.0, 0.0, 1.0, 1.0])
        c = r > 0
        g = torch.tensor([0, 0, 1, 1])
        out = length_penalty_az(r, c, torch.tensor([7, 3, 4, 40]), g, alpha=0.4, eps=0.0)
        assert out[0] == pytest.approx(0.8)  # |C| = 1: z = 0, penalty alpha/2
        assert out[1] == 0.0
        assert out[2] == pytest.approx(1 - 0.4 * (1 / (1 + math.e)))  # z = -1 in group 1
        assert out[3] == pytest.approx(1 - 0.4 * (1 / (1 + math.exp(-1))))

    def test_off_and_bad_alpha(self):
        r = torch.tensor([1.0, 0.0])
        assert torch.equal(length_penalty_az(r, r > 0, torch.tensor([3, 9]), torch.zeros(2, dtype=torch.long), 0.0), r)
        with pytest.raises(ValueError, match="alpha"):
            length_penalty_az(r, r > 0, torch.tensor([3, 9]), torch.zeros(2, dtype=torch.long), 1.0)
