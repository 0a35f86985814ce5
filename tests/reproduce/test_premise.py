"""Double rollout's premise measurements (lit_rl/reproduce/premise.py, scripts/dr_premise.py): the four cases
counted by hand, and both measurements on a real tiny causal LM through the script."""

from __future__ import annotations

import json

import torch

from lit_rl.models.ar import TinyCausalLM
from lit_rl.reproduce.premise import count_cases, describe
from lit_rl.tasks import ChainSumTask
from support.scripts import load_script


SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 1, "intermediate_size": 64, "max_positions": 256}


def test_count_cases_by_hand():
    task = ChainSumTask(num_train=1, num_eval=1, answer_mod=2)
    e = task.example_from_record("Sum: 3 5 2 4 mod 2", 0)  # trace 3+5=8 8+2=10 10+4=14, answer 0
    texts = [
        "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>0</answer>",  # right trace, right answer
        "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>1</answer>",  # slip
        "<reasoning>3+5=8</reasoning>\n<answer>0</answer>",  # inconclusive trace, lucky guess
        "<reasoning>3+5=9 9+2=11 11+4=15</reasoning>\n<answer>1</answer>",  # wrong trace, wrong answer
        "<reasoning>3+5=8 8+2=10 10+4=16</reasoning>\n<answer>0</answer>",  # wrong last step, lucky parity
        "no format at all",
    ]
    r = count_cases(texts, [e], samples=6)
    assert r["counts"] == {"trace_ok_answer_ok": 1, "trace_ok_answer_wrong": 1, "trace_wrong_answer_ok": 2,
                           "trace_wrong_answer_wrong": 2}
    assert r["rewarded"] == 3 and r["accuracy"] == 0.5 and r["lucky_share_of_rewarded"] == 2 / 3
    assert r["slip_share_of_all"] == 1 / 6 and r["slip_share_of_unrewarded"] == 1 / 3
    assert r["trace_accuracy"] == 2 / 6 and r["supported_accuracy"] == 1 / 6
    assert (r["lucky_inconclusive"], r["lucky_complete_wrong"]) == (1, 1)
    md = describe({"premise": r, "problems": 1, "samples_per_problem": 6})
    assert "| lucky guesses: rewarded with a wrong trace | 2 of 3 rewarded | 66.7% |" in md


def test_script_measures_a_real_policy_with_the_study_both_ways(tmp_path, capsys):
    policy = TinyCausalLM(**SMALL)
    path = tmp_path / "warm.pt"
    torch.save(policy.model.state_dict(), path)
    script = load_script("scripts", "dr_premise")
    args = [str(path), "--policy", json.dumps(SMALL), "--task", '{"answer_mod": 2, "min_terms": 3, "max_terms": 4}',
            "--problems", "6", "--samples", "2", "--reliability", "--difficulty-samples", "3", "--rollouts", "2",
            "--continuations", "2", "--min-count", "1"]
    assert script.main(args) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])[str(path)]
    p = result["premise"]
    assert p["samples"] == 12 and sum(p["counts"].values()) == 12
    assert result["study"]["rollouts"] == 12  # 6 problems x 2 rollouts
    for mode in ("no_budget", "budget"):
        table = result["reliability"][mode]
        assert sum(c["n"] for c in table) == 12  # every rollout in exactly one cell
        assert all(c["cont_acc"] is None or 0.0 <= c["cont_acc"] <= 1.0 for c in table)
    assert "no continuation budget" in out and "the training budget ceil((1-ρ)·T) + 16" in out


