"""``python -m lit_rl reproduce erils``: the plan (every job a valid `fit` command line, seeds, the thread and
length-control runs) and the whole study in quick mode through the real command (the report's arithmetic on a
real MLflow store: test_erils_report.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_rl.reproduce import erils

ROOT = Path(__file__).resolve().parents[2]


def test_plan_covers_every_variant_the_thread_spread_and_the_uncontrolled_pool(tmp_path, parse_training_config):
    plan = erils.plan(tmp_path, seeds=[0, 1], quick=False, workers=2, threads=1, cache_dir=str(tmp_path / "c"))
    names = [j.name for j in plan.jobs]
    assert names == ["erils_s0", "spg_s0", "joint_s0", "external_only_s0", "sft_s0",
                     "erils_s1", "spg_s1", "joint_s1", "external_only_s1", "sft_s1",
                     "erils_s0_t2", "external_only_uncontrolled_s0", "erils_uncontrolled_s0", "sft_capacity_s0",
                     "spg_lr0.0003_s0", "erils_lr0.0003_s0", "spg_lr0.0001_s0", "erils_lr0.0001_s0"]
    jobs = {j.name: j for j in plan.jobs}
    # SPG's failure mode: the same settings as the main runs but the learning rate, first seed
    lr_job = jobs["spg_lr0.0001_s0"]
    lr_cfg = parse_training_config.argv(lr_job.argv[1:])
    assert lr_cfg.model.init_args.optimizer.init_args.lr == 1e-4 and "conf/spg.yaml" in lr_job.argv
    assert lr_cfg.model.init_args.advantages.class_path.endswith("OnPolicyOnly")
    assert lr_job.tags["group"] == "spg_lr" and lr_job.tags["lr"] == "0.0001" and "--seed_everything=0" in lr_job.argv
    # Table XI's protocol: one validate job per final checkpoint of the main and learning-rate runs, none for the
    # thread / pool / capacity runs; it reads the fit's saved config and last checkpoint
    evals = {j.name: j for j in plan.eval_jobs}
    assert set(evals) == {f"{j.name}_lengths" for j in plan.jobs if j.tags["group"] in ("main", "spg_lr")}
    ev = evals["erils_s1_lengths"]
    assert ev.argv == ["validate", "--config", str(tmp_path / "runs/erils_s1/config.yaml"),
                       "--config", erils.LENGTHS_EVAL,
                       f"--ckpt_path={tmp_path / 'runs/erils_s1/checkpoints/last.ckpt'}"]
    assert ev.folder == tmp_path / "runs/erils_s1/erils_s1_lengths" and ev.tags["group"] == "lengths"
    assert ev.tags["evaluates"] == "erils_s1" and ev.tags["lit_rl.job"] == "erils_s1_lengths"
    # a fit run again with another command line makes its evaluation's done.json stale
    fit, before = jobs["erils_s1"], ev.digest
    fit.argv = [*fit.argv, "--trainer.max_steps=8"]
    assert ev.argv == [*ev.argv] and ev.digest != before
    # the base learning rate the report labels the main runs with is the study recipe's (the committed runs')
    recipe = yaml.safe_load((ROOT / "conf/erils_study_recipe.yaml").read_text())
    study = erils.study_plan()
    assert recipe["model"]["init_args"]["optimizer"]["init_args"]["lr"] == study.report["base_lr"]
    assert study.stems("main") == ["erils", "spg", "joint", "external_only", "sft"]
    assert plan.first_alone and not plan.boost_first  # the thread count is part of the result: never raised
    assert "--threads=2" in jobs["erils_s0_t2"].argv and jobs["erils_s0_t2"].tags["threads"] == "2"
    assert "--threads=1" in jobs["erils_s0"].argv and jobs["erils_s0"].tags["threads"] == "1"
    assert "conf/spg.yaml" in jobs["spg_s1"].argv and "conf/erils_sft.yaml" in jobs["sft_s0"].argv
    seeds = [a for a in jobs["joint_s1"].argv
             if a.startswith(("--seed_everything", "--data.init_args.seed", "--model.init_args.seed"))]
    assert seeds == ["--seed_everything=1", "--data.init_args.seed=43", "--model.init_args.seed=1"]
    advantages = {"erils_s0": "SourceSpecific", "spg_s0": "OnPolicyOnly", "joint_s0": "Joint",
                  "external_only_s0": "ExternalOnly"}
    for job in plan.jobs:  # every command line is one the real CLI parser accepts, with its own folders
        cfg = parse_training_config.argv(job.argv[1:])
        assert cfg.trainer.default_root_dir == str(job.folder)
        ckpt = [c for c in cfg.trainer.callbacks if c.class_path.endswith("ModelCheckpoint")]
        assert ckpt[0].init_args.dirpath is None  # <default_root_dir>/checkpoints: the job's own folder
        # the job's last overlay edits the warm-up's cache; the list itself is the configs'
        files = [a for a in job.argv if a.endswith(".yaml")]
        assert files[-1].startswith(str(job.folder / "warm_start_"))
        assert yaml.safe_load(Path(files[-1]).read_text()) == {"trainer": {"callbacks~": [
            {"class_path": "callbacks.FormatWarmup", "init_args": {"cache_dir": str(tmp_path / "c")}}]}}
        warm = [c for c in cfg.trainer.callbacks if c.class_path.endswith("FormatWarmup")]
        assert warm[0].init_args.cache_dir == str(tmp_path / "c") and warm[0].init_args.steps == 250
        assert cfg.model.init_args.optimizer.init_args.lr == float(job.tags.get("lr", 1e-3))
        if job.name in advantages:
            assert cfg.model.init_args.advantages.class_path.endswith(advantages[job.name])
    sft = parse_training_config.argv(jobs["sft_s0"].argv[1:])
    assert sft.model.class_path.endswith("DenoisingSFT") and sft.data.init_args.g_on == 0
    cap = parse_training_config.argv(jobs["sft_capacity_s0"].argv[1:])  # 1 row per prompt, 1 update per batch
    assert (cap.data.init_args.g_ext, cap.model.init_args.updates_per_batch, cap.trainer.max_steps) == (1, 1, 900)
    assert cap.trainer.val_check_interval == 150
    for name in ("erils_uncontrolled_s0", "external_only_uncontrolled_s0"):  # Fig. 4 trains external-only on each pool
        unc = parse_training_config.argv(jobs[name].argv[1:])
        assert unc.data.init_args.pool_path == "data/pools/sudoku_grid_verbose.jsonl.gz"
    main = parse_training_config.argv(jobs["erils_s0"].argv[1:])
    assert main.data.init_args.pool_path == "data/pools/sudoku_grid.jsonl.gz"
    spg = parse_training_config.argv(jobs["spg_s0"].argv[1:])  # the paper's SPG: the whole group on-policy
    assert (spg.data.init_args.g_on, spg.data.init_args.g_ext) == (4, 0)


def test_quick_plan_runs_erils_sft_and_the_uncontrolled_pool_at_a_few_steps(tmp_path, parse_training_config):
    """--quick: the jobs marked quick, each with the plan's quick overlay after its own and before the cache."""
    plan = erils.plan(tmp_path, seeds=[0], quick=True, workers=2, threads=1)
    assert [j.name for j in plan.jobs] == ["erils_s0", "sft_s0", "erils_uncontrolled_s0"]
    assert [j.name for j in plan.eval_jobs] == ["erils_s0_lengths", "sft_s0_lengths"]
    cfg = parse_training_config.argv({j.name: j for j in plan.jobs}["erils_uncontrolled_s0"].argv[1:])
    assert (cfg.trainer.max_steps, cfg.data.init_args.prompts_per_batch) == (8, 2)
    assert cfg.data.init_args.pool_path.endswith("sudoku_grid_verbose.jsonl.gz")  # its own overlay kept
    (warm,) = [c for c in cfg.trainer.callbacks if c.class_path.endswith("FormatWarmup")]
    assert (warm.init_args.steps, warm.init_args.cache_dir) == (5, str(tmp_path / "cache"))  # two edits of one entry
    (passk,) = [c for c in cfg.trainer.callbacks if c.class_path.endswith("PassAtKEvaluation")]
    assert passk.init_args.subset_size == 8 and passk.init_args.configs[0]["num_samples"] == 2
    quick_file = plan.eval_jobs[0].argv[-2]
    assert quick_file.startswith(str(tmp_path / "lengths_quick_")) and quick_file == plan.eval_jobs[1].argv[-2]
    quick_eval = yaml.safe_load(Path(quick_file).read_text())
    assert quick_eval["trainer"]["callbacks~"][0]["init_args"] == {"name": "lengths", "subset_size": 8,
                                                                   "batch_size": 8}


