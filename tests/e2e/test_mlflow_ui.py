"""Dashboards end to end: an MLflow server on 127.0.0.1 (SQLite backend in tmp), two tiny fits logging to
it over HTTP, and headless Chromium (Debian's ``chromium``) rendering the UI's compare view of both runs:
both run names, their metrics and their parameters (the resolved config, with the one that differs
plotted) must be on the page. The screenshot is kept as
``tests/artifacts/mlflow_compare.png`` (the folder ignores itself).

Chromium is installed by this test's setup only under CI (``CI`` set) or when ``LIT_RL_INSTALL_CHROMIUM=1``;
otherwise the test is skipped when no ``chromium`` is on PATH. Run it alone with ``pytest -m browser``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support.browser import ARTIFACTS, BUDGET, chromium_or_skip  # noqa: E402
from support.browser import run_chromium as _chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("train/loss", "val/sudoku/greedy/accuracy", "train/on_policy/reward_mean")
# The compare view's metrics table is a virtualised scroll box (alphabetical, ~20 rows rendered): these are
# in its first rows; val/... sits below the fold and is checked through the server's API instead.
SHOWN = ("train/loss", "train/lr", "train/on_policy/reward_mean", "train/external/reward_mean")
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_or_skip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--artifacts-destination", str(tmp / "artifacts"),
         "--workers", "1"],
        cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).read().strip() == b"OK":
                break
        except OSError:
            assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            time.sleep(0.5)
    else:
        proc.terminate()
        pytest.fail("mlflow server did not come up:\n" + (tmp / "server.log").read_text()[-3000:])
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _fit(url: str, tmp: Path, name: str, lr: str):
    from lit_rl.cli import run_lightning_cli

    return run_lightning_cli([
        "fit",
        "--config", str(ROOT / "conf/erils.yaml"),
        "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp / name}",
        f"--trainer.logger.init_args.tracking_uri={url}",
        "--trainer.logger.init_args.experiment_name=lit_rl-browser",
        f"--trainer.logger.init_args.run_name={name}",
        f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_scripted.jsonl.gz",
        f"--model.init_args.optimizer.init_args.lr={lr}",
    ])


def test_compare_view_shows_both_runs_and_their_metrics(chromium, mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {name: _fit(mlflow_server, tmp_path, name, lr).trainer.loggers[0].run_id
            for name, lr in (("browser-erils-a", "0.0002"), ("browser-erils-b", "0.0005"))}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("lit_rl-browser")
    for run_id in runs.values():  # the server holds both runs with their metrics
        assert set(METRICS) <= set(client.get_run(run_id).data.metrics)

    query = urllib.parse.urlencode({"runs": json.dumps(list(runs.values())),
                                    "experiments": json.dumps([exp.experiment_id])})
    page = f"{mlflow_server}/#/compare-runs?{query}"
    budget = BUDGET
    size = "--window-size=1600,2000"
    dom = _chromium(chromium, tmp_path, budget, size, "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-3000:]
    html = dom.stdout
    # the runs carry their resolved config as params: the compare view plots the one that differs (lr)
    # against the metric and lists the params side by side
    params = [client.get_run(r).data.params for r in runs.values()]
    differ = {k for k in params[0] if params[0][k] != params[1].get(k)}
    assert "model.init_args.optimizer.init_args.lr" in differ and len(params[0]) > 100
    shown = ("Parameters", "model.init_args.optimizer.init_args.lr", "0.0002", "0.0005", "data.init_args.eval_size")
    missing = [s for s in ("Comparing 2 Runs from 1 Experiment", *runs, *runs.values(), *SHOWN, *shown)
               if s not in html]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")
    (ARTIFACTS / "mlflow_compare.html").write_text(html)
    shot = ARTIFACTS / "mlflow_compare.png"
    shot.unlink(missing_ok=True)
    res = _chromium(chromium, tmp_path, budget, size, f"--screenshot={shot}", page)
    assert res.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, res.stderr[-3000:]
    assert not missing, f"not in the compare view: {missing} (DOM kept in {ARTIFACTS / 'mlflow_compare.html'})"
