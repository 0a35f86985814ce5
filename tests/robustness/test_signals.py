"""Real signals in real fits: one ``last.ckpt`` and one MLflow run, whatever stops the run and wherever.

Tiny ERILS fits (``tests/support/resume_runs.py``: 2 updates per rollout batch, a periodic checkpoint every 4
updates, ``last.ckpt``, MLflow in sqlite). ``rel_faults.KillAt`` sends the signal(s) to the fit's own process
right before update ``step + 1``, so the rollout batch in flight ends at update ``step + 1`` or ``step + 2``:

* step 1: before the first periodic checkpoint; step 3: in a batch that ends on one (update 4); step 5: between
  two (4 and 8).
* SIGTERM and SIGINT (what Ctrl-C sends), once: the batch finishes, ``last.ckpt`` is saved, exit status 0, the
  MLflow run KILLED; ``--ckpt_path last`` then continues the same run to FINISHED. No ``last-v1.ckpt`` at any
  point (before the fix, SIGTERM at step 3 left ``last-v1.ckpt`` beside ``last.ckpt``).
* twice, at the same three places: Ctrl-C twice stops at once (exit 1, no new checkpoint, the run KILLED);
  SIGTERM twice (and ``kill -9`` before any checkpoint) ends the process (a subprocess here) and leaves the run
  RUNNING; the next fit marks it KILLED and the resume continues it, even with no checkpoint at all (before: a
  second MLflow run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from lit_rl.cli import main
from lit_rl.run_owner import FILE

from support.resume_runs import ROOT  # noqa: E402
from support.resume_runs import run_args as _args  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # rel_faults, for the KillAt class_path

pytestmark = pytest.mark.timeout(600)


def _kill(step: int, sig: str, times: int = 1) -> dict:
    return {"class_path": "rel_faults.KillAt", "init_args": {"step": step, "sig": sig, "times": times}}


def _runs(run: Path) -> list:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _ckpts(run: Path) -> dict[str, int]:
    return {p.name: torch.load(p, map_location="cpu", weights_only=True)["global_step"]
            for p in sorted((run / "checkpoints").glob("*.ckpt"))} if (run / "checkpoints").is_dir() else {}


def _loss_steps(run: Path, run_id: str) -> list[int]:
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    return sorted({m.step for m in client.get_metric_history(run_id, "train/loss")})


@pytest.fixture
def sigint_restored():
    """Lightning sets SIGINT to SIG_IGN when it handles a KeyboardInterrupt (and never restores it)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def _resume_to_the_end(run: Path, first_id: str) -> None:
    assert main(_args(run, 8, "--ckpt_path", "last")) == 0
    (after,) = _runs(run)  # one MLflow run for the whole training run
    assert after.info.run_id == first_id and after.info.status == "FINISHED"
    assert _ckpts(run) == {"epoch=0-step=8.ckpt": 8, "last.ckpt": 8}  # save_top_k 1: the newest periodic one
    assert _loss_steps(run, first_id)[-1] == 8


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("step, saved", [(1, {"last.ckpt": 2}),
                                         (3, {"epoch=0-step=4.ckpt": 4, "last.ckpt": 4}),
                                         (5, {"epoch=0-step=4.ckpt": 4, "last.ckpt": 6})])
def test_one_signal_saves_the_batch_and_the_resume_continues_the_run(tmp_path, capfd, sigint_restored, sig, step,
                                                                      saved):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main(_args(run, 8, callbacks=(_kill(step, sig),)))
    assert stop.value.code in (None, 0)
    assert _ckpts(run) == saved  # no last-v1.ckpt
    (first,) = _runs(run)
    label = "Ctrl-C" if sig == "SIGINT" else "SIGTERM"
    assert first.info.status == "KILLED"
    assert first.data.tags["lit_rl.stopped"] == f"{label} at step {saved['last.ckpt']}; resume with --ckpt_path last"
    err = capfd.readouterr().err
    if sig == "SIGINT":
        assert "Ctrl-C: finishing this rollout batch, then saving last.ckpt" in err
    _resume_to_the_end(run, first.info.run_id)


#: what a stop at once leaves: nothing before update 4, the periodic checkpoint of update 4 after it
AT_ONCE = [(1, {}), (3, {}), (5, {"epoch=0-step=4.ckpt": 4, "last.ckpt": 4})]


@pytest.mark.parametrize("step, left", AT_ONCE)
def test_ctrl_c_twice_stops_at_once_and_the_resume_continues_the_same_run(tmp_path, sigint_restored, step, left):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        main(_args(run, 8, callbacks=(_kill(step, "SIGINT", times=2),)))
    assert stop.value.code == 1
    assert _ckpts(run) == left  # stopped without saving (no last-v1.ckpt either)
    (first,) = _runs(run)
    assert first.info.status == "KILLED" and first.data.tags["lit_rl.stopped"].startswith("a second Ctrl-C at step")
    _resume_to_the_end(run, first.info.run_id)  # no checkpoint: the run folder's record names the run


@pytest.mark.parametrize("sig, times, step, left", [("SIGKILL", 1, 1, {}), *(("SIGTERM", 2, s, k) for s, k in AT_ONCE)])
def test_a_killed_process_leaves_one_run_that_the_resume_continues(tmp_path, caplog, sig, times, step, left):
    """kill -9, and a second SIGTERM (its default action), before the first checkpoint, in the batch that would
    end on one, and between two: the run is left RUNNING; the next fit marks it KILLED and continues it."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "lit_rl", *_args(run, 8, callbacks=(_kill(step, sig, times),))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -getattr(signal, sig), proc.stderr[-2000:]
    assert (run / "prompt_order.jsonl").is_file() and (run / FILE).is_file() and _ckpts(run) == left
    (first,) = _runs(run)
    assert first.info.status == "RUNNING"  # what the killed process left
    caplog.clear()
    _resume_to_the_end(run, first.info.run_id)
    said = [r.message for r in caplog.records if r.message.startswith("resume:")]
    assert any(f"MLflow run {first.info.run_id} was left RUNNING by process" in m and "marked KILLED" in m
               for m in said), said
    assert f"resume: MLflow run {first.info.run_id} continues (it was KILLED)" in said, said
