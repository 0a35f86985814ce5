"""lit_rl/reproduce/plan_file.py: reading a plan (errors at file:line), composing a job's overlay, expanding the
jobs (order, seeds, threads, quick); every shipped plan's jobs pass the fit preflight."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rl.config.lines import compose_files
from lit_rl.errors import ConfigError
from lit_rl.reproduce.plan_file import expand, load_plan, merge_overlays

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted(p for p in (ROOT / "conf" / "reproduce").glob("*.yaml") if "jobs" in yaml.safe_load(p.read_text()))

HEAD = """study: erils
experiment: e
metric: val/sudoku/greedy/accuracy
warm_start: {callback: callbacks.FormatWarmup}
"""


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)  # plans name configs relative to the repository, as the CLI runs there


def _plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(HEAD + text)
    return path


def test_merge_overlays_adds_up_keyed_edits_and_replaces_lists():
    a = {"trainer": {"max_steps": 8, "callbacks~": [{"class_path": "X", "init_args": {"a": 1}}]},
         "data": {"init_args": {"sizes": [1, 2], "seed": 3}}}
    b = {"trainer": {"callbacks~": [{"class_path": "X", "init_args": {"a": 2}}]},
         "data": {"init_args": {"sizes": [9]}}}
    assert merge_overlays([a, b]) == {
        "trainer": {"max_steps": 8, "callbacks~": [{"class_path": "X", "init_args": {"a": 1}},
                                                   {"class_path": "X", "init_args": {"a": 2}}]},
        "data": {"init_args": {"sizes": [9], "seed": 3}}}
    assert a["trainer"]["callbacks~"] == [{"class_path": "X", "init_args": {"a": 1}}]  # inputs untouched


def test_jobs_expand_seed_major_per_group_with_first_seed_and_other_threads(tmp_path):
    path = _plan(tmp_path, """jobs:
  a_s{seed}: {group: main, configs: [conf/erils.yaml]}
  b_s{seed}: {group: main, configs: [conf/erils.yaml, conf/spg.yaml]}
  c_s{seed}_t{threads}: {group: spread, configs: [conf/erils.yaml], seeds: first, threads: other}
  d_s{seed}: {group: main, configs: [conf/erils.yaml], seeds: first}
""")
    plan = expand(load_plan(path), tmp_path / "out", seeds=[3, 5], quick=False, workers=1, threads=2)
    assert [j.name for j in plan.jobs] == ["a_s3", "b_s3", "d_s3", "a_s5", "b_s5", "c_s3_t1"]
    jobs = {j.name: j for j in plan.jobs}
    assert "--threads=1" in jobs["c_s3_t1"].argv and jobs["c_s3_t1"].tags["threads"] == "1"
    assert [a for a in jobs["b_s5"].argv if a.startswith("--data.init_args.seed")] == ["--data.init_args.seed=47"]
    assert jobs["b_s5"].tags == {"lit_rl.reproduce": "erils", "lit_rl.job": "b_s5", "seed": "5", "threads": "2",
                                 "group": "main"}
    assert plan.first_alone and not plan.boost_first and plan.eval_jobs == []


def test_a_jobs_overlay_composes_its_own_then_the_quick_ones_then_the_cache(tmp_path):
    """Each part edits the warm-up's steps: the later part wins, each edit applied in turn on the configs' entry."""
    path = _plan(tmp_path, """quick:
  trainer:
    max_steps: 8
    callbacks~: [{class_path: callbacks.FormatWarmup, init_args: {steps: 5, lr: 0.5}}]
jobs:
  a_s{seed}:
    group: main
    configs: [conf/erils.yaml]
    overlay:
      - trainer: {callbacks~: [{class_path: callbacks.FormatWarmup, init_args: {steps: 7, batch_size: 3}}]}
      - model: {init_args: {updates_per_batch: 2}}
    quick: {trainer: {callbacks~: [{class_path: callbacks.FormatWarmup, init_args: {steps: 3}}]}}
  b_s{seed}: {group: main, configs: [conf/erils.yaml]}
