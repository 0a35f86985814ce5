"""Exact resume of a tiny ERILS run through the real CLI, as real subprocesses.

Runs (``python -m lit_rl fit --config conf/erils.yaml --config tests/tiny_overlay.yaml --config <overlay>``,
6 rollout batches x μ = 2 updates, a checkpoint after every rollout batch, sanity check on, validation every
2 batches, atomic checkpoint writes):

* ``ref``      uninterrupted;
* ``kill``     SIGKILLed right before a seeded-random optimizer update (possibly between the 2 updates of
               one rollout batch), then resumed with ``--ckpt_path last``;
* ``term``     sent SIGTERM before a seeded-random update: it must save ``last.ckpt`` at the end of that
               rollout batch and exit 0; then resumed;
* ``savekill`` SIGKILLed while writing a checkpoint: the previous ``last.ckpt`` must still load; resumed.

Each resumed run must match ``ref``: every logged metric at every step (MLflow sqlite store: one run, the
interrupted one continued by the resume and FINISHED; steps logged again after a kill carry the same values;
wall-clock ``time/*`` metrics excluded), bitwise-equal final weights and optimizer state, one ``last.ckpt``
(no ``last-v1.ckpt``), and the same consumed prompts (``consumed_prompts.jsonl``), none skipped or repeated.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MU, BATCHES = 2, 6
MAX_STEPS = MU * BATCHES
SEED = 20261129  # seeds the kill points
_rng = random.Random(SEED)
KILL_STEP = _rng.randrange(MU + 1, MAX_STEPS)  # SIGKILL right before update KILL_STEP + 1 (after >= 1 checkpoint)
TERM_STEP = _rng.randrange(1, MAX_STEPS - MU)  # SIGTERM right before update TERM_STEP + 1
SAVEKILL_STEP = MU * _rng.randrange(2, BATCHES)  # SIGKILL while saving the checkpoint of this step

pytestmark = pytest.mark.slow


ALGOS = {
    # name -> (base configs, warm-up callback, model/data overlay, extra PYTHONPATH entries)
    "erils": (
        ["conf/erils.yaml", "tests/tiny_overlay.yaml"],
        "    - class_path: callbacks.FormatWarmup\n      init_args: {steps: 2, batch_size: 4, cache_dir: null}\n",
        f"data:\n  init_args:\n    pool_path: {ROOT}/data/pools/sudoku_scripted.jsonl.gz\n",
        [],
    ),
    "double_rollout": (
        ["conf/double_rollout.yaml", "tests/tiny_dr_overlay.yaml"],
        "    - class_path: callbacks.RolloutTracker\n"
        "    - class_path: callbacks.ar_warmup.ScriptedSFTWarmup\n"
        "      init_args: {steps: 2, batch_size: 4, max_completion_len: 48, cache_dir: null}\n",
        "data:\n  init_args:\n    task:\n      init_args:\n"
        "        reward_funcs: [test_double_rollout.digit_reward]\n        num_train: 50\n",
        [str(ROOT / "tests/algorithms")],
    ),
}
DR_LANDED = (all((ROOT / f).is_file() for f in ALGOS["double_rollout"][0])
             and (ROOT / "lit_rl/algorithms/double_rollout.py").is_file())


def _overlay(run_dir: Path, extra_callbacks: list[str], algo: str = "erils") -> Path:
    _, warmup, data_overlay, _ = ALGOS[algo]
    text = f"""
