"""lit_rl/models/remote_compat.py against the OFFICIAL LLaDA-8B-Instruct remote code (tiny random checkpoint built
from it): the official files load on the installed transformers through the shim, the mask id comes from
``config.json`` and must index the vocabulary, a model that still fails names the fix, and each folder loads its own
code although the official one registers "llada" for the process (the native LLaDA against the same checkpoint:
test_llada_reference.py; the official Dream code through the shim: test_dream_reference.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lit_rl.models import PretrainedDiffusionLM
from lit_rl.models.remote_compat import RemoteCodeError, load_remote_model
from support.reference import left_padded, tiny_official_llada


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """Folder of a tiny random checkpoint written by the official remote code."""
    return tiny_official_llada(tmp_path_factory.mktemp("official_llada"))


def test_official_code_needs_the_shim_on_transformers_5(official):
    import transformers
    from transformers import AutoModel

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4.x loads the official files unmodified")
    with pytest.raises((AttributeError, TypeError)):
        AutoModel.from_pretrained(official, trust_remote_code=True, dtype=torch.float32)
    model = load_remote_model(str(official), dtype=torch.float32)
    assert type(model).__name__ == "LLaDAModelLM" and type(model).__module__.startswith("transformers_modules")
    rows, ids, _ = left_padded()
    assert model(input_ids=ids).logits.shape == (3, 11, 128)


def test_shim_loads_the_saved_weights_and_saves_the_official_auto_map(official, tmp_path):
    from safetensors.torch import load_file

    model = load_remote_model(str(official), dtype=torch.float32)
    saved = load_file(official / "model.safetensors")
    state = model.state_dict()
    assert saved.keys() == state.keys()
    assert all(torch.equal(saved[k], state[k]) for k in saved)
    model.save_pretrained(tmp_path / "resaved")
    cfg = json.loads((tmp_path / "resaved/config.json").read_text())
    assert cfg["auto_map"]["AutoModel"] == "modeling_llada.LLaDAModelLM"
    assert (tmp_path / "resaved/modeling_llada.py").exists()  # the remote code travels with the save


def test_mask_id_null_reads_config_mask_token_id(official):
    policy = PretrainedDiffusionLM(str(official), mask_id=None, eos_id=None, dtype="float32")
    assert policy.tokenizer.mask_token_id is None  # like the official tokenizer
    assert policy.mask_id == 2 == json.loads((official / "config.json").read_text())["mask_token_id"]


def test_mask_id_outside_the_vocabulary_names_the_field(official, tmp_path):
    copy = shutil.copytree(official, tmp_path / "nomask")
    cfg = json.loads((copy / "config.json").read_text())
    cfg.pop("mask_token_id")  # the official config class then defaults it to 50256
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError,
                       match=r"policy.mask_id \(config.json's mask_token_id\) = 50256 is outside the vocabulary"):
        PretrainedDiffusionLM(str(copy), mask_id=None, eos_id=None, dtype="float32")
    with pytest.raises(ValueError, match=r"policy.mask_id = 126336 is outside the vocabulary .* \(128 ids\)"):
        PretrainedDiffusionLM(str(official), mask_id=126336, eos_id=None, dtype="float32")


def test_still_incompatible_remote_code_raises_an_error_naming_the_fix(official, tmp_path):
    copy = shutil.copytree(official, tmp_path / "broken")
    code = (copy / "modeling_llada.py").read_text()
    marker = "        if not model:\n"
    assert marker in code
    (copy / "modeling_llada.py").write_text(
        code.replace(marker, "        config.lit_rl_missing_attribute\n" + marker, 1))
    with pytest.raises(RemoteCodeError, match=r"LLaDAModelLM.*transformers .*lit_rl_missing_attribute.*NativeLLaDA"):
        load_remote_model(str(copy), dtype=torch.float32)


def test_official_code_registering_llada_globally_does_not_capture_other_llada_folders(official):
    """Importing the official modeling file registers "llada" with AutoConfig/AutoModel for the process; lit_rl
    resolves each folder's own auto_map, so lit_rl's own LLaDA-style fixture still loads its own code."""
    from support.reference import ROOT

    load_remote_model(str(official), dtype=torch.float32)  # imports (and registers) the official code
    fixture = load_remote_model(str(ROOT / "tests/fixtures/tiny_llada"), dtype=torch.float32)
    assert type(fixture).__module__.endswith("modeling_tinyllada")
    assert type(fixture.config).__module__.endswith("configuration_tinyllada")