""")
    study = load_plan(path)
    for quick, names, steps, lr in ((False, ["a_s0", "b_s0"], 7, 0.001), (True, ["a_s0"], 3, 0.5)):
        plan = expand(study, tmp_path / str(quick), seeds=[0], quick=quick, workers=1, threads=1, cache_dir="C")
        assert [j.name for j in plan.jobs] == names  # quick mode: only the jobs marked quick
        job = plan.jobs[0]
        files = [a for a in job.argv if a.endswith(".yaml")]
        assert files == ["conf/erils.yaml", str(job.folder / "overlay.yaml")]
        composed = compose_files(files).data
        (warm,) = [c for c in composed["trainer"]["callbacks"] if c["class_path"].endswith("FormatWarmup")]
        assert (warm["init_args"]["steps"], warm["init_args"]["lr"]) == (steps, lr)
        assert warm["init_args"]["batch_size"] == 3 and warm["init_args"]["cache_dir"] == "C"
        assert composed["model"]["init_args"]["updates_per_batch"] == 2
        assert composed["trainer"]["max_steps"] == (8 if quick else 300)


@pytest.mark.parametrize("body, where, message", [
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], seed: first}\n", 6,
     "jobs.a_s{seed}.seed: unknown key"),
    ("jobs:\n  a_s{seed}: {configs: [conf/erils.yaml]}\n", 6, "every job names its group"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], seeds: all}\n", 6,
     "jobs.a_s{seed}.seeds: must be each or first, got 'all'"),
    ("jobs:\n  a: {group: main, configs: [conf/erils.yaml]}\n", 6, "needs {seed} in its name"),
    ("jobs:\n  a_{lr}: {group: main, configs: [conf/erils.yaml], seeds: first}\n", 6,
     "a job name may hold {seed} and {threads} only"),
    ("jobs:\n  a_s{seed}: {group: main, configs: conf/erils.yaml}\n", 6,
     "jobs.a_s{seed}.configs: must be a non-empty list of config files"),
    ("jobs:\n  a_s{seed}:\n    group: main\n    configs: [conf/erils.yaml]\n    overlay: [3]\n", 9,
     "jobs.a_s{seed}.overlay: must be a training-config mapping"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\nevaluations:\n  l: {of: [nope], configs: [x]}\n",
     8, "evaluations.l.of: must list job groups of this plan (main)"),
    ("quick: conf/nope.yaml\njobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n", 5,
     "quick: conf/nope.yaml: no such overlay file"),
    ("jobs:\n  r: {group: r, configs: [conf/erils.yaml], sweep: {key: a.b}}\n", 6,
     "jobs.r.sweep.values: must be a non-empty list"),
    ("data_seed: x\njobs: {}\n", 5, "data_seed: must be an integer"),
])
def test_a_bad_plan_names_its_file_line_and_key(tmp_path, body, where, message):
    path = _plan(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_plan(path)
    assert str(e.value).startswith(f"{path}:{where}: ") and message in str(e.value)


def test_a_plan_without_a_required_key_or_with_two_jobs_of_one_name_says_so(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("study: erils\nexperiment: e\njobs: {}\n")
    with pytest.raises(ConfigError, match="metric: missing"):
        load_plan(path)
    twice = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: x, configs: [conf/erils.yaml]}\n"
                            "  a_s{seed}_: {group: x, configs: [conf/erils.yaml], seeds: first}\n")
    study = load_plan(twice)
    object.__setattr__(study.entries[1], "name", "a_s{seed}")  # two keys that expand to one name
    with pytest.raises(ConfigError, match="two jobs are named 'a_s0'"):
        expand(study, tmp_path / "o", seeds=[0], quick=False, workers=1, threads=1)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
@pytest.mark.parametrize("quick", [False, True])
def test_every_shipped_plans_fit_jobs_pass_the_preflight(path, quick, tmp_path):
    """Each job's command line, overlay included, as ``python -m lit_rl fit`` checks it before anything loads."""
    from lit_rl.config.preflight import preflight

    plan = expand(load_plan(path), tmp_path, seeds=[0, 1], quick=quick, workers=2, threads=1, cache_dir="c")
    fits = [j for j in plan.jobs if j.argv[0] == "fit"]
    assert fits
    for job in fits:
        assert preflight(job.argv, data=False) is not None, job.name
    for job in [j for j in plan.jobs if j.argv[0] == "sweep"]:  # every grid point on its base, as `sweep` checks
        from lit_rl.sweep.schema import SweepConfig
        from lit_rl.sweep.validate import check_against_base

        check_against_base(SweepConfig.from_yaml(job.argv[2]))


def test_the_command_refuses_a_plan_of_another_study_or_a_bad_plan_with_its_line(tmp_path, capsys):
    from lit_rl.reproduce import main

    assert main(["erils", "--plan", "conf/reproduce/double_rollout.yaml", "--out", str(tmp_path), "--report_only"]) == 2
    assert "conf/reproduce/double_rollout.yaml: study: the plan is of the double-rollout study, not erils" in (
        capsys.readouterr().err)
    bad = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], seeds: all}\n")
    assert main(["erils", "--plan", str(bad), "--out", str(tmp_path / "o"), "--report_only"]) == 2
    assert f"error: {bad}:6: jobs.a_s{{seed}}.seeds: must be each or first, got 'all'" in capsys.readouterr().err
