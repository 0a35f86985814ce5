"""The real pretrained model of the real-model tests: SmolLM2-135M-Instruct, prepared by ``scripts/setup.sh dev``
(``python -m lit_rl models prepare smollm2-135m-instruct``). Elsewhere the tests skip saying how to prepare it;
under ``CI=true`` a missing model is a failure (CI's setup prepares it, so a skip there would hide a broken step)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"


def prepared_folder() -> Path:
    """Where the model is prepared for the suite: ``$LIT_RL_MODELS/<name>`` if set, else the repository's
    ``runs/cache/models/<name>`` (what ``scripts/setup.sh dev`` writes), wherever the test runs from."""
    env = os.environ.get("LIT_RL_MODELS")
    return Path(env) / NAME if env else ROOT / "runs" / "cache" / "models" / NAME


def prepared_or_skip() -> Path:
    from lit_rl.models.prepare import read_manifest

    folder = prepared_folder()
    if read_manifest(folder) is None:
        why = (f"{NAME} is not prepared in {folder}: run scripts/setup.sh dev (or python -m lit_rl models prepare "
               f"{NAME})")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return folder


def text_length_reward(prompts, completions, **kwargs):
    """A TRL-style reward that varies within every group (characters / 100): a few-token test fit gets no task reward,
    and an update only moves the adapters when advantages are not all zero."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 100 for t in texts]
