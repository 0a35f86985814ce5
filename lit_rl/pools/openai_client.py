"""The OpenAI-compatible pool client, on the official ``openai`` SDK.

One request per candidate (``n=1``) with its own ``seed`` from ``concurrency`` worker threads, so every
candidate is reproducible and a retry regenerates the same text on servers that honour seeds (vLLM does).
What retries what:

* **the SDK** (``max_retries`` of ``openai.OpenAI``): timeouts, connection errors (refused, reset, a body cut
  off before its ``Content-Length``), HTTP 408/409/429/5xx, with its own backoff (0.5 s doubling to 8 s,
  jitter) and the server's ``Retry-After`` / ``retry-after-ms`` (up to 2 minutes); 401/403 and other 4xx
  are raised at once;
* **this client**, on top: a 200 whose body is unusable (not JSON, JSON nested too deeply or with an
  over-long integer, no ``choices[0]`` text, a lone surrogate that cannot be written to the UTF-8 pool),
  which the SDK would hand over as a success. Its delay is ``backoff_s`` doubling to ``max_backoff_s``.

Both share one budget: a request makes at most ``max_retries + 1`` HTTP attempts in all. The body is read
raw (``with_raw_response``) and parsed here, so the pool holds what the server sent or nothing. Each attempt
passes through :class:`_AttemptTransport` (an ``httpx`` transport, the SDK's public extension point), which
counts attempts and their outcomes for :class:`~lit_rl.pools.backend_types.GenHooks` and the final error.
"""

from __future__ import annotations

import json
import random
import re
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Sequence

from lit_rl.pools.backend_types import (
    Backend,
    BackendAuthError,
    BackendError,
    BackendRequestError,
    GenHooks,
    GenRequest,
    GenResult,
    OnResult,
    Sampling,
    emit,
)


class _Retryable(Exception):
    """An attempt that failed in a way a retry may fix: ``reason`` (``timeout``, ``http_503``, ``malformed``,
    ...) is counted in :class:`GenHooks`; ``detail`` ends up in the final error."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class _Cancelled(Exception):
    """The batch stopped (another request failed or ``on_result`` raised) before this attempt."""


class _Attempts(threading.local):
    """Per worker thread: the request being sent, its attempts so far and the last attempt's outcome."""

    def __init__(self) -> None:
        self.count = 0
        self.last: _Retryable | None = None
        self.hooks: GenHooks | None = None
        self.stop: threading.Event | None = None


def _httpx_module() -> Any:
    """The httpx flavour the installed SDK uses (``httpx2`` from openai 3, ``httpx`` before)."""
    import openai

    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        if issubclass(openai.DefaultHttpxClient, module.Client):
            return module
    raise BackendError(f"openai {openai.__version__}: cannot tell which httpx its DefaultHttpxClient is built on")


def _make_transport(httpx: Any, state: _Attempts, timeout_s: float, endpoint: str, concurrency: int) -> Any:
    """An httpx transport that wraps the default one and records every attempt in ``state``."""

    class _AttemptTransport(httpx.BaseTransport):
        def __init__(self) -> None:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            self.inner = httpx.HTTPTransport(limits=limits)

        def handle_request(self, request: Any) -> Any:
            if state.stop is not None and state.stop.is_set():
                raise _Cancelled()
            hooks = state.hooks or GenHooks()
            if state.count:
                hooks.retried(state.last.reason if state.last else "unknown")
            state.count += 1
            hooks.started()
            try:
                response = self.inner.handle_request(request)
            except httpx.TimeoutException:
                state.last = _Retryable("timeout", f"no response within timeout_s={timeout_s:g}")
                raise
            except Exception as e:
                state.last = _Retryable("connection", f"cannot reach {endpoint}: {_short(e)}")
                raise
            finally:
                hooks.finished()
            code = response.status_code
            if code >= 400:
                state.last = _Retryable(f"http_{code}", f"HTTP {code}")
            else:  # a retry after a 2xx can only mean that its body could not be read
                state.last = _Retryable("truncated", "response body cut off")
            return response

        def close(self) -> None:
            self.inner.close()

    return _AttemptTransport()


def _short(err: BaseException) -> str:
    """``Type: message`` of ``err``, with the socket error inside httpx's wrapper when there is one."""
    text = str(err) or type(err).__name__
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return f"{type(err).__name__}: {m.group(1) if m else text}"[:300]


