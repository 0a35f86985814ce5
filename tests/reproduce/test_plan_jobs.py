"""lit_rl/reproduce/plan_jobs.py: a plan's jobs, order, seeds, threads and quick mode; each overlay its own
``--config`` file named by its text (a changed plan reruns the job), composed by the CLI as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.config.lines import compose_files
from lit_rl.errors import ConfigError
from lit_rl.reproduce.plan_file import load_plan
from lit_rl.reproduce.plan_jobs import expand
from support.plans import write_plan as _plan

ROOT = Path(__file__).resolve().parents[2]
@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)  # plans name configs relative to the repository, as the CLI runs there


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
        labels = [Path(f).name.rsplit("_", 1)[0] for f in files[1:]]
        assert files[0] == "conf/erils.yaml" and all(f.startswith(str(job.folder)) for f in files[1:])
        assert labels == (["overlay", "overlay2", "quick", "quick_job", "warm_start"] if quick else
                          ["overlay", "overlay2", "warm_start"])
        composed = compose_files(files).data
        (warm,) = [c for c in composed["trainer"]["callbacks"] if c["class_path"].endswith("FormatWarmup")]
        assert (warm["init_args"]["steps"], warm["init_args"]["lr"]) == (steps, lr)
        assert warm["init_args"]["batch_size"] == 3 and warm["init_args"]["cache_dir"] == "C"
        assert composed["model"]["init_args"]["updates_per_batch"] == 2
        assert composed["trainer"]["max_steps"] == (8 if quick else 300)




def test_a_plan_without_a_warm_up_adds_no_cache_overlay_and_starts_its_jobs_together(tmp_path):
    """``warm_start: null`` (a pretrained model, conf/reproduce/real_smollm2.yaml): no warm_start overlay file, no
    first job alone; anything but null or a callback mapping is refused at its line."""
    path = tmp_path / "p.yaml"
    path.write_text("study: double-rollout\nexperiment: e\nmetric: m\nwarm_start: null\njobs:\n"
                    "  a_s{seed}: {group: main, configs: [conf/real/grpo_smollm2.yaml]}\n")
    study = load_plan(path)
    assert study.warm_start.callback is None
    plan = expand(study, tmp_path / "o", seeds=[0, 1], quick=False, workers=1, threads=2, cache_dir="C")
    assert [j.name for j in plan.jobs] == ["a_s0", "a_s1"] and not plan.first_alone
    assert [a for a in plan.jobs[0].argv if a.endswith(".yaml")] == ["conf/real/grpo_smollm2.yaml"]
    path.write_text(path.read_text().replace("warm_start: null", "warm_start: callbacks.FormatWarmup"))
    with pytest.raises(ConfigError, match=r"p\.yaml:4: warm_start: must give .* or be null"):
        load_plan(path)


def test_a_changed_overlay_makes_a_finished_job_run_again_and_keeps_the_old_file(tmp_path):
    """The overlay's file is named by its text: another learning rate is another command line, so the first run's
    done.json no longer counts, and the first run's file stays as it ran."""
    import json

    jobs = []
    for lr in ("3.0e-4", "1.0e-4"):
        path = _plan(tmp_path, f"jobs:\n  a_s{{seed}}: {{group: main, configs: [conf/erils.yaml], "
                               f"overlay: {{model: {{init_args: {{optimizer: {{init_args: {{lr: {lr}}}}}}}}}}}}}\n")
        (job,) = expand(load_plan(path), tmp_path / "out", seeds=[0], quick=False, workers=1, threads=1).jobs
        jobs.append(job)
    first, second = jobs
    assert first.folder == second.folder and first.digest != second.digest
    first.done_file.parent.mkdir(parents=True, exist_ok=True)
    first.done_file.write_text(json.dumps({"argv_sha": first.digest}))
    assert first.is_done() and not second.is_done()
    overlays = sorted(p.name for p in first.folder.glob("overlay_*.yaml"))
    assert len(overlays) == 2  # both texts, neither overwritten


def test_the_parts_compose_in_order_as_separate_files_appends_and_single_item_edits_included(tmp_path):
    """An append in the job's overlay, an edit of the appended entry in its quick part, a single-item edit: the CLI
    composes the files one after another, so each part means what it says."""
    path = _plan(tmp_path, """quick: {trainer: {max_steps: 8}}
jobs:
  a_s{seed}:
    group: main
    configs: [conf/erils.yaml]
    overlay:
      - trainer: {callbacks+: [{class_path: callbacks.passk.PassAtKEvaluation,
                                init_args: {name: extra, every_n_steps: 4, start_step: 4, configs: [{name: a}]}}]}
      - trainer: {callbacks~: {class_path: callbacks.FormatWarmup, init_args: {steps: 7}}}
    quick: {trainer: {callbacks~: [{class_path: PassAtKEvaluation, init_args: {name: extra, start_step: 8}}]}}
""")
    (job,) = expand(load_plan(path), tmp_path / "o", seeds=[0], quick=True, workers=1, threads=1, cache_dir="C").jobs
    files = [a for a in job.argv if a.endswith(".yaml")]
    assert [Path(f).name.rsplit("_", 1)[0] for f in files[1:]] == ["overlay", "overlay2", "quick", "quick_job",
                                                                   "warm_start"]
    cbs = compose_files(files).data["trainer"]["callbacks"]
    extra = [c for c in cbs if (c.get("init_args") or {}).get("name") == "extra"]
    assert extra[0]["init_args"]["start_step"] == 8 and cbs[-1] is extra[0]  # appended, then edited
    (warm,) = [c for c in cbs if c["class_path"] == "callbacks.FormatWarmup"]
    assert (warm["init_args"]["steps"], warm["init_args"]["cache_dir"]) == (7, "C")
    assert compose_files(files).data["trainer"]["max_steps"] == 8


def test_expand_writes_nothing_when_asked_not_to_and_the_runner_writes_a_jobs_files_at_its_start(tmp_path):
    from lit_rl.reproduce.runner import run_jobs

    path = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n")
    plan = expand(load_plan(path), tmp_path / "o", seeds=[0], quick=False, workers=1, threads=1, write=False)
    assert not (tmp_path / "o").exists()
    (job,) = plan.jobs
    job.argv = ["--help"]  # a command that exits at once: the runner still writes the job's inputs first
    run_jobs([job], echo=lambda _: None)
    assert all(p.read_text() == text for p, text in job.inputs.items())


def test_duplicate_seeds_are_refused(tmp_path):
    path = _plan(tmp_path, "jobs:\n  a_s{seed}: {group: main, configs: [conf/erils.yaml]}\n")
    with pytest.raises(ValueError, match=r"each seed once, got \[0, 0\]"):
        expand(load_plan(path), tmp_path / "o", seeds=[0, 0], quick=False, workers=1, threads=1)


def test_the_command_names_the_plans_line_for_a_bad_overlay_key_before_anything_runs(tmp_path, capsys):
    from lit_rl.reproduce import main

    path = _plan(tmp_path, "jobs:\n  a_s{seed}:\n    group: main\n    configs: [conf/erils.yaml]\n"
                           "    overlay: {model: {init_args: {updates_per_bach: 2}}}\n")
    assert main(["erils", "--plan", str(path), "--out", str(tmp_path / "o"), "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:6: jobs.a_s{{seed}}: " in err and "updates_per_bach" in err
    assert not (tmp_path / "o" / "runs").exists()  # nothing written, nothing run
