"""Backends of the pool builder: the OpenAI-compatible client against a loopback server with injected
faults (each ends in a correct retry or a clear error), vLLM through a fake module, a tiny HF Llama, the
scripted solver, and the YAML registry."""

import sys
import types

import pytest

from lit_rl.rollouts.backends import (
    BackendAuthError,
    BackendError,
    BackendRequestError,
    GenHooks,
    GenRequest,
    HFPoolBackend,
    OpenAIBackend,
    Sampling,
    ScriptedBackend,
    VLLMPoolBackend,
    build_backend,
    request_seed,
)
from lit_rl.tasks import get_task
from openai_test_server import FakeOpenAIServer, canned_completion

PUZZLE = "1030000400232001"
MESSAGES = [{"role": "user", "content": f"Solve the following Sudoku puzzle: {PUZZLE}\n"}]


def _client(url, **kw):
    opts = dict(model="fake-qwen3", concurrency=4, timeout_s=10.0, max_retries=2, backoff_s=0.01, max_backoff_s=0.05)
    opts.update(kw)
    return OpenAIBackend(url, **opts)


def _reqs(k=1):
    return [GenRequest(MESSAGES, seed=100 + i, group=f"p{i}") for i in range(k)]


def test_request_seed_is_stable_and_distinct():
    a = request_seed(42, "sudoku-train-0", 0, "generate")
    assert a == request_seed(42, "sudoku-train-0", 0, "generate")
    assert len({request_seed(42, "sudoku-train-0", j, s) for j in range(6) for s in ("generate", "rewrite")}) == 12
    assert a != request_seed(43, "sudoku-train-0", 0, "generate")
    assert 0 <= a < 2**31


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_openai_backend_answers_and_reports_usage(api):
    with FakeOpenAIServer() as srv:
        hooks = GenHooks()
        got = []
        res = _client(srv.url, api=api, tokenizer="none").generate(
            _reqs(3), Sampling(max_tokens=64), on_result=lambda i, r: got.append(i), hooks=hooks)
    assert [r.text for r in res] == [
        canned_completion(MESSAGES[0]["content"] + ("\n" if api == "completions" else ""), 100 + i) for i in range(3)]
    assert all(r.finish_reason == "stop" and r.completion_tokens == len(r.text) and r.attempts == 1 for r in res)
    assert sorted(got) == [0, 1, 2] and hooks.requests == 3 and hooks.in_flight == 0 and hooks.retries == 0


@pytest.mark.parametrize("fault", ["timeout", "500", "503", "malformed", "no_choices", "truncated", "reset",
                                   "surrogate", "huge_int", "deep"])
def test_transient_fault_is_retried_to_the_same_text(fault):
    # the first attempt of every request fails; the retry returns exactly the fault-free text
    # (generous client timeouts: the test machine may be loaded; only the injected timeout should fire)
    with FakeOpenAIServer(fault=lambda i, body, attempt: fault if attempt == 1 else None, timeout_sleep_s=4.0) as srv:
        hooks = GenHooks()
        res = _client(srv.url, timeout_s=1.5 if fault == "timeout" else 10.0, max_retries=4).generate(
            _reqs(2), Sampling(), hooks=hooks)
        assert srv.faults_sent[fault] == 2
    assert [r.text for r in res] == [canned_completion(MESSAGES[0]["content"], 100 + i) for i in range(2)]
    assert all(r.attempts >= 2 for r in res) and hooks.retries == sum(r.attempts - 1 for r in res)
    assert hooks.requests == hooks.retries + 2 and sum(hooks.retry_reasons.values()) == hooks.retries


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("timeout", "no response within timeout_s=1.5"),
        ("500", "HTTP 500: internal server error"),
        ("503", "HTTP 503: server overloaded"),
        ("malformed", "response is not JSON"),
        ("no_choices", r"lacks choices\[0\] text"),
        ("truncated", "response body cut off"),
        ("reset", "Server disconnected without sending a response"),
        ("surrogate", r"malformed: response text is not valid Unicode \(lone surrogate at character \d+\)"),
        ("huge_int", r"malformed: response JSON is unreadable \(Exceeds the limit \(4300 digits\)"),
        ("deep", "malformed: response JSON is nested too deeply"),
    ],
)
def test_persistent_fault_gives_up_after_max_retries(fault, reason):
    retries = 1 if fault == "timeout" else 2  # (timeouts are slow to test)
    with FakeOpenAIServer(fault=lambda i, body, attempt: fault, timeout_sleep_s=4.0) as srv:
        with pytest.raises(BackendError, match=f"failed after {retries + 1} attempts; last error: .*" + reason):
            _client(srv.url, timeout_s=1.5 if fault == "timeout" else 10.0, max_retries=retries).generate(
                _reqs(1), Sampling())
        assert srv.attempts[100] == retries + 1  # 1 + max_retries, then a clear error


