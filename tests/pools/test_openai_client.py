"""Tests lit_rl/pools/openai_client.py."""

import pytest

from lit_rl.pools.backend_types import (
    BackendAuthError,
    BackendError,
    BackendRequestError,
    GenHooks,
    Sampling,
)
from lit_rl.pools.openai_client import OpenAIBackend
from openai_test_server import FakeOpenAIServer, canned_completion
from test_backends import MESSAGES, _reqs  # the prompt and requests the backends' tests share (conftest.py's path)


def _client(url, **kw):
    opts = dict(model="fake-qwen3", concurrency=4, timeout_s=10.0, max_retries=2, backoff_s=0.01, max_backoff_s=0.05)
    opts.update(kw)
    return OpenAIBackend(url, **opts)


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
