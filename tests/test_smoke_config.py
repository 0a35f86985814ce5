"""The README's smoke command (conf/smoke.yaml on conf/erils.yaml) runs the whole pipeline in well under a
minute here and ends with one line that gives the final greedy accuracy (callbacks.FinalValidation and the fit
summary of lit_rl.lightning_cli)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_smoke_run_ends_with_its_accuracy(tmp_path):
    cmd = [sys.executable, "-m", "lit_rl", "fit", "--config", str(ROOT / "conf/erils.yaml"),
           "--config", str(ROOT / "conf/smoke.yaml"),
           f"--data.init_args.pool_path={ROOT}/data/pools/sudoku_grid.jsonl.gz"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    m = re.search(r"fit ended at step 8: .*val/sudoku/greedy/accuracy (\d\.\d+)", out)
    assert m, out[-2000:]
    assert 0.0 < float(m.group(1)) < 1.0
    assert "run folder runs/smoke" in out and (tmp_path / "runs/smoke/checkpoints/last.ckpt").is_file()
    assert (tmp_path / "runs/mlflow.db").is_file() and not (tmp_path / "mlruns").exists()
    # the same command again: the smoke config starts over (overwrite: true) instead of refusing its own folder
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--overwrite: removed the earlier run's" in again.stdout + again.stderr
