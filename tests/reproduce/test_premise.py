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
