"""lit_rl/reproduce/plan_file.py: reading a plan (errors at file:line); with lit_rl/reproduce/plan_jobs.py (its own
tests in test_plan_jobs.py) every shipped plan's jobs pass the fit preflight."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rl.errors import ConfigError
from lit_rl.reproduce.plan_file import load_plan
from lit_rl.reproduce.plan_jobs import expand
from support.plans import write_plan as _plan

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted(p for p in (ROOT / "conf" / "reproduce").glob("*.yaml") if "jobs" in yaml.safe_load(p.read_text()))


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)  # plans name configs relative to the repository, as the CLI runs there


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
     "jobs.a_s{seed}.overlay[0]: must be a training-config mapping"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\nevaluations:\n  l: {of: [nope], configs: [x]}\n",
     8, "evaluations.l.of: must list groups of fit jobs (main)"),
    ("quick: conf/nope.yaml\njobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n", 5,
     "quick: conf/nope.yaml: no such overlay file"),
    ("jobs:\n  r: {group: r, configs: [conf/erils.yaml], sweep: {key: a.b}}\n", 6,
     "jobs.r.sweep.values: must be a non-empty list"),
    ("data_seed: x\njobs: {}\n", 5, "data_seed: must be an integer"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n"
     "  a_s{seed}: {group: x, configs: [conf/erils.yaml]}\n", 7, "jobs.a_s{seed}: duplicate key (first at line 6)"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml, conf/nope.yaml]}\n", 6,
     "jobs.a_s{seed}.configs[1]: conf/nope.yaml: no such config file"),
    ("jobs:\n  a_s{seed[0]}: {group: main, configs: [conf/erils.yaml]}\n", 6, "a job name is one folder name"),
    ("jobs:\n  a_s{sed}: {group: main, configs: [conf/erils.yaml]}\n", 6,
     "a job name may hold {seed} and {threads} only, got {sed}"),
    ("jobs:\n  a_s{{seed}}: {group: main, configs: [conf/erils.yaml]}\n", 6, "needs {seed} in its name"),
    ("jobs:\n  ../a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n", 6, "a job name is one folder name"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], tags: {group: x}}\n", 6,
     "jobs.a_s{seed}.tags.group: a reserved tag"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], threads: other}\n", 6,
     "threads: other runs the first seed only: add seeds: first"),
    ("jobs:\n  r: {group: r, configs: [conf/erils.yaml], sweep: {key: a.b, values: [1]}, tags: {x: y}}\n", 6,
     "jobs.r.tags: a sweep job takes group, configs, quick and sweep"),
    ("jobs:\n  r: {group: r, configs: [conf/erils.yaml], sweep: {key: a.b, values: [1]}}\n"
     "evaluations:\n  l: {of: [r], configs: [conf/eval/erils_lengths.yaml]}\n", 8, "must list groups of fit jobs ()"),
    ("jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n"
     "evaluations:\n  main: {of: [main], configs: [conf/eval/erils_lengths.yaml]}\n", 8, "a name no job group has"),
])
def test_a_bad_plan_names_its_file_line_and_key(tmp_path, body, where, message):
    path = _plan(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_plan(path)
    assert str(e.value).startswith(f"{path}:{where}: ") and message in str(e.value)


def test_a_plan_without_a_required_key_or_with_two_jobs_of_one_name_says_so(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("study: erils\nexperiment: e\njobs: {}\n")
    with pytest.raises(ConfigError, match=f"^{path}:1: metric: missing"):
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
    """Each job's command line, overlays included, as ``reproduce`` checks it before anything runs (the fit preflight;
    a sweep's every grid point on its base); the check's own refusal: test_plan_jobs.py."""
    from lit_rl.reproduce.plan_jobs import check_jobs

    plan = expand(load_plan(path), tmp_path, seeds=[0, 1], quick=quick, workers=2, threads=1, cache_dir="c",
                  write=False)
    assert [j for j in plan.jobs if j.argv[0] == "fit"]
    check_jobs(plan.jobs)


def test_the_command_refuses_a_plan_of_another_study_or_a_bad_plan_with_its_line(tmp_path, capsys):
    from lit_rl.reproduce import main

    assert main(["erils", "--plan", "conf/reproduce/double_rollout.yaml", "--out", str(tmp_path), "--report_only"]) == 2
    assert "conf/reproduce/double_rollout.yaml: study: the plan is of the double-rollout study, not erils" in (
        capsys.readouterr().err)
    mine = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n", name="mine.yaml")
    assert main(["erils", "--plan", str(mine), "--report_only", "--quick"]) == 2  # nothing run yet: no store
    assert "runs/reproduce/mine_quick/mlflow.db: no runs to report yet" in capsys.readouterr().err
    assert not (ROOT / "runs/reproduce/mine_quick").exists()  # --report_only writes nothing
    bad = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml], seeds: all}\n")
    assert main(["erils", "--plan", str(bad), "--out", str(tmp_path / "o"), "--report_only"]) == 2
    assert f"error: {bad}:6: jobs.a_s{{seed}}.seeds: must be each or first, got 'all'" in capsys.readouterr().err


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.name)
def test_a_quick_overlays_pass_at_k_entries_are_the_bases_but_for_the_sample_count(path, tmp_path):
    """An edit replaces the Pass@k ``configs`` list whole, so the quick overlays restate the base's entries: they must
    stay the base's (generation settings, names) with fewer samples."""
    from lit_rl.config.lines import compose_files

    plan = expand(load_plan(path), tmp_path, seeds=[0], quick=True, workers=1, threads=1, cache_dir="c")
    for job in (j for j in plan.jobs if j.argv[0] == "fit"):
        files = [a for a in job.argv if a.endswith(".yaml")]
        full = [f for f in files if not (Path(f).name.startswith("quick") or f == plan.study.quick)]
        base, quick = (compose_files(fs).data["trainer"]["callbacks"] for fs in (full, files))
        for before, after in zip(base, quick):
            if before["class_path"].endswith("PassAtKEvaluation"):
                strip = [{k: v for k, v in c.items() if k != "num_samples"} for c in before["init_args"]["configs"]]
                assert [{k: v for k, v in c.items() if k != "num_samples"}
                        for c in after["init_args"]["configs"]] == strip, job.name
