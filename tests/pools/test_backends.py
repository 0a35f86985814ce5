"""Backends of the pool builder: vLLM through a fake module, a tiny HF Llama, the scripted solver, and the YAML
registry (the OpenAI-compatible client's tests are in test_openai_client.py)."""

import sys
import types

import pytest

from lit_rl.pools.backends import (
    BackendError,
    GenRequest,
    HFPoolBackend,
    Sampling,
    ScriptedBackend,
    VLLMPoolBackend,
    build_backend,
)
from lit_rl.tasks import get_task

PUZZLE = "1030000400232001"
MESSAGES = [{"role": "user", "content": f"Solve the following Sudoku puzzle: {PUZZLE}\n"}]


def _reqs(k=1):
    return [GenRequest(MESSAGES, seed=100 + i, group=f"p{i}") for i in range(k)]


# -- vLLM offline engine (fake module) ------------------------------------------------------------------
def test_vllm_backend_with_fake_module(monkeypatch):
    calls = {}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, model, **kw):
            calls["init"] = (model, kw)

        def get_tokenizer(self):
            return "tok"

        def chat(self, conversations, sampling_params, use_tqdm, **kw):
            calls.setdefault("chat", []).append((len(conversations), [p.kw for p in sampling_params], kw))
            out = types.SimpleNamespace
            return [out(outputs=[out(text=f"t{p.kw['seed']}", finish_reason="stop", token_ids=[1, 2, 3])])
                    for p in sampling_params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    be = build_backend({"type": "vllm", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "tensor_parallel_size": 8,
                        "batch_size": 2, "chat_template_kwargs": {"enable_thinking": False}})
    got = []
    res = be.generate(_reqs(3), Sampling(temperature=1.0, max_tokens=4096), on_result=lambda i, r: got.append(i))
    assert [r.text for r in res] == ["t100", "t101", "t102"] and res[0].completion_tokens == 3
    assert got == [0, 1, 2]
    assert calls["init"] == ("Qwen/Qwen3-30B-A3B-Instruct-2507",
                             {"tensor_parallel_size": 8, "gpu_memory_utilization": 0.9, "dtype": "auto"})
    assert [c[0] for c in calls["chat"]] == [2, 1]  # batch_size 2
    assert calls["chat"][0][1][0] == {"n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 4096, "seed": 100}
    assert calls["chat"][0][2] == {"chat_template_kwargs": {"enable_thinking": False}}
    assert be.length_tokenizer() == "tok" and be.name == "Qwen/Qwen3-30B-A3B-Instruct-2507"


def test_vllm_backend_without_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import fails
    with pytest.raises(BackendError, match=r"pip install 'lit-rl\[vllm\]'"):
        VLLMPoolBackend("m").generate(_reqs(1), Sampling())


# -- HF generate with a tiny Llama -----------------------------------------------------------------------
def test_hf_backend_tiny_llama_is_seeded_per_group():
    be = HFPoolBackend(tiny_llama={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256},
                       batch_size=4)
    reqs = [GenRequest(MESSAGES, seed=7, group="a"), GenRequest(MESSAGES, seed=8, group="a"),
            GenRequest(MESSAGES, seed=9, group="b")]
    s = Sampling(temperature=1.0, max_tokens=12)
    res = be.generate(reqs, s)
    assert len(res) == 3 and all(r.finish_reason in ("stop", "length") for r in res)
    assert all(r.completion_tokens <= 12 for r in res)
    # the same group alone gives the same text: results do not depend on what else was in the call
    assert be.generate(reqs[2:], s)[0].text == res[2].text
    assert be.length_tokenizer().name_or_path == "lit_rl/char"
    with pytest.raises(ValueError, match="exactly one of model"):
        HFPoolBackend()


# -- scripted -------------------------------------------------------------------------------------------
def test_scripted_backend_rewrite_keeps_the_answer():
    task = get_task("sudoku", num_train=3)
    ex = task.train_examples()[0]
    be = ScriptedBackend("sudoku", error_rate=1.0, long_rate=0.0)
    first = be.generate([GenRequest([], 5, "g", ex, "generate")], Sampling())[0].text
    second = be.generate([GenRequest([], 6, "g", ex, "rewrite", first)], Sampling())[0].text
    assert len(second) < len(first) / 4
    assert second.split("<answer>")[1] == first.split("<answer>")[1]  # same (wrong) answer
    assert task.reward(first, ex) < 1.0 and task.reward(second, ex) == task.reward(first, ex)


def test_build_backend_errors_name_the_key():
    with pytest.raises(ValueError, match="backend.type='gpt'"):
        build_backend({"type": "gpt"})
    with pytest.raises(ValueError, match=r"backend: unknown option\(s\) \['temprature'\] for type 'openai'"):
        build_backend({"type": "openai", "base_url": "http://h/v1", "model": "m", "temprature": 1})
    with pytest.raises(ValueError, match="expected a mapping with 'type'"):
        build_backend({"model": "m"})
    assert isinstance(build_backend({"type": "lit_rl.pools.backends.ScriptedBackend", "task": "countdown"}),
                      ScriptedBackend)
