"""Sweep throughput with 1, 2, ... workers on one PostgreSQL study, logging to an MLflow tracking server.

One run (the recipe: README "Many workers", docs/sweeps_postgres.md):

* starts a throwaway PostgreSQL server (tests/support/postgres.py: Debian's binaries, a fresh cluster in a
  temporary folder, as the ``postgres`` OS user under root) and, unless ``--tracking sqlite``, a real
  ``mlflow server`` whose backend store is a database of it (tests/support/mlflow_server.py);
* for each worker count N of ``--workers``: a fresh study database, a sweep YAML of ``--trials`` tiny trials
  (a grid over ``seed_everything``, so every trial costs the same: conf/erils.yaml + tests/tiny_overlay.yaml,
  4 optimizer steps, the scripted Sudoku pool, ``--threads`` torch threads per trial), then N processes
  ``python -m lit_rl sweep --config <that YAML>`` launched together, as a shell loop would;
* measures the wall time from the first launch to the last exit (worker start-up included: each worker
  imports torch and Lightning), the trials COMPLETE (read back from Optuna), trials per minute, and the
  speed-up over 1 worker; besides, the start-up (launch to the first trial's start), trials per minute from
  the first trial's start to the last one's end, the mean trial time, and how many trials each worker ran
  (all from Optuna's trial timestamps). With trials of a few seconds the start-up weighs heavily;
  ``--max-steps`` makes trials longer.

It prints a table and, last, one JSON line with every figure and the machine's CPU count and load average
at the start and the end (a busy machine makes the figures meaningless: check them). Servers, workers and
temporary folders are removed on exit, Ctrl-C and SIGTERM included (``--keep`` keeps the folder: logs,
sweep YAMLs).

    python benchmarks/sweep_workers.py                    # 8 trials, 1 and 2 workers, MLflow server
    python benchmarks/sweep_workers.py --quick            # 2 trials: what tests/benchmarks runs
    python benchmarks/sweep_workers.py --workers 1,2,4 --trials 16 --tracking sqlite

A benchmark, not a test: its figures are this machine's at this moment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"
if str(ROOT) not in sys.path:  # tests/support: the throwaway servers
    sys.path.insert(0, str(ROOT))


class ServerUnavailable(RuntimeError):
    """PostgreSQL or the MLflow server could not start here (the message says why)."""


def _sweep_yaml(study: str, storage: str, tracking_uri: str, args, out: Path) -> dict:
    trainer = {"enable_progress_bar": False}
    if args.max_steps is not None:
        trainer["max_steps"] = args.max_steps
    return {
        "study_name": study,
        "base": [str(ROOT / "conf/erils.yaml"), str(ROOT / "tests/tiny_overlay.yaml")],
        "overrides": {
            "threads": args.threads,
            "data": {"init_args": {"pool_path": str(POOL)}},
            "trainer": trainer,
        },
        "space": {"seed_everything": {"type": "categorical", "choices": list(range(args.trials))}},
        "objective": {"metric": "val/sudoku/greedy/accuracy", "direction": "maximize"},
        "sampler": {"name": "grid"},
        "pruner": {"name": "none"},
        "storage": storage,
        "tracking_uri": tracking_uri,
        "output_dir": str(out),
        "heartbeat_interval": 5,
        "grace_period": 120,  # no live worker is declared stale on a loaded machine: every trial counts once
    }


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it spawned (ddp_spawn ranks)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _measure(n: int, args, pg, tracking_uri: str, folder: Path, procs: list[subprocess.Popen]) -> dict:
    """One worker count: fresh study database, N workers launched together, figures read back from Optuna."""
    import optuna
    import yaml

    folder.mkdir(parents=True)
    study = f"bench-w{n}"
    storage = pg.create_database(f"study_w{n}")
    config = folder / "sweep.yaml"
    config.write_text(yaml.safe_dump(_sweep_yaml(study, storage, tracking_uri, args, folder / "out")))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    logs = [folder / f"worker{i}.log" for i in range(n)]
    mine: list[subprocess.Popen] = []
    t0, wall0 = time.monotonic(), time.time()
    for log in logs:
        with open(log, "wb") as fh:
            p = subprocess.Popen([sys.executable, "-m", "lit_rl", "sweep", "--config", str(config)], cwd=ROOT,
                                 env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        mine.append(p)
        procs.append(p)
    exits: dict[int, float] = {}
    timed_out = False
    while len(exits) < n:
        for i, p in enumerate(mine):
            if i not in exits and p.poll() is not None:
                exits[i] = time.monotonic() - t0
        if len(exits) < n and time.monotonic() - t0 > args.timeout:
            timed_out = True
            _kill(mine)
            for i, p in enumerate(mine):
                exits.setdefault(i, time.monotonic() - t0)
            break
        time.sleep(0.2)
    wall = max(exits.values())
    rcs = [p.returncode for p in mine]
    for i, rc in enumerate(rcs):
        if rc != 0:
            print(f"worker {i} of {n} exited {rc}{' (timed out)' if timed_out else ''}; log tail "
                  f"({logs[i]}):\n{_tail(logs[i])}", file=sys.stderr)

    try:
        trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # no worker got as far as creating the study (their logs are above)
        trials = []
    states = {s.name: sum(t.state == s for t in trials) for s in optuna.trial.TrialState}
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    by_worker: dict[str, int] = {}
    for t in done:
        by_worker[t.user_attrs.get("worker", "?")] = by_worker.get(t.user_attrs.get("worker", "?"), 0) + 1
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in done]
    starts = [t.datetime_start.timestamp() - wall0 for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete.timestamp() - wall0 for t in done]
    span = max(ends) - min(starts) if done else None  # first trial's start to last trial's end: no start-up
    return {
        "workers": n,
        "wall_s": round(wall, 2),
        "complete": len(done),
        "states": {k: v for k, v in states.items() if v},
        "trials_per_min": round(len(done) / wall * 60, 3) if wall > 0 else None,
        "per_worker": sorted(by_worker.values(), reverse=True) + [0] * (n - len(by_worker)),
        "mean_trial_s": round(sum(durations) / len(durations), 2) if durations else None,
        "first_trial_start_s": round(min(starts), 2) if starts else None,  # worker start-up: imports, study join
        "trial_span_s": round(span, 2) if span is not None else None,
        "trials_per_min_in_span": round(len(done) / span * 60, 3) if span else None,
        "worker_exit_s": [round(exits[i], 2) for i in range(n)],
        "worker_rc": rcs,
        "timed_out": timed_out,
        "mlflow_finished_child_runs": _finished_children(tracking_uri, study),
    }


def _finished_children(tracking_uri: str, study: str) -> int | None:
    """Child runs of the study that reached FINISHED on the tracking store (None when it cannot be read)."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri)
        exp = client.get_experiment_by_name("lit_rl-sweeps")
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`lit_rl.sweep` = '{study}'")
        return sum(r.data.tags.get("lit_rl.role") == "trial" and r.info.status == "FINISHED" for r in runs)
    except Exception as e:  # noqa: BLE001 - a figure, not the benchmark: report it and go on
        print(f"could not read the MLflow runs of {study}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def _start_servers(tracking: str, folder: Path):
    """The PostgreSQL server and, for ``tracking == "server"``, the MLflow server (its start-up seconds)."""
    from tests.support.postgres import PostgresServer

    pg = mlflow = None
    what = "PostgreSQL"
    try:
        import psycopg  # noqa: F401 - the driver the storage URL names

        pg = PostgresServer()
        pg.start()
        if tracking == "server":
            from tests.support.mlflow_server import MlflowServer

            what = "the mlflow server"
            (folder / "mlflow").mkdir()
            mlflow = MlflowServer(pg.create_database("mlflow"), root=folder / "mlflow")
            return pg, mlflow, mlflow.start()
        return pg, None, None
    except Exception as e:  # noqa: BLE001 - any reason is reported, by name
        if mlflow is not None:
            mlflow.cleanup()
        if pg is not None:
            pg.cleanup()
        raise ServerUnavailable(f"{what} could not start: {type(e).__name__}: {e}") from e


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2)")
    ap.add_argument("--trials", type=int, default=None, help="trials per study (grid points; default 8)")
    ap.add_argument("--tracking", choices=["server", "sqlite"], default="server",
                    help="an MLflow server on the PostgreSQL (default), or one sqlite:/// file per study")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trial (the training config's threads)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="optimizer steps per trial (default: tests/tiny_overlay.yaml's 4); longer trials make "
                         "worker start-up a smaller share of the wall time")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per worker count before its workers are killed (default 3600; quick 480)")
    ap.add_argument("--quick", action="store_true", help="2 trials, workers 1,2: a check that it runs, not a figure")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (worker logs, sweep YAMLs)")
    args = ap.parse_args(argv)
    args.workers = [int(w) for w in (args.workers or "1,2").split(",")]
    args.trials = args.trials or (2 if args.quick else 8)
    args.timeout = args.timeout or (480.0 if args.quick else 3600.0)
    if min(args.workers) < 1 or args.trials < 1:
        ap.error("--workers and --trials must be >= 1")

    load_start = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="lit_rl_sweep_bench_"))
    procs: list[subprocess.Popen] = []
    pg = mlflow = None
    try:
        pg, mlflow, mlflow_start_s = _start_servers(args.tracking, folder)
        rows = []
        for n in args.workers:
            uri = mlflow.uri if mlflow is not None else f"sqlite:///{folder}/w{n}_mlflow.db"
            rows.append(_measure(n, args, pg, uri, folder / f"w{n}", procs))
            print(f"{n} worker(s): {rows[-1]['complete']} trials COMPLETE in {rows[-1]['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
    finally:
        _kill(procs)
        if mlflow is not None:
            mlflow.cleanup()
        if pg is not None:
            pg.cleanup()
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    load_end = os.getloadavg()

    base = next((r["trials_per_min"] for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["speedup"] = round(r["trials_per_min"] / base, 3) if base and r["trials_per_min"] is not None else None
    steps = args.max_steps if args.max_steps is not None else 4
    print(f"{args.trials} tiny trials per study (conf/erils.yaml + tests/tiny_overlay.yaml, {steps} steps, "
          f"{args.threads} thread(s) each); study on PostgreSQL; tracking: "
          f"{'mlflow server on PostgreSQL' if args.tracking == 'server' else 'sqlite file'}; "
          f"{os.cpu_count()} CPUs, load {load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    print(f"{'workers':>7} {'wall s':>8} {'trials':>7} {'trials/min':>11} {'speedup':>8} {'start-up s':>11} "
          f"{'trials/min after start-up':>26} {'mean trial s':>13} {'per worker':>11}")

    def fmt(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for r in rows:
        print(f"{r['workers']:>7} {r['wall_s']:>8.1f} {r['complete']:>7} {fmt(r['trials_per_min'], '.2f'):>11} "
              f"{fmt(r['speedup'], '.2f') + ('x' if r['speedup'] is not None else ''):>8} "
              f"{fmt(r['first_trial_start_s'], '.1f'):>11} {fmt(r['trials_per_min_in_span'], '.2f'):>26} "
              f"{fmt(r['mean_trial_s'], '.1f'):>13} {'/'.join(map(str, r['per_worker'])):>11}")
    summary = {
        "benchmark": "sweep_workers",
        "trials": args.trials,
        "tracking": args.tracking,
        "threads_per_trial": args.threads,
        "max_steps_per_trial": steps,
        "mlflow_server_start_s": round(mlflow_start_s, 1) if mlflow_start_s is not None else None,
        "runs": rows,
        "machine": {
            "cpu_count": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in load_end],
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    print(json.dumps(summary))
    return summary


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally: workers and servers are stopped


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        main()
    except ServerUnavailable as e:
        sys.exit(f"error: {e}")
