"""The benchmark scripts run (their --quick / --cpu-dry-run modes) and print what their docstrings promise."""

import json
import os
import subprocess
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
    # the times are printed rounded to 1 ms and the ratio from the unrounded times: it lies within the
    # ratios the rounded times allow (a fast machine's with_pyc_s of ~0.04 s puts rounding past 1 %)
    no, with_ = summary["no_pyc_s"], summary["with_pyc_s"]
    assert (no - 5e-4) / (with_ + 5e-4) - 1e-3 <= summary["no_pyc_over_with_pyc"] <= (no + 5e-4) / (with_ - 5e-4) + 1e-3
    assert any(line.startswith("no .pyc") for line in out)


def test_double_rollout_cost_prints_its_table_and_a_json_line_last(capsys):
    table = _load("double_rollout_cost").main(["--G", "2", "--T", "16", "--N", "2", "--repeats", "1",
                                               "--hidden", "32", "--layers", "1", "--heads", "2"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["backend"] == "hf" and last["budget"] == 18  # ceil(0.1 * 16) + 16
    assert last["same_samples"] is True  # shared prefill and re-encoding draw the same samples in fp32
    assert last["stage2_reuse_s"] == table[1]["time"] and last["prefix_cache_hit_frac"] is None


def test_step_profile_clock_counts_nested_entries_once():
    """A hand-made trace with a fake clock: each second goes to the innermost open bucket, once."""
    module = _load("step_profile")
    times = iter([0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 10.0, 12.0, 13.0, 16.0, 17.0, 18.0])
    clock = module.BucketClock(now=lambda: next(times))  # start 0.0, root "start-up"
    clock.enter("other")          # 1.0: start-up 0-1
    clock.enter("optimizer")      # 2.0: other 1-2
    clock.enter("loss fwd/bwd")   # 3.0: optimizer 2-3
    clock.exit()                  # 7.0: loss 3-7 (inside the update: not the optimizer's)
    clock.enter("logging")        # 8.0: optimizer 7-8
    clock.exit()                  # 9.0: logging 8-9
    clock.exit()                  # 10.0: optimizer 9-10; the update's cumulative 10 - 2 = 8 s holds 4 + 1 of others
    clock.enter("evaluation")     # 12.0: other 10-12
    clock.enter("generation")     # 13.0: evaluation 12-13; generation inside evaluation stays evaluation
    clock.exit()                  # 16.0: evaluation 13-16
    clock.exit()                  # 17.0: evaluation 16-17
    clock.tick()                  # 18.0: other 17-18
    s = clock.seconds
    assert s["loss fwd/bwd"] == 4.0 and s["logging"] == 1.0
    assert s["optimizer"] == 3.0  # 1 + 1 + 1, not the update's cumulative 8
    assert s["evaluation"] == 5.0 and s["generation"] == 0.0
    assert s["start-up"] == 1.0 and s["other"] == 1.0 + 2.0 + 1.0
    assert sum(s.values()) == clock.last - clock.start == 18.0  # every second once
    naive = 8.0 + 4.0 + 1.0 + 5.0 + 3.0  # cumulative times of the entries add to more than the wall
    assert naive > sum(s.values())


def test_step_profile_wraps_every_entry():
    """Each entry names a function that exists (install fails on one that matches nothing)."""
    module = _load("step_profile")
    sys.path.insert(0, str(ROOT))
    wrapped = module.install(module.BucketClock())
    for _, owner, name, original in reversed(wrapped):  # unwrap: later tests use these classes
        setattr(owner, name, original)
    wrapped = [f"{bucket}: {getattr(owner, '__name__', '')}.{name}" for bucket, owner, name, _ in wrapped]
    assert any("RLModule.optimizer_update" in w for w in wrapped)
    assert any(w.startswith("loss fwd/bwd:") and w.endswith(".prepare") for w in wrapped)


def test_step_profile_real_run_buckets_sum_to_the_wall(capsys):
    """A real tiny double-rollout fit under cProfile (2 updates): buckets sum to the wall, JSON line last."""
    summary = _load("step_profile").main([
        "--config", "conf/double_rollout.yaml", "--config", "conf/double_rollout_chainsum.yaml",
        "--config", "tests/tiny_dr_overlay.yaml",
        "--max-steps", "2", "--top", "5"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == json.loads(json.dumps(summary))
    (run,) = last["runs"].values()
    assert sum(run["buckets"].values()) == pytest.approx(run["wall_s"], abs=0.02)
    for name in ("start-up", "generation", "scoring", "loss fwd/bwd", "optimizer", "logging"):
        assert run["buckets"][name] > 0, name
    assert run["updates"] == 2 and run["train_s_per_update"] > 0
    assert run["train_part_s"] == pytest.approx(run["wall_s"] - run["buckets"]["start-up"] - run["buckets"]["outside"],
                                                abs=0.01)


def test_step_profile_reads_the_final_numbers_from_the_fit_line():
    module = _load("step_profile")
    out = ("Epoch 0: 100%\nfit ended at step 300: val/sudoku/greedy/accuracy 0.9311, val/sudoku/multi/pass@2 0.9405, "
           "val/x nan; run folder /tmp/r; MLflow run 0e0c (sqlite:////tmp/r.db)\n")
    final = module.final_metrics(out)
    assert list(final) == ["val/sudoku/greedy/accuracy", "val/sudoku/multi/pass@2", "val/x"]
    assert final["val/sudoku/greedy/accuracy"] == 0.9311 and final["val/sudoku/multi/pass@2"] == 0.9405
    assert module.final_metrics("no summary line") == {}


def test_vs_trl_quick_runs_both_sides_and_prints_a_json_line_last(tmp_path):
    """lit_rl GRPO (trimmed and full-width loss), TRL's GRPOTrainer and lit_rl double rollout, 2 updates each
    from a 10-step warm start, in fresh processes (the script's own subprocesses); checks the figures are there
    and sane, not their size."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/vs_trl.py"), "--quick", "--cache-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["mode"] == "quick" and summary["steps"] == 2 and summary["seeds"] == [0]
    assert any(line.startswith("TRL GRPOTrainer") for line in out)
    assert set(summary["sides"]) == {"trl", "lit", "lit_full", "lit_dr"}
    for name, side in summary["sides"].items():
        for key in ("wall_s", "gen_s", "rollout_tokens_per_s", "peak_rss_mb", "first_step_s"):
            assert side[key]["mean"] > 0, (name, key)
        assert side["score_s"]["mean"] >= 0 and 0 <= side["heldout_accuracy"]["mean"] <= 1, name
        run = summary["runs"][name][0]
        assert len(run["steps"]) == 2, name
        for step in run["steps"]:
            assert step["wall_s"] == pytest.approx(step["gen_s"] + step["score_s"] + step["update_s"]), name
    # double rollout samples the first stage plus N continuations of every cut rollout
    assert summary["sides"]["lit_dr"]["tokens_per_step"]["mean"] > summary["sides"]["lit"]["tokens_per_step"]["mean"]
    changed = summary["trl_changed_settings"]
    assert changed and all(c["reason"] and "default" in c for c in changed)
    assert {"num_generations", "max_completion_length", "learning_rate"} <= {c["setting"] for c in changed}
    assert 0 < summary["accuracy_tolerance"]["abs_diff_of_seed_means"] < 1
    verdict = summary["verdict"]
    assert verdict["speedup"] == pytest.approx(summary["sides"]["trl"]["wall_s"]["mean"]
                                               / summary["sides"]["lit"]["wall_s"]["mean"])
    assert verdict["equal_accuracy"] == (abs(verdict["accuracy_diff"]) <= summary["accuracy_tolerance"][
        "abs_diff_of_seed_means"])
    # the fix's before / after from the same run: the full-width loss side against the default (trimmed) one
    assert verdict["trim_speedup"] == pytest.approx(summary["sides"]["lit_full"]["wall_s"]["mean"]
                                                    / summary["sides"]["lit"]["wall_s"]["mean"])
    assert any(line.startswith("the fix (loss.trim_padding)") for line in out)


def test_eval_decoders_quick_compares_every_decoder_on_the_same_puzzles(capsys):
    """Random weights, 8 puzzles: the threshold's schedule floor never costs more passes than the fixed schedule,
    Fast-dLLM's floor of one does (nothing passes τ on random weights), the caches run fewer positions."""
    summary = _load("eval_decoders").main(["--quick"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(summary))
    (rows,) = summary["results"].values()
    assert rows["exact"]["passes_per_row"] == 24 and rows["threshold"]["passes_per_row"] <= 24
    assert rows["threshold_one"]["passes_per_row"] == 48
    assert rows["dual"]["forward_tokens"] < rows["prefix"]["forward_tokens"] < rows["exact"]["forward_tokens"]
    assert all(r["puzzles"] == 8 and 0 <= r["accuracy"] <= 1 for r in rows.values())


def test_eval_decoders_sampled_mode_scores_pass_at_k_as_the_callback_does(capsys):
    """``--samples 2``: two sampled completions per puzzle, scored as PassAtKEvaluation scores them (pass@1 <=
    pass@2, the mean accuracy), each decoder compared with exact on the best of the two."""
    summary = _load("eval_decoders").main(["--quick", "--samples", "2", "--decoders", "exact,threshold"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(json.dumps(summary))
    assert summary["mode"] == {"samples": 2, "subset": 8, "first_seed": 1001, "temperature": 0.9}
    (rows,) = summary["results"].values()
    for r in rows.values():
        assert 0 <= r["pass@1"] <= r["pass@2"] <= 1 and 0 <= r["accuracy"] <= 1 and r["puzzles"] == 8
    assert rows["exact"]["passes_per_row"] == 24 and rows["threshold"]["passes_per_row"] <= 24
    assert rows["threshold"]["delta"] == round(rows["threshold"]["pass@2"] - rows["exact"]["pass@2"], 4)


def test_step_profile_before_ref_checks_out_that_commit_and_removes_it():
    module = _load("step_profile")
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    with module.before_worktree("HEAD") as (tree, sha):
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
        assert head == sha and (tree / "benchmarks" / "step_profile.py").exists()
        assert (tree / "runs").resolve() == (ROOT / "runs").resolve()  # the warm-start cache is shared
    assert not tree.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert str(tree) not in listed
    with pytest.raises(SystemExit, match="not a commit"):
        with module.before_worktree("no-such-ref-xyz"):
            pass


def test_chunked_logprobs_runs_each_mode_in_its_own_process_and_prints_a_json_line_last(capsys):
    # 2,048 tokens x 32,768: the whole pass's float32 logits alone are 256 MiB, above the process's start-up peak
    summary = _load("chunked_logprobs").main(["--length", "2048", "--vocab", "32768", "--chunks", "0", "256"])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == summary and set(summary["peak_ratio"]) == {"0", "256"}
    whole, chunked = summary["results"]
    assert whole["chunk"] == 0 and chunked["chunk"] == 256 and whole["peak_mib"] > chunked["peak_mib"]
    assert summary["peak_ratio"]["256"] is not None and summary["peak_ratio"]["256"] < 0.5
    # the same numbers both ways: only where the memory goes differs
    assert abs(whole["logp_sum"] - chunked["logp_sum"]) < 1e-3 * abs(whole["logp_sum"])
    assert abs(whole["grad_abs_sum"] - chunked["grad_abs_sum"]) < 1e-4 * whole["grad_abs_sum"]
