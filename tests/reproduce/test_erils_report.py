"""lit_rl/reproduce/erils_report.py: the report of ``python -m lit_rl reproduce erils``, its arithmetic on a real
MLflow store (the plan and the whole study in quick mode through the real command: test_erils.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rl.reproduce import erils


def _store(tmp_path: Path, runs: dict[str, tuple[dict[str, str], dict[str, list[tuple[int, float]]]]]) -> Path:
    """A real MLflow SQLite store with the given runs (tags, metric histories), as the study writes it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment(erils.study_plan().experiment)
    for name, (tags, history) in runs.items():
        run = client.create_run(exp, run_name=name, tags={"lit_rl.reproduce": "erils", "lit_rl.job": name, **tags})
        for key, points in history.items():
            for step, value in points:
                client.log_metric(run.info.run_id, key, value, step=step)
        client.set_terminated(run.info.run_id, "FINISHED")
    return tmp_path


def test_report_tables_from_a_real_mlflow_store(tmp_path):
    from lit_rl.reproduce.erils_report import build

    acc = "val/sudoku/greedy/accuracy"
    main = {"group": "main", "threads": "1"}

    def curve(*values):
        return {acc: list(zip((0, 14, 29), values))}

    _store(tmp_path, {
        "erils_s0": ({**main, "method": "erils", "seed": "0"},
                     {**curve(0.25, 0.6, 0.9), "train/on_policy/reward_mean": [(i, 0.2 + 0.1 * i) for i in range(7)],
                      "train/on_policy/length_mean": [(i, 38.0) for i in range(7)],
                      "val/sudoku/multi/pass_at_4": [(480, 0.95)]}),
        "erils_s1": ({**main, "method": "erils", "seed": "1"}, curve(0.25, 0.5, 0.8)),
        "spg_s0": ({**main, "method": "spg", "seed": "0"}, curve(0.25, 0.1, 0.0)),
        "spg_s1": ({**main, "method": "spg", "seed": "1"}, curve(0.25, 0.2, 0.1)),
        "erils_s0_t2": ({"group": "threads", "threads": "2", "method": "erils", "seed": "0"}, curve(0.25, 0.6, 0.85)),
        "erils_uncontrolled_s0": ({"group": "length", "threads": "1", "method": "erils", "seed": "0"},
                                  {**curve(0.25, 0.1, 0.05),
                                   "train/on_policy/hit_limit_frac": [(i, 1.0) for i in range(7)]}),
        "external_only_uncontrolled_s0": ({"group": "length", "threads": "1", "method": "external_only", "seed": "0"},
                                          curve(0.25, 0.05, 0.0)),
        "sft_capacity_s0": ({"group": "capacity", "method": "sft", "seed": "0"},
                            {acc: [(0, 0.25), (149, 0.7), (299, 0.97)]}),
    })
    summary = build(tmp_path, seeds=[0, 1], times={"erils_s0": 300.0, "erils_s1": 320.0})
    e, s = summary["main"]["erils"], summary["main"]["spg"]
    assert e["final"]["mean"] == pytest.approx(0.85) and e["final"]["min"] == 0.8 and e["runs"] == 2
    assert e["start"]["mean"] == 0.25 and e["pass_at_4"]["mean"] == 0.95
    # the last 3 evaluations per run: (0.25 + 0.6 + 0.9) / 3 and (0.25 + 0.5 + 0.8) / 3, then their mean
    assert e["last3"]["mean"] == pytest.approx(0.55) and e["last3"]["n"] == 2
    # on-policy reward: mean of the first 5 batches (0.2..0.6 -> 0.4) and of the last 5 (0.4..0.8 -> 0.6)
    assert (e["on_policy_reward_first"]["mean"] == pytest.approx(0.4)
            and e["on_policy_reward_last"]["mean"] == pytest.approx(0.6))
    assert s["final"]["mean"] == pytest.approx(0.05) and s["erils_minus_this"] == pytest.approx(0.8)
    assert e["seconds"]["mean"] == 310.0
    assert summary["threads_identical"] == {"erils_s0_t2": False}  # its curve ends at 0.85, seed 0's at 0.9
    assert "The thread count changed the run" in (tmp_path / "report.md").read_text()
    # 0.9, 0.8, 0.85
    assert summary["erils_spread"]["n"] == 3 and summary["erils_spread"]["mean"] == pytest.approx(0.85)
    lc = summary["length_control"]
    assert lc["erils: uncontrolled (grid_verbose, 69 tokens)"]["final"]["mean"] == 0.05
    assert lc["erils: uncontrolled (grid_verbose, 69 tokens)"]["hit_limit"]["mean"] == 1.0
    assert lc["erils: length-controlled (grid, 37 tokens)"]["final"]["mean"] == 0.9  # the first seed's ERILS run
    assert lc["external_only: uncontrolled (grid_verbose, 69 tokens)"]["final"]["mean"] == 0.0
    assert "external_only: length-controlled (grid, 37 tokens)" not in lc  # no external-only run on that pool here
    assert summary["capacity"]["final"] == 0.97 and "sft" not in summary["main"]  # not a main-comparison row
    report = (tmp_path / "report.md").read_text()
    assert "updates 150: 0.700, 300: 0.970 (start 0.250)" in report
    assert "**0.850** ± 0.071" in report and "0.400 → 0.600" in report
    for fig in ("curves.png", "diagnostics.png"):
        assert (tmp_path / fig).stat().st_size > 1000
    curves = json.loads((tmp_path / "curves.json").read_text())  # the figures' data, per job
    assert curves["erils_s0"][acc] == [[0, 0.25], [14, 0.6], [29, 0.9]]
    assert curves["erils_s0"]["train/on_policy/reward_mean"][-1] == [6, pytest.approx(0.8)]
    assert set(curves) == {"erils_s0", "erils_s1", "spg_s0", "spg_s1", "erils_s0_t2", "erils_uncontrolled_s0",
                           "external_only_uncontrolled_s0", "sft_capacity_s0"}