class OpenAIBackend(Backend):
    """An OpenAI-compatible HTTP server (vLLM ``vllm serve``, SGLang, TGI, a hosted API), through ``openai``.

    Args:
        base_url: the server's API root, e.g. ``http://host:8000/v1``.
        model: the served model name (``--served-model-name``, by default the HF repo id).
        api: ``"chat"`` (``chat.completions`` with messages; the server applies the chat template) or
            ``"completions"`` (``completions`` with a prompt string rendered here with ``tokenizer``'s
            chat template, or plain lines when there is none).
        api_key: the server's key (vLLM ``--api-key``); ``None`` sends the placeholder ``EMPTY``, never the
            environment's ``OPENAI_API_KEY`` (that key is for api.openai.com, not for your server).
        concurrency: requests in flight at once (and the connection pool's size).
        timeout_s: timeout of each attempt (connect and each read).
        max_retries: retries per request after the first attempt, transport and malformed-body retries
            together (see the module docstring); then the build stops with an error.
        backoff_s: first delay before retrying a malformed body; doubled each retry (with jitter), capped by
            ``max_backoff_s``. Transport retries use the SDK's schedule and the server's ``Retry-After``.
        max_backoff_s: cap of one malformed-body retry delay.
        tokenizer: HF tokenizer name/path of the served model (length counting with
            ``length_tokenizer: auto``, and the ``completions`` prompt's chat template); default: ``model``;
            ``"none"``: do not load one.
        extra_body: extra JSON fields for every request (e.g. ``{"top_k": 20}`` for vLLM).
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api: str = "chat",
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        tokenizer: str | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/\s]+", base_url):
            raise ValueError(f"backend base_url={base_url!r}: expected an http(s) URL such as http://localhost:8000/v1")
        if api not in ("chat", "completions"):
            raise ValueError(f"backend api={api!r}: expected 'chat' or 'completions'")
        if concurrency < 1:
            raise ValueError(f"backend concurrency={concurrency}: must be >= 1")
        if timeout_s <= 0:
            raise ValueError(f"backend timeout_s={timeout_s}: must be > 0")
        if max_retries < 0:
            raise ValueError(f"backend max_retries={max_retries}: must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.model, self.api, self.api_key = model, api, api_key or None
        self.concurrency, self.timeout_s, self.max_retries = concurrency, float(timeout_s), max_retries
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.tokenizer_name = tokenizer
        self.extra_body = dict(extra_body or {})
        self._tokenizer: Any | None = None
        self._tokenizer_tried = False
        self.endpoint = f"{self.base_url}/{'chat/completions' if api == 'chat' else 'completions'}"
        self._state = _Attempts()
        self._sdk: Any | None = None
        self._sdk_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.model

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.model, "api": self.api, "extra_body": self.extra_body}

    def session_info(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "concurrency": self.concurrency, "timeout_s": self.timeout_s,
                "max_retries": self.max_retries}

    def length_tokenizer(self) -> Any | None:
        if not self._tokenizer_tried:
            self._tokenizer_tried = True
            if self.tokenizer_name == "none":
                return None
            try:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name or self.model)
            except Exception:  # no local copy and no hub access: the caller decides (fallback + warning)
                self._tokenizer = None
        return self._tokenizer

    # -- the SDK client ------------------------------------------------------------------------------
    def _client(self) -> Any:
        """The ``openai.OpenAI`` client (built on first use, shared by the worker threads)."""
        with self._sdk_lock:
            if self._sdk is None:
                try:
                    import openai
                except ImportError:
                    raise BackendError("backend 'openai' needs the openai package: pip install openai") from None
                transport = _make_transport(_httpx_module(), self._state, self.timeout_s, self.endpoint,
                                            self.concurrency)
                self._sdk = openai.OpenAI(
                    base_url=self.base_url,
                    api_key=self.api_key or "EMPTY",
                    timeout=self.timeout_s,
                    max_retries=self.max_retries,
                    http_client=openai.DefaultHttpxClient(transport=transport),
                )
            return self._sdk

    def _params(self, req: GenRequest, sampling: Sampling) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": req.seed,
            "n": 1,
            "stream": False,
        }
        if self.api == "chat":
            params["messages"] = req.messages
        else:
            tok = self.length_tokenizer()
            if tok is not None and getattr(tok, "chat_template", None):
                params["prompt"] = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
            else:
                params["prompt"] = "".join(m["content"] + "\n" for m in req.messages)
        if self.extra_body:
            params["extra_body"] = dict(self.extra_body)
        return params

    def _send(self, params: dict[str, Any], retries_left: int) -> bytes:
        """One SDK call (its own retries included): the raw body of the 2xx reply, or an error."""
        import openai

        client = self._client().with_options(max_retries=retries_left)
        api = client.chat.completions if self.api == "chat" else client.completions
        try:
            return api.with_raw_response.create(**params).http_response.content
        except openai.APIStatusError as e:
            detail = _error_detail(e)
            if e.status_code in (401, 403):
                raise BackendAuthError(
                    f"HTTP {e.status_code} from {self.endpoint}: the server refused the credentials ({detail}); "
                    "set the backend's api_key (e.g. api_key: ${LIT_RL_EXTERNAL_API_KEY}) to the key the server "
                    "was started with"
                ) from None
            if e.status_code in (408, 409, 429) or e.status_code >= 500:  # the SDK's retry rule: out of retries
                raise _Retryable(f"http_{e.status_code}", f"HTTP {e.status_code}: {detail}") from None
            raise BackendRequestError(
                f"HTTP {e.status_code} from {self.endpoint}: {detail} (request for model {self.model!r}; not retried)"
            ) from None
        except (openai.APITimeoutError, openai.APIConnectionError):
            last = self._state.last or _Retryable("connection", f"cannot reach {self.endpoint}")
            raise _Retryable(last.reason, last.detail) from None

    def _parse(self, raw: bytes) -> GenResult:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _Retryable("malformed", f"response is not JSON ({e}; first bytes {raw[:80]!r})") from None
        except RecursionError:
            raise _Retryable("malformed", f"response JSON is nested too deeply (first bytes {raw[:80]!r})") from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise _Retryable("malformed", f"response JSON is unreadable ({str(e).split(';')[0][:120]})") from None
        try:
            choice = obj["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise TypeError(f"completion is {type(text).__name__}")
        except (KeyError, IndexError, TypeError) as e:
            raise _Retryable("malformed", f"response JSON lacks choices[0] text ({type(e).__name__}: {e})") from None
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise _Retryable("malformed", f"response finish_reason is {type(finish).__name__}, not a string")
        # a lone surrogate ("\ud800" in the JSON) cannot be written to the UTF-8 pool: a malformed reply,
        # retried like the others (not replaced: the pool holds what the model wrote or nothing)
        for name, value in (("text", text), ("finish_reason", finish or "")):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _Retryable("malformed", f"response {name} is not valid Unicode "
                                 f"(lone surrogate at character {e.start})") from None
        usage = obj.get("usage") if isinstance(obj, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        ok_tokens = isinstance(tokens, int) and not isinstance(tokens, bool)
        return GenResult(text=text, finish_reason=finish, completion_tokens=tokens if ok_tokens else None)

    def _request(self, req: GenRequest, sampling: Sampling, stop: threading.Event, hooks: GenHooks) -> GenResult:
        params = self._params(req, sampling)
        state = self._state
        state.count, state.last, state.hooks, state.stop = 0, None, hooks, stop
        rng = random.Random(req.seed)  # jitter only; never affects the text
        malformed = 0
        try:
            while True:
                try:  # the SDK may retry within the budget left: max_retries + 1 attempts in all
                    result = self._parse(self._send(params, self.max_retries - state.count))
                    result.attempts = state.count
                    return result
                except _Retryable as e:
                    state.last = e
                # a transport error has used the SDK's retries (or the server said not to retry): give up
                if state.count > self.max_retries or state.last.reason != "malformed":
                    break
                delay = min(self.max_backoff_s, self.backoff_s * 2**malformed) * (0.5 + rng.random() / 2)
                malformed += 1
                if stop.wait(delay):
                    raise _Cancelled()
        finally:
            state.hooks = state.stop = None
        raise BackendError(
            f"request {req.group or '?'} (seed {req.seed}) to {self.endpoint} failed after {state.count} attempts; "
            f"last error: {state.last}"
        )

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None,
                 hooks: GenHooks | None = None) -> list[GenResult]:
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        if not requests:
            return []
        stop, lock = threading.Event(), threading.Lock()

        def work(i: int) -> None:
            res = self._request(requests[i], sampling, stop, hooks)
            emit(results, i, res, on_result, lock)

        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)), thread_name_prefix="lit_rl-openai")
        futures = [pool.submit(work, i) for i in range(len(requests))]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in done
                      if f.exception() is not None and not isinstance(f.exception(), _Cancelled)]
            if errors:
                stop.set()
        except BaseException:  # KeyboardInterrupt: stop the workers, keep what was written
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True, cancel_futures=True)
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]

    def close(self) -> None:
        if self._sdk is not None:
            self._sdk.close()
            self._sdk = None


def _error_detail(err: Any) -> str:
    """The server's error message of an ``openai.APIStatusError`` (``{"error": {"message": ...}}``), else its body."""
    try:
        body = err.response.text
    except Exception:
        body = ""
    try:
        obj = json.loads(body)
        inner = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = inner.get("message") if isinstance(inner, dict) else None
        if msg:
            return str(msg)[:500]
    except (json.JSONDecodeError, ValueError):
        pass
    return (body.strip() or getattr(err, "message", "") or "no body")[:500]