trainer:
  max_steps: {MAX_STEPS}
  val_check_interval: 2
  num_sanity_val_steps: -1
  enable_checkpointing: true
  enable_progress_bar: false
  default_root_dir: {run_dir}
  plugins:
    - class_path: lit_rl.checkpoint_io.AtomicCheckpointIO
  logger:
    class_path: lightning.pytorch.loggers.MLFlowLogger
    init_args:
      experiment_name: resume
      run_name: resume
      tracking_uri: sqlite:///{run_dir}/mlflow.db
  callbacks:
{warmup}    - class_path: callbacks.resume.ExactResume
    - class_path: callbacks.resume.PromptLedger
    - class_path: callbacks.resume.CheckpointOnSigterm
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{dirpath: {run_dir}/checkpoints, save_last: true, every_n_train_steps: {MU}}}
{''.join(f'    - {c}' + chr(10) for c in extra_callbacks)}
model:
  init_args:
    updates_per_batch: {MU}
{data_overlay}"""
    p = run_dir / "overlay.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _start(run_dir: Path, extra_callbacks: list[str] = (), resume: bool = False,
           algo: str = "erils") -> subprocess.Popen:
    overlay = run_dir / "overlay.yaml" if resume else _overlay(run_dir, list(extra_callbacks), algo)
    if resume:  # the same run without its fault injector
        _overlay(run_dir, [], algo)
    configs, _, _, paths = ALGOS[algo]
    cmd = ([sys.executable, "-m", "lit_rl", "fit"] + [x for c in configs for x in ("--config", c)]
           + ["--config", str(overlay)])
    if resume:
        cmd += ["--ckpt_path", "last"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), *paths]), OMP_WAIT_POLICY="PASSIVE",
               MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    log = (run_dir / ("resume.log" if resume else "run.log")).open("w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: os.nice(19))


def _wait(procs: dict[str, subprocess.Popen], timeout: float = 900) -> dict[str, int]:
    t0 = time.time()
    rcs = {}
    for name, p in procs.items():
        rcs[name] = p.wait(timeout=max(1, timeout - (time.time() - t0)))
    return rcs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    dirs = {name: base / name for name in ("ref", "kill", "term", "savekill")}
    t0 = time.time()
    first = {
        "ref": _start(dirs["ref"]),
        "kill": _start(dirs["kill"],
                       [f"{{class_path: rel_faults.KillAt, init_args: {{step: {KILL_STEP}, sig: SIGKILL}}}}"]),
        "term": _start(dirs["term"],
                       [f"{{class_path: rel_faults.KillAt, init_args: {{step: {TERM_STEP}, sig: SIGTERM}}}}"]),
        "savekill": _start(dirs["savekill"],
                           [f"{{class_path: rel_faults.KillDuringSave, init_args: {{step: {SAVEKILL_STEP}}}}}"]),
    }
    # each faulted run is resumed as soon as it has exited (while the others still run: no idle core)
    rc1: dict[str, int] = {}
    state_after_fault, second = {}, {}
    deadline = time.time() + 900
    while len(rc1) < len(first):
        for name, proc in first.items():
            if name in rc1 or proc.poll() is None:
                continue
            rc1[name] = proc.returncode
            if name == "ref":
                continue
            state_after_fault[name] = {
                "files": (sorted(p.name for p in (dirs[name] / "checkpoints").iterdir())
                          if (dirs[name] / "checkpoints").exists() else []),
                "last_step": (_ckpt(dirs[name] / "checkpoints" / "last.ckpt")["global_step"]
                              if (dirs[name] / "checkpoints" / "last.ckpt").exists() else None),
                "ledger_lines": len(_ledger(dirs[name])),
                "mlflow_runs": _runs(dirs[name]),
            }
            second[name] = _start(dirs[name], resume=True)
        if time.time() > deadline:
            pytest.fail(f"first runs did not finish in 900 s (finished: {sorted(rc1)})")
        time.sleep(0.2)
    rc2 = _wait(second)
    for name, rc in {**{f"{k} (1st)": v for k, v in rc1.items()},
                     **{f"{k} (resume)": v for k, v in rc2.items()}}.items():
        print(f"[resume] {name}: exit status {rc}")
    print(f"[resume] wall time {time.time() - t0:.0f}s; kill before update {KILL_STEP + 1}, "
          f"SIGTERM before update {TERM_STEP + 1}, SIGKILL while saving step {SAVEKILL_STEP}")
    return {"dirs": dirs, "rc1": rc1, "rc2": rc2, "after_fault": state_after_fault}


def _ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _runs(run_dir: Path) -> list[list[str]]:
    """[[run id, status], ...] of the MLflow store, in start order."""
    con = sqlite3.connect(run_dir / "mlflow.db")
    try:
        return [list(r) for r in con.execute("SELECT run_uuid, status FROM runs ORDER BY start_time")]
    finally:
        con.close()


def _ledger(run_dir: Path) -> list[dict]:
    p = run_dir / "consumed_prompts.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _metrics(run_dir: Path) -> list[tuple[str, dict[tuple[str, int], set[float]]]]:
    """Per MLflow run (in start order): (status, {(key, step): distinct values}), wall-clock metrics excluded."""
    con = sqlite3.connect(run_dir / "mlflow.db")
    try:
        runs = list(con.execute("SELECT run_uuid, status FROM runs ORDER BY start_time"))
        out = []
        for rid, status in runs:
            d: dict[tuple[str, int], set[float]] = {}
            for key, step, value in con.execute("SELECT key, step, value FROM metrics WHERE run_uuid = ?", (rid,)):
                if key.startswith("time/"):
                    continue
                d.setdefault((key, int(step)), set()).add(float(value))
            out.append((status, d))
        return out
    finally:
        con.close()


def _compare(runs, name: str, ref_name: str = "ref") -> dict:
    ref_dir, dirs = runs["dirs"][ref_name], runs["dirs"]
    assert runs["rc1"][ref_name] == 0, (ref_dir / "run.log").read_text()[-3000:]
    assert runs["rc2"][name] == 0, (dirs[name] / "resume.log").read_text()[-3000:]
    # 1. metric trajectory: one MLflow run, the interrupted one continued
    ((_, ref),) = _metrics(ref_dir)
    parts = _metrics(dirs[name])
    assert [status for status, _ in parts] == ["FINISHED"], f"{name}: expected one continued MLflow run: {parts}"
    union = parts[0][1]
    for k, v in union.items():
        assert k in ref, f"{name}: metric {k} was logged but not by the uninterrupted run"
        assert v == ref[k], f"{name}: metric {k}: {v} != uninterrupted {ref[k]}"
    missing = sorted(set(ref) - set(union))
    assert not missing, f"{name}: metrics of the uninterrupted run never logged: {missing[:10]}"
    steps = sorted({s for _, s in ref})
    # 2. final weights and optimizer state, bitwise
    assert not [p.name for p in (dirs[name] / "checkpoints").iterdir() if p.name.startswith("last-")]
    a, b = _ckpt(ref_dir / "checkpoints" / "last.ckpt"), _ckpt(dirs[name] / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == MAX_STEPS
    max_diff = 0.0
    for k, t in a["state_dict"].items():
        u = b["state_dict"][k]
        max_diff = max(max_diff, (t.double() - u.double()).abs().max().item() if t.numel() else 0.0)
        assert torch.equal(t, u), f"{name}: weight {k} differs"
    for (k, sa), sb in zip(a["optimizer_states"][0]["state"].items(), b["optimizer_states"][0]["state"].values()):
        for field in sa:
            assert torch.equal(torch.as_tensor(sa[field]), torch.as_tensor(sb[field])), (
                f"{name}: optimizer state {k}.{field} differs")
    assert a["lr_schedulers"] == b["lr_schedulers"]
    # 3. prompts: the same batches, in order, each once
    la, lb = _ledger(ref_dir), _ledger(dirs[name])
    assert [r["step"] for r in la] == list(range(BATCHES))
    assert lb == la, f"{name}: consumed prompts differ from the uninterrupted run"
    ids = [pid for r in lb for pid in r["prompt_ids"]]
    assert len(ids) == len(set(ids)), f"{name}: a prompt was repeated"
    order = [json.loads(x) for x in (dirs[name] / "prompt_order.jsonl").read_text().splitlines()[1:]]
    assert ids == order[: len(ids)], f"{name}: prompts skipped or out of order"
    summary = {
        "run": name,
        "optimizer_updates": b["global_step"],
        "metric_points": len(ref),
        "metric_steps": f"{steps[0]}..{steps[-1]}",
        "final_weight_max_abs_diff": max_diff,
        "prompts_consumed": len(ids),
        "after_fault": runs["after_fault"].get(name),
        "mlflow_runs_after_resume": _runs(dirs[name]),
        "checkpoints_after_resume": sorted(p.name for p in (dirs[name] / "checkpoints").iterdir()),
    }
    print(f"[resume] {json.dumps(summary)}")
    return summary


def test_sigkill_mid_run_then_resume_matches_uninterrupted(runs):
    assert runs["rc1"]["kill"] == -signal.SIGKILL
    after = runs["after_fault"]["kill"]
    # the checkpoint is the last completed rollout batch before the kill
    assert after["last_step"] == (KILL_STEP // MU) * MU
    assert [status for _, status in after["mlflow_runs"]] == ["RUNNING"]  # what kill -9 leaves: continued
    _compare(runs, "kill")


def test_sigterm_saves_at_batch_end_and_exits_cleanly_then_resume_matches(runs):
    assert runs["rc1"]["term"] == 0, (runs["dirs"]["term"] / "run.log").read_text()[-3000:]
    after = runs["after_fault"]["term"]
    # the signal arrived before update TERM_STEP + 1: that rollout batch is finished, saved, and no more
    assert after["last_step"] == (TERM_STEP // MU + 1) * MU
    assert after["ledger_lines"] == TERM_STEP // MU + 1
    assert "SIGTERM: saved" in (runs["dirs"]["term"] / "run.log").read_text()
    assert [status for _, status in after["mlflow_runs"]] == ["KILLED"]  # stopped as asked, resumable
    _compare(runs, "term")


def test_sigkill_during_checkpoint_write_keeps_previous_checkpoint(runs):
    assert runs["rc1"]["savekill"] == -signal.SIGKILL
    after = runs["after_fault"]["savekill"]
    assert after["last_step"] == SAVEKILL_STEP - MU  # the previous checkpoint, intact and loadable
    assert not [f for f in after["files"] if f.startswith("last") and f != "last.ckpt"]
    _compare(runs, "savekill")


@pytest.fixture(scope="module")
def dr_runs(tmp_path_factory):
    if not DR_LANDED:
        pytest.skip("double-rollout configs (conf/double_rollout.yaml, tests/tiny_dr_overlay.yaml) not in the tree yet")
    base = tmp_path_factory.mktemp("resume_dr")
    dirs = {"dr_ref": base / "ref", "dr_kill": base / "kill"}
    t0 = time.time()
    ref = _start(dirs["dr_ref"], algo="double_rollout")
    kill = _start(dirs["dr_kill"], [f"{{class_path: rel_faults.KillAt, init_args: {{step: {DR_KILL_STEP}, "
                                    f"sig: SIGKILL}}}}"], algo="double_rollout")
    rc_kill = kill.wait(timeout=900)
    after = {"dr_kill": {
        "last_step": (_ckpt(dirs["dr_kill"] / "checkpoints" / "last.ckpt")["global_step"]
                      if (dirs["dr_kill"] / "checkpoints" / "last.ckpt").exists() else None),
        "ledger_lines": len(_ledger(dirs["dr_kill"])),
    }}
    resumed = _start(dirs["dr_kill"], resume=True, algo="double_rollout")  # while the reference still runs
    rc1 = {"dr_ref": ref.wait(timeout=900), "dr_kill": rc_kill}
    rc2 = _wait({"dr_kill": resumed})
    print(f"[resume] double-rollout: exit statuses {rc1} then {rc2}; wall time {time.time() - t0:.0f}s; "
          f"kill before update {DR_KILL_STEP + 1}")
    return {"dirs": dirs, "rc1": rc1, "rc2": rc2, "after_fault": after}


DR_KILL_STEP = random.Random(SEED + 1).randrange(MU + 1, MAX_STEPS)


def test_double_rollout_sigkill_then_resume_matches_uninterrupted(dr_runs):
    assert dr_runs["rc1"]["dr_kill"] == -signal.SIGKILL
    assert dr_runs["after_fault"]["dr_kill"]["last_step"] == (DR_KILL_STEP // MU) * MU
    _compare(dr_runs, "dr_kill", ref_name="dr_ref")
