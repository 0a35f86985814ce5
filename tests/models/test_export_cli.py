"""lit_rl/models/export_cli.py: ``python -m lit_rl export`` on bad inputs is one ``error:`` line and exit 2.

``export`` of a missing checkpoint names the checkpoint (not a missing config.yaml); ``export --out`` onto a file is
refused and leaves the file as it was. (What an export writes: tests/models/test_export_ar.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "robustness"))
from test_bad_inputs_commands import _run  # noqa: E402  (the bad-input suite's runner: cli.main, stderr lines)


def test_export_of_a_missing_checkpoint_names_the_checkpoint(tmp_path):
    rc, lines = _run(["export", "--ckpt_path", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "out")])
    assert rc == 2 and lines == [f"error: checkpoint not found: {tmp_path / 'nope.ckpt'} (--ckpt_path)"], lines
    assert not (tmp_path / "out").exists()


def test_export_onto_an_existing_file_is_refused(tmp_path):
    ckpt, out = tmp_path / "last.ckpt", tmp_path / "model.bin"
    ckpt.write_bytes(b"x")
    out.write_text("keep me")
    rc, lines = _run(["export", "--ckpt_path", str(ckpt), "--out", str(out)])
    assert rc == 2 and len(lines) == 1 and f"--out {out} is a file" in lines[0], lines
    assert out.read_text() == "keep me"
