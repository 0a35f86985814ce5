"""A sweep as a researcher opens it in MLflow, in a real Chromium: a tiny three-trial study (tests/support/
sweeps.py), then ``mlflow server`` on its store, then

* the **compare view** of the trials: its parallel-coordinates plot preselects ``sweep/objective`` (not a
  training metric) against the params the sweep varied (not the trial folder or run name, which differ in
  every trial but are tags now);
* the **runs list** at the address the sweep prints: the study's runs only, ``sweep/objective`` as the first
  column, sorted best first, the parent row carrying the best value.

The screenshots are kept as ``tests/artifacts/mlflow_sweep_{compare,runs}.png`` (docs/img/ holds copies).
"""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest

from lit_rl.sweep import SweepConfig, run_sweep
from lit_rl.sweep.mlflow_study import StudyTracker

from support.browser import chromium_or_skip, dump_and_shoot  # noqa: E402
from support.mlflow_server import MlflowServer  # noqa: E402
from support.sweeps import ROOT  # noqa: E402
from support.sweeps import sweep_runs as _runs  # noqa: E402
from support.sweeps import tiny_sweep as _cfg  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]
VARIED = ("data.init_args.g_ext", "data.init_args.g_on", "model.init_args.optimizer.init_args.lr")


def _plotted_axes(html: str) -> list[str]:
    """The parallel-coordinates plot's axis titles (plotly's ``<text class="axis-title">``), left to right."""
    return re.findall(r'<text[^>]*class="axis-title"[^>]*>([^<]+)</text>', html)


def test_the_compare_view_and_runs_list_put_the_objective_first(tmp_path, monkeypatch):
    chromium = chromium_or_skip()
    monkeypatch.chdir(ROOT)
    cfg = SweepConfig.from_dict(_cfg(tmp_path, study_name="view"))
    study = run_sweep(cfg)
    values = [t.value for t in study.trials if t.value is not None and t.state.name == "COMPLETE"]
    parents, children = _runs(tmp_path, "view")
    server = MlflowServer(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "server")
    server.start()
    try:
        exp = parents[0].info.experiment_id
        ids = [children[n].info.run_id for n in sorted(children)]
        query = urllib.parse.urlencode({"runs": json.dumps(ids), "experiments": json.dumps([exp])})
        html = dump_and_shoot(chromium, tmp_path, f"{server.uri}/#/compare-runs?{query}", "mlflow_sweep_compare")
        axes = _plotted_axes(html)
        assert axes == [*VARIED, "sweep/objective"], axes  # three differing params (alphabetical), the metric
        assert "trainer.default_root_dir" not in html.split("Run details")[0]

        tracker = StudyTracker(cfg)
        url = tracker.view_url().split(" ")[0].replace("http://127.0.0.1:5000", server.uri)
        html = dump_and_shoot(chromium, tmp_path, url, "mlflow_sweep_runs")
        assert 'data-testid="sort-select-dropdown"' in html and "Sort: sweep/objective" in html  # sorted by it
        header = html[html.index("Run Name"):]
        # the grid's columns in display order (aria-colindex counts the hidden ones too)
        shown = sorted((int(i), c) for i, c in set(re.findall(
            r'aria-colindex="(\d+)"[^>]*col-id="((?:metrics|params)\.`[^`]+`)"', header)))
        assert [c for _, c in shown][:3] == ["metrics.`sweep/objective`", "metrics.`val/sudoku/greedy/accuracy`",
                                             "params.`data.init_args.g_ext`"], shown
        names = re.findall(r">(study:view|view-trial-\d)<", header)
        assert sorted(set(names)) == ["study:view", "view-trial-0", "view-trial-1", "view-trial-2"], names
        # the parent row carries the best value (the objective column's cell in the study's row)
        assert parents[0].data.metrics["sweep/objective"] == max(values)
    finally:
        server.stop()
        server.cleanup()