def test_malformed_reply_error_names_the_prompt_and_endpoint():
    # a server that always answers with a lone surrogate: never written to the pool, a clear error instead
    with FakeOpenAIServer(fault=lambda i, body, attempt: "surrogate") as srv:
        with pytest.raises(BackendError, match=rf"request p0 \(seed 100\) to {srv.url}/chat/completions failed "
                           r"after 2 attempts; last error: malformed: response text"):
            _client(srv.url, max_retries=1).generate(_reqs(1), Sampling())


def test_auth_error_is_immediate_and_says_what_to_do():
    with FakeOpenAIServer(api_key="secret") as srv:
        with pytest.raises(BackendAuthError, match=r"HTTP 401 .*refused the credentials \(invalid API key\).*api_key"):
            _client(srv.url).generate(_reqs(1), Sampling())
        assert sum(srv.attempts.values()) == 1  # never retried
        res = _client(srv.url, api_key="secret").generate(_reqs(1), Sampling())
    assert res[0].text.startswith("<reasoning>")


@pytest.mark.parametrize("fault, exc, msg", [("400", BackendRequestError, "HTTP 400 .*max_tokens is too large"),
                                             ("401", BackendAuthError, "HTTP 401")])
def test_client_errors_are_not_retried(fault, exc, msg):
    with FakeOpenAIServer(fault=lambda i, body, attempt: fault) as srv:
        with pytest.raises(exc, match=msg):
            _client(srv.url, max_retries=5).generate(_reqs(3), Sampling())
        assert srv.attempts[100] == 1


def test_wrong_model_name_is_a_clear_error():
    with FakeOpenAIServer() as srv:
        with pytest.raises(BackendRequestError, match="HTTP 404 .*model `nope` does not exist"):
            _client(srv.url, model="nope").generate(_reqs(1), Sampling())


def test_unreachable_server_is_retried_then_reported():
    srv = FakeOpenAIServer().start()
    url = srv.url
    srv.stop()  # nothing listens on the port any more
    with pytest.raises(BackendError,
                       match=r"failed after 2 attempts; last error: connection: cannot reach .*Connection refused"):
        _client(url, max_retries=1).generate(_reqs(1), Sampling())


def test_length_finish_reason_is_kept_not_an_error():
    with FakeOpenAIServer(fault=lambda i, body, attempt: "length") as srv:
        res = _client(srv.url).generate(_reqs(1), Sampling(max_tokens=8))
    assert res[0].finish_reason == "length" and res[0].attempts == 1


def test_on_result_error_stops_the_batch():
    with FakeOpenAIServer(delay_s=0.02) as srv:
        def boom(i, r):
            raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            _client(srv.url, concurrency=2).generate(_reqs(8), Sampling(), on_result=boom)
        assert sum(srv.attempts.values()) < 8  # pending requests were cancelled


def test_the_client_is_the_openai_sdk_and_never_sends_the_environments_key(monkeypatch):
    # the SDK's own headers are on the wire; a user's OPENAI_API_KEY (for api.openai.com) is not sent to
    # the pool server: without api_key the placeholder goes, with it the configured key
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-user-key")
    with FakeOpenAIServer() as srv:
        _client(srv.url).generate(_reqs(1), Sampling())
        _client(srv.url, api_key="server-key").generate(_reqs(1), Sampling())
    first, second = srv.headers
    assert first["user-agent"].startswith("OpenAI/Python") and "x-stainless-lang" in first
    assert first["authorization"] == "Bearer EMPTY" and second["authorization"] == "Bearer server-key"


def test_sdk_retries_and_ours_share_one_budget():
    # a 503, then a malformed 200, then a good reply: three HTTP attempts, each counted once, reasons named
    faults = {1: "503", 2: "malformed"}
    with FakeOpenAIServer(fault=lambda i, body, attempt: faults.get(attempt)) as srv:
        hooks = GenHooks()
        res = _client(srv.url, max_retries=2).generate(_reqs(1), Sampling(), hooks=hooks)
        assert srv.attempts[100] == 3
    assert res[0].attempts == 3 and hooks.retries == 2 and hooks.retry_reasons == {"http_503": 1, "malformed": 1}
    with FakeOpenAIServer(fault=lambda i, body, attempt: faults.get(attempt)) as srv:
        with pytest.raises(BackendError, match="failed after 2 attempts; last error: malformed"):
            _client(srv.url, max_retries=1).generate(_reqs(1), Sampling())
        assert srv.attempts[100] == 2  # never more than max_retries + 1 attempts


def test_openai_backend_validates_its_options():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend("localhost:8000", model="m")
    with pytest.raises(ValueError, match="api='edit'"):
        OpenAIBackend("http://h/v1", model="m", api="edit")
    with pytest.raises(ValueError, match="concurrency=0"):
        OpenAIBackend("http://h/v1", model="m", concurrency=0)


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
    assert isinstance(build_backend({"type": "lit_rl.rollouts.backends.ScriptedBackend", "task": "countdown"}),
                      ScriptedBackend)
