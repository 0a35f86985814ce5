"""The code lints clean: ``ruff check`` with the project's settings (``[tool.ruff]`` in pyproject.toml: line
length 120, pyflakes and pycodestyle, tests included). ``.ci/run`` runs it as part of the test command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["lit_rl", "datamodules", "callbacks", "tests", "benchmarks", "scripts"]


def _ruff() -> list[str] | None:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    return [exe] if exe else None


def test_ruff_check_is_clean():
    ruff = _ruff()
    if ruff is None:
        if os.environ.get("CI") == "true":
            pytest.fail("ruff is not installed (it is in the dev extras: scripts/setup.sh dev)")
        pytest.skip("ruff is not installed (pip install ruff, or scripts/setup.sh dev)")
    out = subprocess.run([*ruff, "check", "--no-cache", *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]


def test_the_settings_are_the_ones_the_project_states():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert cfg["line-length"] == 120 and {"E", "F", "W"} <= set(cfg["lint"]["select"])
