"""lit_rl/reproduce/runner.py: the studies' job runner (skip finished jobs, report failures, SIGTERM, progress)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lit_rl.reproduce.runner import Job, run_jobs

ROOT = Path(__file__).resolve().parents[2]


def test_runner_skips_finished_jobs_and_reports_a_failure_with_its_log(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    ok = Job("ok", ["score", "--help"], tmp_path / "ok")
    bad = Job("bad", ["fit", "--config", str(tmp_path / "missing.yaml")], tmp_path / "bad")
    lines: list[str] = []
    results = run_jobs([ok, bad], workers=2, echo=lines.append)
    assert [r.ok for r in results] == [True, False]
    assert ok.done_file.exists() and not bad.done_file.exists()  # nothing marks a failed job done
    assert "missing.yaml" in bad.log_file.read_text()
    assert any("FAILED" in line and str(bad.log_file) in line for line in lines)
    again = run_jobs([ok, bad], workers=1, echo=lines.append)
    assert again[0].skipped and not again[1].skipped  # a re-run redoes only the failed job
    # another command line in the same folder is not "done"; --threads is speed, not results
    assert Job("ok", ["score", "--help", "--threads=7"], tmp_path / "ok").is_done()
    assert not Job("ok", ["rollouts", "--help"], tmp_path / "ok").is_done()
    # exit 0 but the job's own check finds it incomplete (a sweep whose trials failed): not done
    partial = Job("partial", ["score", "--help"], tmp_path / "partial", check=lambda: "trials [1] failed")
    assert not run_jobs([partial], echo=lines.append)[0].ok and not partial.done_file.exists()
    assert "FAILED (trials [1] failed)" in lines[-1]
    # a non-zero exit says what the check found too (a sweep worker whose trials all failed exits 1), and a
    # check that cannot run (e.g. no study yet) is a reason, not a crash of the runner
    worker = Job("worker", ["fit", "--config", str(tmp_path / "missing.yaml")], tmp_path / "w",
                 check=lambda: "trials [0, 1] failed")
    assert not run_jobs([worker], echo=lines.append)[0].ok
    assert "FAILED (exit 2; trials [0, 1] failed)" in lines[-1]

    def no_study():
        raise KeyError("Record does not exist.")

    broken = Job("broken", ["score", "--help"], tmp_path / "b", check=no_study)
    assert not run_jobs([broken], echo=lines.append)[0].ok
    assert "FAILED (its check failed: KeyError: 'Record does not exist.')" in lines[-1]


def test_a_terminated_runner_terminates_its_jobs(tmp_path):
    """SIGTERM to the runner: its running job is terminated too (not left writing into the folder)."""
    import signal
    import time

    script = tmp_path / "runner.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom lit_rl.reproduce.runner import Job, run_jobs\n"
        f"run_jobs([Job('sleep', ['fit', '--help'], Path({str(tmp_path / 'job')!r}))], echo=print)\n"
    )
    # a job that runs long: `python -m lit_rl` with a stub module that sleeps
    stub = tmp_path / "stub" / "lit_rl"
    stub.mkdir(parents=True)
    (stub / "__main__.py").write_text(
        "import os, sys, time\nopen(sys.argv[0] + '.started', 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'stub'}")
    runner = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(1, {str(ROOT)!r}); "
                               f"exec(open({str(script)!r}).read())"],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = tmp_path / "stub" / "lit_rl" / "__main__.py.started"
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert started.exists(), runner.stdout.read() if runner.poll() is not None else "job never started"
    runner.send_signal(signal.SIGTERM)
    runner.wait(timeout=60)
    pid = int(started.read_text())
    for _ in range(50):  # the job is gone (terminated by the runner; the runner waited for it)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the job (pid {pid}) was left running after the runner got SIGTERM")
    assert not (tmp_path / "job" / "done.json").exists()


def test_progress_counts_over_the_whole_study(tmp_path, monkeypatch):
    """A study runs its first job alone, then the rest: the counter runs 1..total over both calls."""
    monkeypatch.chdir(ROOT)
    from lit_rl.reproduce.runner import jobs_to_run

    jobs = [Job(n, ["score", "--help"], tmp_path / n) for n in ("a", "b", "c")]
    lines: list[str] = []
    total, before = jobs_to_run(jobs), jobs_to_run(jobs[:1])  # counted before anything runs, as reproduce does
    run_jobs(jobs[:1], echo=lines.append, total=total)
    run_jobs(jobs[1:], echo=lines.append, numbered_from=before, total=total)
    starts = [line.split("(")[1].split(")")[0] for line in lines if line.startswith("[reproduce] start")]
    assert total == 3 and starts == ["1/3", "2/3", "3/3"]
    assert jobs_to_run(jobs) == 0


def test_an_unfinished_job_whose_command_line_changed_starts_over(tmp_path, monkeypatch):
    """A fit job resumes its own checkpoints (``--ckpt_path last``), but not another command line's: a job that
    started with other arguments (a changed plan) and never finished loses its checkpoints first."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    job = Job("fit_s0", ["fit", "--help"], tmp_path / "fit_s0")
    (job.folder / "checkpoints").mkdir(parents=True)
    (job.folder / "checkpoints/last.ckpt").write_bytes(b"an older command line's")
    (job.folder / "started.json").write_text('{"name": "fit_s0", "argv_sha": "0123456789abcdef"}')
    said: list[str] = []
    (result,) = run_jobs([job], echo=said.append)
    assert result.ok and not (job.folder / "checkpoints/last.ckpt").exists()
    assert any("started with another command line; removed its last.ckpt" in s for s in said), said
    # the same command line again: its own checkpoint stays (a resume)
    (job.folder / "checkpoints/last.ckpt").write_bytes(b"its own")
    job.done_file.unlink()
    run_jobs([job], echo=said.append)
    assert (job.folder / "checkpoints/last.ckpt").read_bytes() == b"its own"
