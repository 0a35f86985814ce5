"""``python -m lit_rl reproduce``: the double-rollout study's plan, the report's arithmetic, and the whole study
in quick mode through the real command (the job runner's own tests are in test_runner.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_rl.config.lines import compose_files
from lit_rl.reproduce import dr

ROOT = Path(__file__).resolve().parents[2]


def test_plan_gives_every_job_its_own_folder_store_and_checkpoints(tmp_path, parse_training_config):
    plan = dr.plan(tmp_path, seeds=[0, 1], quick=False, workers=2, threads=1, cache_dir=str(tmp_path / "c"))
    names = [j.name for j in plan.jobs]
    assert names == ["dr_s0", "grpo_s0", "grpo_large_s0", "dr_s1", "grpo_s1", "grpo_large_s1",
                     "sweep-rho-w0", "sweep-rho-w1", "sweep-n-w0", "sweep-n-w1",
                     "grpo_verbose_s0", "dr_verbose_s0", "grpo_az_verbose_s0", "dr_bonus_verbose_s0"]
    assert plan.first_alone and plan.boost_first  # no cached warm start in the cache folder yet
    fits = [j for j in plan.jobs if j.argv[0] == "fit"]
    assert len({j.folder for j in fits}) == len(fits)
    for job in fits:  # the overlay edits the warm start's cache (the list is the configs'), the root is the job's
        last = [a for a in job.argv if a.endswith(".yaml")][-1]
        (warm,) = yaml.safe_load(Path(last).read_text())["trainer"]["callbacks~"]
        assert warm == {"class_path": "callbacks.ar_warmup.ScriptedSFTWarmup",
                        "init_args": {"cache_dir": str(tmp_path / "c")}}
        assert f"--trainer.default_root_dir={job.folder}" in job.argv
        assert f"--trainer.logger.init_args.tracking_uri=sqlite:///{(tmp_path / 'mlflow.db').resolve()}" in job.argv
    seeds = {j.name: [a for a in j.argv if a.startswith(("--seed_everything", "--data.init_args.seed",
                                                          "--model.init_args.seed"))] for j in fits}
    # as shipped
    assert seeds["dr_s0"] == ["--seed_everything=0", "--data.init_args.seed=42", "--model.init_args.seed=0"]
    assert seeds["dr_s1"] == ["--seed_everything=1", "--data.init_args.seed=43", "--model.init_args.seed=1"]
    grpo_az = next(j for j in fits if j.name == "grpo_az_verbose_s0")
    assert "conf/grpo_chainsum.yaml" in grpo_az.argv
    cfg = parse_training_config.argv(grpo_az.argv[1:])  # the verbose overlay, then the penalty on top of it
    assert cfg.model.init_args.double_rollout.length_penalty == 0.2 and not cfg.model.init_args.double_rollout.enabled
    data = cfg.data.init_args
    assert data.generation.max_new_tokens == 64 and data.eval_generation.max_new_tokens == 64
    (warm,) = [c for c in cfg.trainer.callbacks if c.class_path.endswith("ScriptedSFTWarmup")]
    assert (warm.init_args.trace, warm.init_args.max_completion_len, warm.init_args.cache_dir) == (
        "verbose", 64, str(tmp_path / "c"))
    (passk,) = [c for c in cfg.trainer.callbacks if c.class_path.endswith("PassAtKEvaluation")]
    assert passk.init_args.configs[0]["generation"]["init_args"]["max_new_tokens"] == 64
    bonus = parse_training_config.argv(next(j for j in fits if j.name == "dr_bonus_verbose_s0").argv[1:])
    assert bonus.model.init_args.double_rollout.length_bonus == 1.0 and bonus.model.init_args.double_rollout.enabled
    (sweep_file,) = (tmp_path / "sweeps/rho").glob("sweep_*.yaml")
    sweep = yaml.safe_load(sweep_file.read_text())
    assert sweep["space"]["model.init_args.double_rollout.rho"]["choices"] == [0.5, 0.75, 0.99]
    assert sweep["objective"]["metric"] == dr.METRIC
    assert sweep["base"][:2] == ["conf/double_rollout.yaml", "conf/double_rollout_chainsum.yaml"]
    assert sweep["overrides"] == {"seed_everything": 0, "threads": 1}
    (warm,) = yaml.safe_load(Path(sweep["base"][2]).read_text())["trainer"]["callbacks~"]  # the warm start, a file
    assert warm["init_args"] == {"cache_dir": str(tmp_path / "c")} and len(sweep["base"]) == 3
    assert {j.tags["group"] for j in plan.jobs if j.argv[0] == "sweep"} == {"rho", "n"}  # --only selects them


def test_quick_plan_sizes_every_job_for_a_test(tmp_path, parse_training_config):
    """--quick: the plan's quick overlay on every job, a job's own quick overlay after it (GRPO-large's G, the verbose
    runs' 64-token Pass@k at 2 samples), the first value of each sweep and the last two length runs."""
    plan = dr.plan(tmp_path, seeds=[0], quick=True, workers=2, threads=1)
    assert [j.name for j in plan.jobs] == ["dr_s0", "grpo_s0", "grpo_large_s0", "sweep-rho-w0", "sweep-n-w0",
                                           "grpo_az_verbose_s0", "dr_bonus_verbose_s0"]
    jobs = {j.name: j for j in plan.jobs}
    large = parse_training_config.argv(jobs["grpo_large_s0"].argv[1:])
    assert (large.data.init_args.num_generations, large.trainer.max_steps) == (8, 4)
    dr_cfg = parse_training_config.argv(jobs["dr_s0"].argv[1:])
    assert dr_cfg.data.init_args.num_generations == 4 and dr_cfg.model.init_args.double_rollout.num_continuations == 2
    bonus = parse_training_config.argv(jobs["dr_bonus_verbose_s0"].argv[1:])
    (passk,) = [c for c in bonus.trainer.callbacks if c.class_path.endswith("PassAtKEvaluation")]
    assert passk.init_args.configs[0]["num_samples"] == 2 and passk.init_args.subset_size == 8
    assert passk.init_args.configs[0]["generation"]["init_args"]["max_new_tokens"] == 64
    (warm,) = [c for c in bonus.trainer.callbacks if c.class_path.endswith("ScriptedSFTWarmup")]
    assert (warm.init_args.steps, warm.init_args.trace) == (20, "verbose")
    (sweep_file,) = (tmp_path / "sweeps/n").glob("sweep_*.yaml")
    sweep = yaml.safe_load(sweep_file.read_text())
    assert sweep["space"]["model.init_args.double_rollout.num_continuations"]["choices"] == [2]
    assert sweep["base"][2] == "conf/reproduce/double_rollout_quick.yaml"  # the plan's quick overlay file, as it is


def test_guess_plan_runs_every_trend_value_with_every_seed_on_the_guess_overlay(tmp_path, parse_training_config):
    plan = dr.plan(tmp_path, seeds=[0, 1], quick=False, workers=2, threads=1,
                   cache_dir=str(tmp_path / "c"), testbed="guess")
    names = [j.name for j in plan.jobs]
    assert plan.first_alone and plan.jobs[0].tags["testbed"] == "guess"
    assert names[:6] == ["dr_s0", "grpo_s0", "grpo_large_s0", "dr_s1", "grpo_s1", "grpo_large_s1"]
    trends = {(j.tags["group"], j.tags.get("rho") or j.tags.get("n"), j.tags["seed"]) for j in plan.jobs[6:-4]}
    assert trends == {(g, v, s) for g, vs in (("rho", ("0.25", "0.5", "0.75", "0.99")), ("n", ("2", "8")))
                      for v in vs for s in ("0", "1")}
    assert len(names) == 6 + 6 * 2 + 2 * 2 and all(j.argv[0] == "fit" for j in plan.jobs)  # no sweeps or length runs
    assert names[-4:] == ["dr_nemo_s0", "grpo_nemo_s0", "dr_nemo_s1", "grpo_nemo_s1"]
    by = {j.name: j for j in plan.jobs}
    nemo = parse_training_config.argv(by["grpo_nemo_s1"].argv[1:]).model.init_args.loss
    assert (nemo.scale_std, nemo.leave_one_out, nemo.std_of, nemo.std_eps) == (True, True, "baseline", 1e-6)
    assert "conf/grpo_chainsum.yaml" in by["grpo_nemo_s1"].argv and "conf/grpo_chainsum.yaml" not in by[
        "dr_nemo_s0"].argv
    assert parse_training_config.argv(by["dr_rho0.25_s1"].argv[1:]).model.init_args.double_rollout.rho == 0.25
    n8 = parse_training_config.argv(by["dr_n8_s0"].argv[1:])
    assert n8.model.init_args.double_rollout.num_continuations == 8 and n8.model.init_args.double_rollout.rho == 0.9
    configs = [a for a in by["grpo_large_s1"].argv if a.startswith("conf/")]
    assert configs == ["conf/double_rollout.yaml", "conf/double_rollout_chainsum.yaml",
                       "conf/double_rollout_guess.yaml",
                       "conf/grpo_large_chainsum.yaml"]
    composed = compose_files([a for a in by["dr_s0"].argv if a.endswith(".yaml")]).data  # as fit composes them
    warm = next(c for c in composed["trainer"]["callbacks"] if c["class_path"].endswith("ScriptedSFTWarmup"))
    assert warm["init_args"]["trace"] == "guessing" and warm["init_args"]["cache_dir"] == str(tmp_path / "c")
    with pytest.raises(ValueError, match="unknown double-rollout testbed 'nope'"):
        dr.plan(tmp_path, seeds=[0], quick=False, workers=1, threads=1, testbed="nope")


@pytest.mark.slow
def test_quick_study_runs_end_to_end_through_the_command(tmp_path):
    """Every job of the plan (3 methods, 2 sweeps, 2 length runs) for a few steps, then the report."""
    out = tmp_path / "dr"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run(
        [sys.executable, "-m", "lit_rl", "reproduce", "double-rollout", "--quick", "--out", str(out), "--workers", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failed"] == [] and set(summary["main"]) == {"dr", "grpo", "grpo_large"}
    report = (out / "report.md").read_text()
    for section in ("DR vs GRPO vs GRPO-large", "Reliability of the continuations", "ρ and N", "Accuracy vs tokens"):
        assert section in report
    for fig in ("curves.png", "trends.png", "pareto.png"):
        assert (out / fig).stat().st_size > 1000
    data = json.loads((out / "summary.json").read_text())
    assert [v for v, _ in data["trends"]["rho"]] == [0.5, 0.9]  # the sweep's trial + the main DR run
    assert [v for v, _ in data["trends"]["n"]] == [1, 2, 4]  # GRPO, the sweep's trial, the main DR run
    assert {p["run"] for p in data["pareto"]} == {"warm start", "dr_bonus_verbose_s0", "grpo_az_verbose_s0"}
    assert any(r["by"] == "all" and r["n"] > 0 for r in data["reliability"])
    # a second call finds every job done and only rewrites the report
    again = subprocess.run(
        [sys.executable, "-m", "lit_rl", "reproduce", "double-rollout", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert again.returncode == 0 and again.stdout.count("skipped") == 7
