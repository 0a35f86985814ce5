"""The benchmark scripts run (their --quick / --cpu-dry-run modes) and print what their docstrings promise."""

import json
import os
import sys
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    return load_script("benchmarks", name)


def test_dllm_decode_quick_prints_a_json_summary_last(capsys):
    summary = _load("dllm_decode").main(["--quick", "--cache-dir", "", "--repeats", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(summary))
    for cell, modes in summary["speed"].items():
        assert modes["exact"]["speedup"] == 1.0 and modes["exact"]["agreement"] == 1.0
        # quick: L 32, block 16, 16 steps (8 per block): dual runs T per block start + 7 x 16 block-only steps,
        # exact T at all 16 steps, so dual's forward-token ratio is 16 T / (2 T + 224) > 1 for any prompt length
        assert modes["dual"]["forward_ratio"] > modes["prefix"]["forward_ratio"] > 1.0, cell
    assert set(summary["accuracy"]) == {"exact", "prefix", "dual", "dual+thr0.9"}
    assert summary["accuracy"]["exact"]["agreement"] == 1.0


@pytest.mark.slow
def test_gpu_smoke_dry_run_decodes_every_mode_and_resumes(capsys):
    sys.path.insert(0, str(ROOT))
    assert _load("gpu_smoke").main(["--cpu-dry-run"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("summary: ")][-1]
    summary = json.loads(line[len("summary: "):].replace("NaN", "null"))
    assert summary["resumed_global_step"] == summary["global_step"] + 2  # one more rollout batch of 2 updates
    assert set(summary["decode_modes"]) == {"4bit", "bf16"}
    for modes in summary["decode_modes"].values():
        assert set(modes) == {"exact", "prefix", "dual", "dual+thr0.9"} and modes["exact"]["agreement"] == 1.0


@pytest.mark.slow
@pytest.mark.postgres
def test_sweep_workers_quick_runs_one_and_two_workers_on_postgres_and_an_mlflow_server(capsys):
    """Real PostgreSQL + mlflow server + `python -m lit_rl sweep` workers; skips when the servers cannot start
    here (fails under CI=true). Checks the figures add up, not their size (a benchmark, not a timing test)."""
    module = _load("sweep_workers")
    try:
        summary = module.main(["--quick"])
    except module.ServerUnavailable as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{e} (CI=true: a PostgreSQL test must run, not skip)", pytrace=False)
        pytest.skip(str(e))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == json.loads(json.dumps(summary))
    assert summary["trials"] == 2 and summary["tracking"] == "server" and summary["mlflow_server_start_s"] > 0
    assert [r["workers"] for r in summary["runs"]] == [1, 2]
    for r in summary["runs"]:
        assert r["worker_rc"] == [0] * r["workers"] and not r["timed_out"], r
        assert r["complete"] == 2 and r["states"] == {"COMPLETE": 2}, r
        assert len(r["per_worker"]) == r["workers"] and sum(r["per_worker"]) == 2, r
        assert r["mlflow_finished_child_runs"] == 2, r  # each trial's child run reached the server
        assert r["trials_per_min"] == pytest.approx(2 / r["wall_s"] * 60, rel=1e-2)
        assert 0 < r["first_trial_start_s"] < r["first_trial_start_s"] + r["trial_span_s"] <= r["wall_s"] + 1
    assert summary["runs"][0]["speedup"] == 1.0
    assert summary["runs"][1]["speedup"] == pytest.approx(
        summary["runs"][1]["trials_per_min"] / summary["runs"][0]["trials_per_min"], rel=1e-2)
    machine = summary["machine"]
    assert machine["cpu_count"] == os.cpu_count()
    assert len(machine["loadavg_start"]) == len(machine["loadavg_end"]) == 3


def test_import_bytecode_compares_cached_and_uncached_imports_in_one_run(capsys):
    """A small standard-library import list: without cached bytecode every module is compiled from source."""
    assert _load("import_bytecode").main(["--repeats", "2", "--modules", "argparse, email.message, unittest"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["modules"] == "argparse, email.message, unittest" and summary["repeats"] == 2
    assert summary["no_pyc_s"] > summary["with_pyc_s"] > 0
    assert summary["no_pyc_over_with_pyc"] == pytest.approx(summary["no_pyc_s"] / summary["with_pyc_s"], rel=1e-2)
    assert any(line.startswith("no .pyc") for line in out)


def test_double_rollout_cost_prints_its_table_and_a_json_line_last(capsys):
    table = _load("double_rollout_cost").main(["--G", "2", "--T", "16", "--N", "2", "--repeats", "1",
                                               "--hidden", "32", "--layers", "1", "--heads", "2"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["backend"] == "hf" and last["budget"] == 18  # ceil(0.1 * 16) + 16
    assert last["same_samples"] is True  # shared prefill and re-encoding draw the same samples in fp32
    assert last["stage2_reuse_s"] == table[1]["time"] and last["prefix_cache_hit_frac"] is None


def test_step_profile_buckets_count_nested_entries_once():
    """A hand-built pstats table: (cc, nc, tt, ct, {caller: (cc, nc, tt, ct)}); entries by file and name."""
    bucket_times = _load("step_profile").bucket_times
    entries = (("optimizer", "opt.py", "update"), ("loss fwd/bwd", "loss.py", "backward"),
               ("logging", "log.py", "log"), ("generation", "gen.py", "rows"), ("evaluation", "ev.py", "*"))
    root, update, backward, step_impl, log = ("run.py", 1, "main"), ("opt.py", 1, "update"), \
        ("loss.py", 1, "backward"), ("opt.py", 9, "step_impl"), ("log.py", 1, "log")
    gen, matmul, evaluate, hub, leaf = ("gen.py", 1, "rows"), ("torch.py", 1, "matmul"), ("ev.py", 1, "evaluate"), \
        ("hooks.py", 1, "call_hooks"), ("hooks.py", 9, "leaf")
    stats = {
        root: (1, 1, 1.0, 18.6, {}),
        update: (1, 1, 1.0, 10.0, {root: (1, 1, 1.0, 10.0)}),  # its 10 s hold the loss's 6 and the log's 1
        backward: (1, 1, 1.0, 6.0, {update: (1, 1, 1.0, 6.0)}),
        step_impl: (1, 1, 2.0, 2.0, {update: (1, 1, 2.0, 2.0)}),
        log: (1, 1, 1.0, 1.0, {update: (1, 1, 1.0, 1.0)}),
        gen: (1, 1, 1.0, 5.0, {root: (1, 1, 1.0, 5.0)}),
        matmul: (2, 2, 9.0, 9.0, {backward: (1, 1, 5.0, 5.0), gen: (1, 1, 4.0, 4.0)}),  # shared: 5 s + 4 s
        evaluate: (1, 1, 0.2, 2.0, {root: (1, 1, 0.2, 2.0)}),
        hub: (2, 2, 0.4, 2.4, {root: (1, 1, 0.1, 0.6), evaluate: (1, 1, 0.3, 1.8)}),  # context 1/4 other, 3/4 eval
        leaf: (2, 2, 2.0, 2.0, {hub: (2, 2, 2.0, 2.0)}),
    }
    b = bucket_times(stats, entries)
    # loss: backward's own 1 + matmul's 5 under it; generation: 1 + matmul's 4 (matmul split by its callers)
    assert b["loss fwd/bwd"] == pytest.approx(6.0) and b["generation"] == pytest.approx(5.0)
    # optimizer: update's 10 cumulative less the loss's 6 and the log's 1 = own 1 + step_impl 2 (not 10)
    assert b["optimizer"] == pytest.approx(3.0) and b["logging"] == pytest.approx(1.0)
    # hub's own time by caller: 0.1 other, 0.3 evaluation; leaf's 2 by hub's context (0.6 : 1.8): 0.5, 1.5
    assert b["evaluation"] == pytest.approx(0.2 + 0.3 + 1.5)
    assert b["other"] == pytest.approx(1.0 + 0.1 + 0.5)  # the root's own time and its share of the hub
    assert sum(b.values()) == pytest.approx(18.6)  # every second once: the root's cumulative time
    naive = stats[update][3] + stats[backward][3] + stats[gen][3]  # cumulative times add to 21 > 18.6
    assert naive > sum(b.values())


def test_step_profile_real_run_buckets_sum_to_the_wall(capsys):
    """A real tiny double-rollout fit under cProfile (2 updates): buckets sum to the wall, JSON line last."""
    summary = _load("step_profile").main([
        "--config", "conf/double_rollout_chainsum.yaml", "--config", "tests/tiny_dr_overlay.yaml",
        "--max-steps", "2", "--top", "5"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(summary))
    (run,) = last["runs"].values()
    assert sum(run["buckets"].values()) == pytest.approx(run["wall_s"], abs=0.02)
    for name in ("start-up", "generation", "scoring", "loss fwd/bwd", "optimizer", "logging"):
        assert run["buckets"][name] > 0, name
    assert run["train_s_per_update"] > 0