class _ScriptedBackend:
    """Known completions and continuations (lit_rl's ARBackend interface): ``generate`` cycles through
    ``completions``; ``continue_from`` answers each prefix with the continuation texts registered for it."""

    def __init__(self, policy, completions: list[str], continuations: dict[tuple[int, ...], list[str]]):
        self.policy, self.completions, self.continuations = policy, completions, continuations
        self.budgets: list[list[int]] = []

    def _ids(self, texts: list[str], width: int) -> torch.Tensor:
        tok, eos = self.policy.tokenizer, self.policy.eos_id
        rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
        return torch.tensor([(r + [eos] * width)[:width] for r in rows])

    def generate(self, ids, mask, *, max_new_tokens, temperature, n, seed):
        texts = [self.completions[k % len(self.completions)] for k in range(ids.shape[0] * n)]
        return self._ids(texts, max_new_tokens)

    def continue_from(self, prefixes, n, max_new_tokens, *, temperature, seed):
        self.budgets.append(list(max_new_tokens))
        texts = [c for p in prefixes for c in self.continuations[tuple(p)][:n]]
        return self._ids(texts, 48)


def test_reliability_scores_kept_prefix_plus_continuation_and_respects_the_budget():
    from lit_rl.reproduce.premise import by_answer_and_trace, reliability

    policy = TinyCausalLM(**SMALL)
    task = ChainSumTask(num_train=1, num_eval=1, answer_mod=2)
    ex = task.example_from_record("Sum: 3 5 2 4 mod 2", 0)
    right = "<reasoning>3+5=8 8+2=10 10+4=14</reasoning>\n<answer>0</answer>"
    lucky = "<reasoning>3+5=8</reasoning>\n<answer>0</answer>"
    tok = lambda t: policy.tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = policy.encode_prompts([task.messages(ex)], 32)[0][0].tolist()
    # the cut: floor(0.9 T) of the tokens before </reasoning> (<reasoning> is one token): T 21 -> 18 kept, 6 -> 5
    kept = {text: tok(text)[: int(0.9 * tok(text).index(tok("</reasoning>")[0]))] for text in (right, lucky)}
    rest = {text: policy.tokenizer.decode(tok(text)[len(kept[text]):]) for text in (right, lucky)}
    assert rest[right] == "=14</reasoning>\n<answer>0</answer>" and rest[lucky] == "8</reasoning>\n<answer>0</answer>"
    conts = {
        # after the right trace: one continuation answers right, one wrong -> 0.5
        tuple(prompt + kept[right]): [rest[right], "=14</reasoning>\n<answer>1</answer>"],
        # after the inconclusive one: the finished trace and the right parity (counts only with the kept
        # "<reasoning>3+5=" before it), then 30 tokens of restatements without an answer, which run past the
        # training budget (6 - 5 + 16 = 17 tokens) but not the 43 left without it
        tuple(prompt + kept[lucky]): ["8 8+2=10 10+4=14</reasoning>\n<answer>0</answer>", " =8" * 10],
    }
    backend = _ScriptedBackend(policy, [right, lucky], conts)
    rows = reliability(policy, task, [ex], K=2, G=2, N=2, rho=0.9, buffer=16, seed=0, backend=backend)
    assert backend.budgets == [[48 - 18, 48 - 5], [21 - 18 + 16, 6 - 5 + 16]]
    nb, b = rows["no_budget"], rows["budget"]
    assert nb["correct"].tolist() == [True, True] and nb["trace_ok"].tolist() == [True, False]
    assert nb["pass_rate"].tolist() == [1.0, 1.0]  # both difficulty samples are rewarded
    assert nb["cont_acc"].tolist() == [0.5, 0.5] and nb["hit_limit"].tolist() == [0.0, 0.0]
    # with the budget, finishing the inconclusive trace (21 tokens) does not fit in 17 either: both hit the limit
    assert b["cont_acc"].tolist() == [0.5, 0.0] and b["hit_limit"].tolist() == [0.0, 1.0]
    cells = {(c["answer_ok"], c["trace_ok"]): (c["n"], c["cont_acc"]) for c in by_answer_and_trace(nb)}
    assert cells == {(True, True): (1, 0.5), (True, False): (1, 0.5), (False, True): (0, None),
                     (False, False): (0, None)}
