"""The guess testbed's report parts (lit_rl/reproduce/dr_guess.py): steps to GRPO's best and the trends by hand,
and the premise section on a real warm-start file named by a job log."""

from __future__ import annotations

import torch

from lit_rl.models.ar import TinyCausalLM
from lit_rl.report import RunData, mlflow_name
from lit_rl.reproduce import dr_guess
from lit_rl.reproduce.premise import TESTBED_POLICY

METRIC = "val/chainsum/sampled/accuracy"


def _run(name: str, values: list[float]) -> RunData:
    hist = {mlflow_name(METRIC): [(4 * i, v) for i, v in enumerate(values)]}
    return RunData(run_id=name, name=name, label=name, status="FINISHED", tags={}, params={}, final={}, history=hist)


def test_steps_to_reach_grpos_best_by_hand():
    curves = {"grpo": [(0, [0.5, 0.6]), (4, [0.7, 0.8]), (8, [0.9, 0.7])],
              "dr": [(0, [0.5, 0.5]), (4, [0.8, 0.9]), (8, [0.9, 0.9])],
              "slow": [(0, [0.1, 0.1]), (4, [0.2, 0.9])]}
    target = 0.8  # GRPO's best mean: (0.9 + 0.7) / 2 at update 8; at 4 it is 0.75
    got = dr_guess.steps_to_reach(curves, target)
    assert got["grpo"] == {"mean_curve": 8, "per_seed": [8, 4]}
    assert got["dr"] == {"mean_curve": 4, "per_seed": [4, 4]}
    assert got["slow"] == {"mean_curve": None, "per_seed": [None, 4]}


def test_trend_rows_take_every_seed_and_the_main_jobs():
    jobs = {"dr_rho0.5_s0": _run("a", [0.5, 0.7]), "dr_rho0.5_s1": _run("b", [0.5, 0.9]),
            "dr_s0": _run("c", [0.5, 0.6]), "dr_s1": _run("d", [0.5, 0.8]), "dr_rho0.25_s0": _run("e", [0.4])}
    rows = dr_guess.trend_rows(jobs, METRIC, "rho", [0.25, 0.5], [0, 1], {0.9: "dr"})
    assert [(r["value"], r["finals"]) for r in rows] == [(0.25, [0.4]), (0.5, [0.7, 0.9]), (0.9, [0.6, 0.8])]
    assert abs(rows[1]["mean"] - 0.8) < 1e-12 and abs(rows[1]["std"] - 0.1414213562) < 1e-9
    assert rows[0]["std"] == 0.0 and rows[2]["job"] == "dr"
    md = "\n".join(dr_guess.trend_markdown("ρ", rows, "note"))
    assert "| final accuracy (mean ± std) | 0.400 ± 0.000 | 0.800 ± 0.141 | 0.700 ± 0.141 |" in md
    assert "| per seed | 0.400 | 0.700 / 0.900 | 0.600 / 0.800 |" in md


def test_premise_section_measures_the_warm_start_a_job_log_names_and_caches_it(tmp_path):
    warm = tmp_path / "cache" / "ar_sft_chainsum_x.pt"
    warm.parent.mkdir()
    torch.save(TinyCausalLM(**TESTBED_POLICY).model.state_dict(), warm)
    (tmp_path / "runs" / "grpo_s0").mkdir(parents=True)
    (tmp_path / "runs" / "grpo_s0" / "log.txt").write_text(f"AR SFT warm-up: loaded cached weights {warm}\n")
    assert dr_guess.warm_start_of([tmp_path / "runs" / "dr_s0", tmp_path / "runs" / "grpo_s0"]) == warm
    summary: dict = {}
    md = "\n".join(dr_guess.premise_section(tmp_path, {"dr_s0": None, "grpo_s0": None}, True, summary))
    assert "32 samples at T 1 (8 held-out problems x 4)" in md and "lucky guesses" in md
    assert summary["premise"]["study"]["rollouts"] == 16 and (tmp_path / "premise.json").is_file()
    before = (tmp_path / "premise.json").read_text()
    dr_guess.premise_section(tmp_path, {"grpo_s0": None}, True, {})  # cached: the file is not rewritten
    assert (tmp_path / "premise.json").read_text() == before
    assert dr_guess.premise_section(tmp_path / "none", {}, True, {})[-2] == "(no job log names its warm start yet)"


def test_progress_sections_report_steps_tokens_and_own_best(tmp_path):
    curves = {"grpo": [(0, [0.5, 0.5]), (4, [0.7, 0.8]), (8, [0.9, 0.7])],
              "dr": [(0, [0.5, 0.5]), (4, [0.8, 0.9]), (8, [0.7, 0.7])]}
    summary: dict = {}
    md = "\n".join(dr_guess.progress_sections(tmp_path, {}, curves, [0, 1], True, summary,
                                              tokens_at=lambda m, step: 1000.0 * step * (2 if m == "dr" else 1)))
    # target 0.8 (GRPO at update 8); DR's mean 0.85 at update 4, 8k tokens (2k per update); DR's own best 0.85 at 4
    assert "| dr | update 4 | 8k | 0.850 | 4 | s0: 4, s1: 4 |" in md
    assert "| grpo | update 8 | 8k | 0.800 | 8 | s0: 8, s1: 4 |" in md
    # start 0.5: 50% of the way = 0.65, 75% = 0.725, 90% = 0.77
    assert "| dr | update 4 | update 4 | update 4 |" in md and "| grpo | update 4 | update 4 | update 8 |" in md
    assert summary["steps_to_grpo_best"]["dr"]["own_best_step"] == 4