@pytest.mark.slow
def test_quick_study_runs_end_to_end_through_the_command(tmp_path):
    """The quick plan (ERILS, SFT, the uncontrolled pool) for a few steps, then the report; a re-run skips."""
    out = tmp_path / "erils"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    cmd = [sys.executable, "-m", "lit_rl", "reproduce", "erils", "--quick", "--out", str(out), "--workers", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failed"] == [] and set(summary["main"]) == {"erils", "sft"}
    report = (out / "report.md").read_text()
    for section in ("Equal budget", "Spread of ERILS", "Length-controlled vs uncontrolled",
                    "Table XI's protocol: three generation lengths"):
        assert section in report
    # the text says it is a smoke run, not the study's budget, and claims nothing about the thread count
    assert "not `conf/erils.yaml` + `conf/erils_study_recipe.yaml`'s budget" in report
    assert "changed the run" not in report
    import re

    starts = re.findall(r"\[reproduce\] start \S+ \((\d+)/(\d+)\)", proc.stdout)  # one count over the study
    assert [int(k) for k, _ in starts] == list(range(1, len(starts) + 1))
    assert {int(n) for _, n in starts} == {len(starts)}
    data = json.loads((out / "summary.json").read_text())
    assert set(data["length_control"]) == {"erils: length-controlled (grid, 37 tokens)",
                                           "erils: uncontrolled (grid_verbose, 69 tokens)"}
    # the uncontrolled run trained on whole 69-token external rows: the datamodule widened them past L_gen 48
    cfg = yaml.safe_load(next((out / "runs/erils_uncontrolled_s0").rglob("config.yaml")).read_text())
    assert cfg["data"]["init_args"]["pool_path"] == "data/pools/sudoku_grid_verbose.jsonl.gz"
    from lit_rl.report import load_runs

    runs = {r.name: r for r in load_runs(f"sqlite:///{out / 'mlflow.db'}", experiments=["lit_rl-reproduce-erils"])}
    unc = runs["erils_uncontrolled_s0"]
    assert {v for _, v in unc.series("train/external/cut_frac")} == {0.0}
    assert {v for _, v in unc.series("train/external/length_mean")} == {70.0}  # 69 tokens + EOS, every row
    assert {v for _, v in runs["erils_s0"].series("train/external/length_mean")} == {38.0}  # 37 + EOS
    # every main run's final checkpoint was decoded at the three lengths, after its fit
    assert set(data["lengths"]) == {"ERILS (source-specific, Eq. 9)", "SFT on the external rollouts"}
    for by_length in data["lengths"].values():
        assert sorted(map(int, by_length)) == [48, 96, 192]
        assert all(0 <= v["mean"] <= 1 and v["n"] == 1 for v in by_length.values())
    assert (out / "runs/erils_s0/eval/passk_lengths_validate_report.json").exists()
    assert (out / "runs/erils_s0/erils_s0_lengths/done.json").exists()
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 5


def test_only_names_an_unknown_group(tmp_path, capsys):
    from lit_rl.reproduce import main

    with pytest.raises(SystemExit) as e:
        main(["erils", "--only", "nope", "--out", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--only: no job group 'nope' in the erils plan" in err and "spg_lr" in err and "lengths" in err


def test_countdown_plan_puts_the_task_overlay_under_each_methods_own(tmp_path, parse_training_config):
    plan = erils.plan(tmp_path, seeds=[0, 1], quick=False, workers=2, threads=1, cache_dir=str(tmp_path / "c"),
                      task="countdown")
    jobs = {j.name: j for j in plan.jobs}
    assert list(jobs) == ["erils_s0", "spg_s0", "joint_s0", "external_only_s0", "sft_s0",
                          "erils_s1", "spg_s1", "joint_s1", "external_only_s1", "sft_s1",
                          "erils_s0_t2", "sft_capacity_s0"]  # no Sudoku-only groups (pools, learning rates, lengths)
    assert plan.eval_jobs == [] and all(j.tags["task"] == "countdown" for j in plan.jobs)
    assert jobs["spg_s1"].argv[1:7] == ["--config", "conf/erils.yaml", "--config", "conf/erils_countdown.yaml",
                                        "--config", "conf/spg.yaml"]
    pool = "data/pools/countdown_ordered.jsonl.gz"
    for name, job in jobs.items():
        cfg = parse_training_config.argv(job.argv[1:])
        assert cfg.data.init_args.task.class_path.endswith("CountdownTask"), name
        assert cfg.data.init_args.generation.gen_length == 64, name
        warm = [c for c in cfg.trainer.callbacks if c.class_path.endswith("FormatWarmup")]
        assert warm[0].init_args.trace == "trials" and warm[0].init_args.steps == 1000, name
        assert warm[0].init_args.cache_dir == str(tmp_path / "c"), name
        if name.startswith("spg"):  # on-policy only, in the order ERILS sees the Countdown pool's prompts
            assert cfg.data.init_args.pool_path is None and cfg.data.init_args.prompt_order_pool == pool
        else:
            assert cfg.data.init_args.pool_path == pool, name
        # equal budget: the SFT overlay swaps the module's class and keeps the optimizer and updates per batch
        m, d = cfg.model.init_args, cfg.data.init_args
        budget = (m.optimizer.init_args.lr, m.updates_per_batch, cfg.trainer.max_steps, d.prompts_per_batch)
        assert budget == ((1e-3, 1, 900, 32) if name.startswith("sft_capacity") else (1e-3, 4, 300, 32)), name
        groups = {"erils": (2, 2), "joint": (2, 2), "spg": (4, 0), "external_only": (0, 2), "sft": (0, 2),
                  "sft_capacity": (0, 1)}  # (g_on, g_ext): ERILS's rollouts per prompt, split as each method does
        assert (d.g_on, d.g_ext) == groups[name.rsplit("_s", 1)[0]], name
    # the Sudoku plan is unchanged by the task option
    assert erils.plan(tmp_path / "s", seeds=[0], quick=False, workers=1, threads=1).jobs[1].argv[1:7] == [
        "--config", "conf/erils.yaml", "--config", "conf/erils_study_recipe.yaml", "--config", "conf/spg.yaml"]


def test_task_belongs_to_the_erils_study_and_countdown_has_no_sudoku_groups(tmp_path, capsys):
    from lit_rl.reproduce import main

    with pytest.raises(SystemExit) as e:
        main(["double-rollout", "--task", "countdown", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--task countdown: only the erils study has tasks" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["erils", "--task", "countdown", "--only", "spg_lr", "--out", str(tmp_path)])
    assert e.value.code == 2 and "(groups: capacity, main, threads)" in capsys.readouterr().err
