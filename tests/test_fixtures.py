"""The committed remote-code fixtures (tests/fixtures/tiny_llada, tiny_dream) are exactly what their
generator scripts write: weights, tokenizer and config byte for byte, so a fixture is never edited by hand
out of step with its script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_generator_reproduces_the_committed_fixture(name, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(FIXTURES / f"make_tiny_{name}.py"), "--out", str(tmp_path)], check=True, env=env, capture_output=True)
    committed = sorted(p.name for p in (FIXTURES / f"tiny_{name}").iterdir() if p.is_file())
    assert "model.safetensors" in committed and "tokenizer.json" in committed
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == committed
    for file in committed:
        assert (tmp_path / file).read_bytes() == (FIXTURES / f"tiny_{name}" / file).read_bytes(), file