def _lengths_report(folder: Path, accuracies: dict[int, float]) -> None:
    """A three-length evaluation file as PassAtKEvaluation(name="lengths") writes it in a validate run."""
    (folder / "eval").mkdir(parents=True, exist_ok=True)
    configs = {f"det{n}": {"final": {"step": 300, "metrics": {"pass@1": a, "accuracy": a, "length_mean": 38.0,
                                                               "hit_limit_frac": 0.0}},
                           "settings": {"gen_length": n, "steps": n // 2, "temperature": 0.0}}
               for n, a in accuracies.items()}
    (folder / "eval/passk_lengths_validate_report.json").write_text(json.dumps({"configs": configs}))


@pytest.mark.parametrize("final,fmt,start,reading", [
    (0.9, 1.0, 0.25, "learns"),
    (0.0, 0.0, 0.25, "collapses"),  # format lost, accuracy 0: below chance
    (0.3, 1.0, 0.25, "stays low"),  # near chance
    (0.01, 0.98, 0.25, "collapses"),  # repeated <answer> tags: "formatted", yet below chance
    (0.36, 1.0, 0.25, "learns"),
    (0.12, 1.0, 0.25, "degrades"),  # fell, but not to the collapse
    (None, None, None, "-"),
])
def test_failure_reading_tells_collapse_from_staying_low(final, fmt, start, reading):
    from lit_rl.reproduce.erils_report import _failure_reading

    assert _failure_reading(final, fmt, start) == reading


def test_report_has_the_learning_rate_and_three_length_tables(tmp_path):
    from lit_rl.reproduce.erils_report import build

    acc, fmt = "val/sudoku/greedy/accuracy", "train/on_policy/format_rate"

    def run(group, method, values, formats, lr=None):
        tags = {"group": group, "method": method, "seed": "0", "threads": "1", **({"lr": lr} if lr else {})}
        return tags, {acc: list(zip((0, 149, 299), values)), fmt: list(zip((3, 151, 299), formats))}

    _store(tmp_path, {
        "erils_s0": run("main", "erils", (0.25, 0.8, 0.92), (0.9, 1.0, 1.0)),
        "spg_s0": run("main", "spg", (0.25, 0.1, 0.0), (0.9, 0.2, 0.0)),
        "spg_lr0.0001_s0": run("spg_lr", "spg", (0.25, 0.26, 0.27), (0.9, 1.0, 1.0), "0.0001"),
        "erils_lr0.0001_s0": run("spg_lr", "erils", (0.25, 0.5, 0.7), (0.9, 1.0, 1.0), "0.0001"),
    })
    _lengths_report(tmp_path / "runs/erils_s0", {48: 0.92, 96: 0.91, 192: 0.85})
    _lengths_report(tmp_path / "runs/spg_lr0.0001_s0", {48: 0.27, 96: 0.27, 192: 0.26})
    summary = build(tmp_path, [0], {})
    lr = summary["spg_lr"]
    assert {k: v["reading"] for k, v in lr.items()} == {"spg@0.001": "collapses", "spg@0.0001": "stays low",
                                                         "erils@0.001": "learns", "erils@0.0001": "learns"}
    assert lr["spg@0.0001"]["best"] == 0.27
    assert lr["spg@0.001"]["format_rate"]["mean"] == pytest.approx(1.1 / 3)  # the last 5 points: all 3
    report = (tmp_path / "report.md").read_text()
    table = report.split("## SPG's failure mode")[1].split("##")[0]
    rows = [line for line in table.splitlines() if line.startswith("| SPG") or line.startswith("| ERILS")]
    assert [r.split(" | ")[1] for r in rows] == ["0.001", "0.0001", "0.001", "0.0001"]  # SPG first, lr falling
    assert set(summary["lengths"]) == {"ERILS (source-specific, Eq. 9)", "SPG (on-policy only), lr 0.0001"}
    assert summary["lengths"]["ERILS (source-specific, Eq. 9)"][192]["mean"] == 0.85
    assert "| ERILS (source-specific, Eq. 9) | 1 | 0.920 | 0.910 | 0.850 |" in report


def test_a_report_of_other_groups_only_says_the_main_comparison_has_not_run(tmp_path):
    from lit_rl.reproduce.erils_report import build

    acc = "val/sudoku/greedy/accuracy"
    _store(tmp_path, {"spg_lr0.0001_s0": ({"group": "spg_lr", "method": "spg", "seed": "0", "lr": "0.0001"},
                                          {acc: [(0, 0.25), (299, 0.26)]})})
    summary = build(tmp_path, [0], {})
    report = (tmp_path / "report.md").read_text()
    assert summary["main"] == {} and "No main-comparison run has finished here" in report
    assert "| method | start |" not in report and summary["spg_lr"]["spg@0.0001"]["reading"] == "stays low"


def test_expression_chance_by_hand():
    from lit_rl.reproduce.erils_report import expression_chance

    # 1, 1, 1 -> 3 only as 1+1+1: 2 bracketings x 6 orders = 12 of 192 rows; target 100: none
    assert expression_chance([((1, 1, 1), 3)]) == pytest.approx(12 / 192)
    assert expression_chance([((1, 1, 1), 3), ((1, 1, 1), 100)]) == pytest.approx(6 / 192)


def test_countdown_report_reads_only_its_tasks_runs(tmp_path):
    from lit_rl.reproduce.erils_report import build, countdown_chance

    acc = "val/countdown/greedy/accuracy"
    main = {"group": "main", "threads": "1", "task": "countdown"}
    _store(tmp_path, {
        "erils_s0": ({**main, "method": "erils", "seed": "0"},
                     {acc: [(0, 0.02), (299, 0.30)], "val/countdown/multi/pass_at_4": [(300, 0.5)]}),
        "spg_s0": ({**main, "method": "spg", "seed": "0"}, {acc: [(0, 0.02), (299, 0.05)]}),
        "joint_s0": ({"group": "main", "threads": "1", "task": "sudoku", "method": "joint", "seed": "0"},
                     {"val/sudoku/greedy/accuracy": [(0, 0.25), (299, 0.9)]}),  # another task's run, same store
    })
    summary = build(tmp_path, seeds=[0], times={}, task="countdown")
    assert set(summary["main"]) == {"erils", "spg"} and summary["metric"] == acc
    assert summary["main"]["erils"]["final"]["mean"] == 0.30 and summary["main"]["erils"]["pass_at_4"]["mean"] == 0.5
    assert summary["main"]["spg"]["erils_minus_this"] == pytest.approx(0.25)
    assert 0 < summary["chance"] == countdown_chance() < 0.25
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# ERILS on miniature Countdown") and "256 generated test problems" in report
