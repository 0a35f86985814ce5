"""The committed remote-code fixtures (tests/fixtures/tiny_llada, tiny_dream) are exactly what their
generator scripts write: weights, tokenizer and config byte for byte, so a fixture is never edited by hand
out of step with its script. The scripts' ``make`` runs in-process (the scripts import their shared helper
from their own folder, as when run as ``python tests/fixtures/make_tiny_<name>.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_generator_reproduces_the_committed_fixture(name, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    spec = importlib.util.spec_from_file_location(f"make_tiny_{name}", FIXTURES / f"make_tiny_{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.make(tmp_path)
    committed = sorted(p.name for p in (FIXTURES / f"tiny_{name}").iterdir() if p.is_file())
    assert "model.safetensors" in committed and "tokenizer.json" in committed
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == committed
    for file in committed:
        assert (tmp_path / file).read_bytes() == (FIXTURES / f"tiny_{name}" / file).read_bytes(), file
