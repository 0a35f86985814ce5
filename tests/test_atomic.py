"""Atomic writes (lit_rl/atomic.py): the target is the old file or the complete new one, never a part."""

from __future__ import annotations

import pytest

from lit_rl.atomic import atomic_savefig, atomic_write, atomic_write_text


def test_text_replaces_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "report.md"
    atomic_write_text(path, "old ü")
    atomic_write_text(path, "new")
    assert path.read_text(encoding="utf-8") == "new"
    assert [p.name for p in path.parent.iterdir()] == ["report.md"]


def test_a_writer_that_fails_midway_keeps_the_old_file(tmp_path):
    path = tmp_path / "table.csv"
    atomic_write_text(path, "a,b\n1,2\n")

    def half(fh):
        fh.write(b"a,b\n3,")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half)
    assert path.read_text() == "a,b\n1,2\n" and [p.name for p in tmp_path.iterdir()] == ["table.csv"]


def test_a_killed_writers_temp_file_is_cleaned_by_the_next_write(tmp_path):
    path = tmp_path / "x.json"
    (tmp_path / ".x.json.abc123.partial").write_text("{")  # what a SIGKILL mid-write leaves behind
    atomic_write_text(path, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_savefig_writes_a_png_by_its_suffix(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = atomic_savefig(fig, tmp_path / "curve.png", dpi=50)
    plt.close(fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


@pytest.mark.parametrize("umask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_respect_the_umask_as_open_does(tmp_path, umask, want):
    """Every file the atomic writer makes (checkpoints, predictions, pools, reports) gets ``0o666 & ~umask``,
    as ``open()`` gives; ``tempfile.mkstemp`` alone made them all ``-rw-------``."""
    import os

    from lit_rl.checkpoint_io import atomic_torch_save

    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "report.md", "x")
        atomic_torch_save({"a": 1}, tmp_path / "last.ckpt")
        with open(tmp_path / "plain.txt", "w") as fh:  # what the writer must match
            fh.write("x")
    finally:
        os.umask(old)
    for name in ("report.md", "last.ckpt", "plain.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == want, name


def test_a_rewrite_keeps_the_files_mode(tmp_path):
    path = tmp_path / "pool.jsonl"
    atomic_write_text(path, "a")
    path.chmod(0o640)
    atomic_write_text(path, "b")
    assert path.stat().st_mode & 0o777 == 0o640 and path.read_text() == "b"


def test_a_concurrent_writers_temp_file_is_left_alone_and_a_dead_ones_removed(tmp_path):
    """Two reproduce jobs filling one warm-up cache at once: the second write used to delete the first's in-flight
    temp file as stale, and the first failed on its os.replace (seen in tests/reproduce/test_dr.py)."""
    import subprocess
    import sys

    from lit_rl.atomic import atomic_write

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        running = tmp_path / f".w.pt.{live.pid}.abc.partial"
        gone = tmp_path / f".w.pt.{dead.pid}.def.partial"
        running.write_text("in flight")
        gone.write_text("killed")
        atomic_write(tmp_path / "w.pt", lambda fh: fh.write(b"new"))
        assert running.exists() and not gone.exists() and (tmp_path / "w.pt").read_bytes() == b"new"
    finally:
        live.kill()
        live.wait()
