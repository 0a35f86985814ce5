"""Headless Chromium for the dashboard tests: find (or, under CI, install) Debian's ``chromium``, and run it on
a page to dump its DOM or take a screenshot. The screenshots and DOMs are kept in ``tests/artifacts/`` (a folder
that ignores itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests/artifacts"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
]
#: let the single-page app fetch its runs before the DOM is dumped or the screenshot taken
BUDGET = "--virtual-time-budget=30000"


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def chromium_or_skip() -> str:
    """The chromium binary; installed with apt under CI (``CI`` set) or ``LIT_RL_INSTALL_CHROMIUM=1``, else the
    test is skipped when none is on PATH."""
    import pytest

    path = find_chromium()
    if path is None and (os.environ.get("CI") or os.environ.get("LIT_RL_INSTALL_CHROMIUM") == "1"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        path = find_chromium()
    if path is None:
        pytest.skip("chromium is not installed (set LIT_RL_INSTALL_CHROMIUM=1 or CI=1 to install it)")
    return path


def run_chromium(binary: str, tmp: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """Chromium with a fresh profile under ``tmp`` (a saved view in one run cannot leak into the next)."""
    profile = tmp / f"profile-{time.monotonic_ns()}"
    return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


def dump_and_shoot(binary: str, tmp: Path, page: str, name: str, size: str = "1600,1000") -> str:
    """The page's DOM after it loaded (also kept as ``tests/artifacts/<name>.html``) and its screenshot
    ``tests/artifacts/<name>.png``; asserts both came out."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")
    dom = run_chromium(binary, tmp, BUDGET, f"--window-size={size}", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-3000:]
    (ARTIFACTS / f"{name}.html").write_text(dom.stdout)
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    res = run_chromium(binary, tmp, BUDGET, f"--window-size={size}", f"--screenshot={shot}", page)
    assert res.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, res.stderr[-3000:]
    return dom.stdout
