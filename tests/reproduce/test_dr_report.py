"""lit_rl/reproduce/dr_report.py: the double-rollout report's choice of attempts and its token arithmetic."""

from __future__ import annotations

from lit_rl.report import RunData
from lit_rl.reproduce.dr_report import cumulative_tokens, latest_finished


def _run(name, status, tags, history):
    return RunData(run_id=name, name=name, label=name, status=status, tags=tags, params={}, final={}, history=history)


def test_report_keeps_the_last_finished_attempt_and_sums_both_stages():
    runs = [
        _run("a", "FINISHED", {"lit_rl.job": "dr_s0"}, {}),
        _run("b", "FINISHED", {"lit_rl.job": "dr_s0"}, {}),
        _run("c", "FAILED", {"lit_rl.job": "dr_s0"}, {}),  # a later crashed attempt does not replace b
    ]
    assert latest_finished(runs, "lit_rl.job")["dr_s0"].run_id == "b"
    # per-problem tokens per rollout batch x 4 prompts: (10 + 30) * 4, then + (20 + 0) * 4
    r = _run("x", "FINISHED", {}, {"train/cost/tokens_stage1": [(0, 10.0), (1, 20.0)],
                                   "train/cost/tokens_stage2": [(0, 30.0)]})
    assert cumulative_tokens(r, prompts_per_batch=4) == [(0, 160.0), (1, 240.0)]
