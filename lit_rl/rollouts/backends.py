"""External-policy backends for the rollout pool builder: one small interface, four implementations.

A backend turns chat requests into completions::

    results = backend.generate(requests, sampling, on_result=None, hooks=None)   # list[GenResult]

* ``requests``: :class:`GenRequest` (chat ``messages``, a per-request ``seed``, the ``group`` it belongs to
  (one prompt and stage), and for the scripted solver the task :class:`~lit_rl.tasks.base.Example`);
* ``sampling``: :class:`Sampling` (temperature, top-p, max new tokens), the same for every request;
* ``on_result(i, result)``: called as soon as request ``i`` is done, one call at a time (the builder
  writes a prompt as soon as all its candidates are done); an exception raised there stops the batch;
* ``hooks``: :class:`GenHooks`, counters for requests in flight and retries (the progress bar).

On a failure that retries cannot fix, ``generate`` raises :class:`BackendError`; results already handed to
``on_result`` stay valid. Implementations (chosen in YAML, see :func:`build_backend`):

* ``openai`` (:class:`OpenAIBackend`): an OpenAI-compatible HTTP server (the paper: vLLM serving
  Qwen3-30B-A3B-Instruct-2507), chat or completions endpoint, ``concurrency`` requests in flight,
  socket timeouts, bounded retries with exponential backoff (timeouts, connection errors, HTTP 408/409/
  429/5xx, malformed or truncated responses: bad JSON, no text, a text with a lone surrogate, JSON nested
  too deeply or with an over-long integer), immediate errors for 401/403 and other 4xx;
* ``vllm`` (:class:`VLLMBackend`): vLLM's offline engine ``vllm.LLM`` (``pip install lit-rl[vllm]``);
* ``hf`` (:class:`HFBackend`): Hugging Face ``generate`` with any local causal LM (or a tiny random
  Llama built from a config, with the character tokenizer, for tests);
* ``scripted`` (:class:`ScriptedBackend`): the scripted solver of :mod:`lit_rl.rollouts.scripted`, with a
  verbose first stage and a compact rewrite, so the embedded demo exercises two-stage length control.

Per-request seeds make every backend deterministic given the request (vLLM and the HTTP server honour
``seed``; the HF backend seeds each group), so a resumed build writes the same records.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import json
import random
import re
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lit_rl.tasks.base import Example


class BackendError(RuntimeError):
    """A request failed for good (after retries, or at once for auth and other client errors)."""


class BackendAuthError(BackendError):
    """HTTP 401/403: the server refused the credentials; retrying cannot help."""


class BackendRequestError(BackendError):
    """HTTP 4xx other than 401/403/408/409/429: the request itself is wrong (model name, max_tokens, ...)."""


@dataclass(frozen=True)
class Sampling:
    """Sampling settings shared by all requests of a build (ERILS Table III).

    Attributes:
        temperature: sampling temperature (paper: 1.0; 0 = greedy).
        max_tokens: maximum new tokens per request (paper: 2048; Sudoku 4096).
        top_p: nucleus sampling threshold.
    """

    temperature: float = 1.0
    max_tokens: int = 2048
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for key in ("temperature", "max_tokens", "top_p"):
            value = getattr(self, key)
            if not isinstance(value, int if key == "max_tokens" else (int, float)) or isinstance(value, bool):
                raise ValueError(f"sampling.{key}={value!r}: must be {'an integer' if key == 'max_tokens' else 'a number'}")
        if not self.temperature >= 0:  # also NaN
            raise ValueError(f"sampling.temperature={self.temperature}: must be >= 0")
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens={self.max_tokens}: must be >= 1")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p={self.top_p}: must be in (0, 1]")


@dataclass
class GenRequest:
    """One generation request.

    Attributes:
        messages: chat messages (``[{"role": "user", "content": ...}]``).
        seed: per-request sampling seed (derived from the dataset seed, the prompt id, the candidate and
            the stage, see :func:`request_seed`).
        group: requests of one prompt and stage share it (the HF backend batches and seeds by group).
        example: the task example (the scripted backend solves it; others ignore it).
        stage: ``"generate"`` (from the task prompt) or ``"rewrite"`` (two-stage length control).
        previous: the first-stage completion a rewrite request rewrites.
    """

    messages: list[dict[str, str]]
    seed: int
    group: str = ""
    example: Example | None = None
    stage: str = "generate"
    previous: str | None = None


@dataclass
class GenResult:
    """One completion.

    Attributes:
        text: the generated text (completion only, no prompt).
        finish_reason: ``"stop"`` (ended by itself) or ``"length"`` (hit ``max_tokens``), as reported.
        completion_tokens: completion length the backend reported in its own tokens (``None`` if unknown).
        attempts: HTTP attempts this result took (1 = no retry).
    """

    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None
    attempts: int = 1


@dataclass
class GenHooks:
    """Thread-safe counters the builder shows in its progress bar and records per session."""

    in_flight: int = 0
    requests: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    on_change: Callable[["GenHooks"], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.requests += 1
        self._changed()

    def finished(self) -> None:
        with self._lock:
            self.in_flight -= 1
        self._changed()

    def retried(self, reason: str) -> None:
        with self._lock:
            self.retries += 1
            self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + 1
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


OnResult = Callable[[int, GenResult], None]


def request_seed(dataset_seed: int, prompt_id: str, candidate: int, stage: str) -> int:
    """A stable 31-bit seed for one request (``sha256`` of its coordinates, not Python's salted hash).

    >>> request_seed(42, "sudoku-train-0", 0, "generate") == request_seed(42, "sudoku-train-0", 0, "generate")
    True
    """
    digest = hashlib.sha256(f"{dataset_seed}/{prompt_id}/{candidate}/{stage}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class Backend:
    """Base class: subclasses implement :meth:`generate`; the rest has defaults."""

    #: short type name used in configs and pool headers
    kind: str = "backend"

    @property
    def name(self) -> str:
        """The external policy's name (the pool's ``policy`` and each record's ``source``)."""
        return self.kind

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None, hooks: GenHooks | None = None) -> list[GenResult]:
        raise NotImplementedError

    def length_tokenizer(self) -> Any | None:
        """The policy's own tokenizer (to count completion lengths), or ``None`` if the backend has none."""
        return None

    def describe(self) -> dict[str, Any]:
        """Settings that determine the generated text (stored in the pool header, checked on resume)."""
        return {"type": self.kind, "policy": self.name}

    def session_info(self) -> dict[str, Any]:
        """Settings that may change between sessions of one build (URL, concurrency); not checked."""
        return {}

    def close(self) -> None:
        """Release resources (engines, models)."""


def _emit(results: list[GenResult | None], i: int, res: GenResult, on_result: OnResult | None, lock: threading.Lock) -> None:
    with lock:
        results[i] = res
        if on_result is not None:
            on_result(i, res)


# --------------------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP server
# --------------------------------------------------------------------------------------------------------
class _Retryable(Exception):
    def __init__(self, reason: str, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.retry_after = reason, detail, retry_after


class _Cancelled(Exception):
    pass


RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIBackend(Backend):
    """An OpenAI-compatible HTTP server (vLLM ``vllm serve``, SGLang, TGI, a hosted API).

    Requests use the stdlib (``urllib``) from ``concurrency`` worker threads; one request per candidate
    (``n=1``) with its own ``seed``, so each candidate is reproducible and a retry regenerates the same
    text on servers that honour seeds (vLLM does).

    Args:
        base_url: the server's API root, e.g. ``http://host:8000/v1`` (``/chat/completions`` or
            ``/completions`` is appended).
        model: the served model name (``--served-model-name``, by default the HF repo id).
        api: ``"chat"`` (``/chat/completions`` with messages; the server applies the chat template) or
            ``"completions"`` (``/completions`` with a prompt string rendered here with ``tokenizer``'s
            chat template, or plain lines when there is none).
        api_key: sent as ``Authorization: Bearer ...`` when set (vLLM ``--api-key``).
        concurrency: requests in flight at once.
        timeout_s: socket timeout (connect and each read) per attempt.
        max_retries: retries per request after the first attempt (timeouts, connection errors, HTTP
            408/409/425/429/5xx, malformed JSON, truncated bodies); then the build stops with an error.
        backoff_s: first retry delay; doubled each retry (with jitter), capped by ``max_backoff_s``; a
            ``Retry-After`` header (429/503) is honoured within the cap.
        max_backoff_s: cap of one retry delay.
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

    @property
    def name(self) -> str:
        return self.model

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.model, "api": self.api, "extra_body": self.extra_body}

    def session_info(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "concurrency": self.concurrency, "timeout_s": self.timeout_s, "max_retries": self.max_retries}

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

    # -- one request -------------------------------------------------------------------------------
    def _body(self, req: GenRequest, sampling: Sampling) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": req.seed,
            "n": 1,
            "stream": False,
        }
        if self.api == "chat":
            body["messages"] = req.messages
        else:
            tok = self.length_tokenizer()
            if tok is not None and getattr(tok, "chat_template", None):
                body["prompt"] = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
            else:
                body["prompt"] = "".join(m["content"] + "\n" for m in req.messages)
        body.update(self.extra_body)
        return body

    def _post_once(self, payload: bytes) -> GenResult:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.endpoint, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = _error_detail(e)
            if e.code in (401, 403):
                raise BackendAuthError(
                    f"HTTP {e.code} from {self.endpoint}: the server refused the credentials ({detail}); set the "
                    "backend's api_key (e.g. api_key: ${LIT_RL_EXTERNAL_API_KEY}) to the key the server was started with"
                ) from None
            if e.code in RETRYABLE_STATUS:
                raise _Retryable(f"http_{e.code}", f"HTTP {e.code}: {detail}", _retry_after(e)) from None
            raise BackendRequestError(f"HTTP {e.code} from {self.endpoint}: {detail} (request for model {self.model!r}; not retried)") from None
        except (socket.timeout, TimeoutError) as e:
            raise _Retryable("timeout", f"no response within timeout_s={self.timeout_s:g} ({e})") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise _Retryable("timeout", f"no response within timeout_s={self.timeout_s:g}") from None
            raise _Retryable("connection", f"cannot reach {self.endpoint}: {e.reason}") from None
        except http.client.IncompleteRead as e:
            raise _Retryable("truncated", f"response body cut off after {len(e.partial)} bytes") from None
        except (http.client.HTTPException, ConnectionError, OSError) as e:
            raise _Retryable("connection", f"{type(e).__name__}: {e}") from None
        return self._parse(raw)

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
            if self.api == "chat":
                text = choice["message"]["content"]
            else:
                text = choice["text"]
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
                raise _Retryable("malformed", f"response {name} is not valid Unicode (lone surrogate at character {e.start})") from None
        usage = obj.get("usage") if isinstance(obj, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        ok_tokens = isinstance(tokens, int) and not isinstance(tokens, bool)
        return GenResult(text=text, finish_reason=finish, completion_tokens=tokens if ok_tokens else None)

    def _request(self, req: GenRequest, sampling: Sampling, stop: threading.Event, hooks: GenHooks) -> GenResult:
        payload = json.dumps(self._body(req, sampling)).encode("utf-8")
        rng = random.Random(req.seed)  # jitter only; never affects the text
        last: _Retryable | None = None
        for attempt in range(self.max_retries + 1):
            if stop.is_set():
                raise _Cancelled()
            if attempt:
                hooks.retried(last.reason if last else "unknown")
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + rng.random() / 2)
                if last is not None and last.retry_after is not None:
                    delay = min(self.max_backoff_s, max(delay, last.retry_after))
                if stop.wait(delay):
                    raise _Cancelled()
            hooks.started()
            try:
                res = self._post_once(payload)
                res.attempts = attempt + 1
                return res
            except _Retryable as e:
                last = e
            finally:
                hooks.finished()
        assert last is not None
        raise BackendError(
            f"request {req.group or '?'} (seed {req.seed}) to {self.endpoint} failed after {self.max_retries + 1} attempts; "
            f"last error: {last}"
        )

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None, hooks: GenHooks | None = None) -> list[GenResult]:
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        if not requests:
            return []
        stop, lock = threading.Event(), threading.Lock()

        def work(i: int) -> None:
            res = self._request(requests[i], sampling, stop, hooks)
            _emit(results, i, res, on_result, lock)

        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)), thread_name_prefix="lit_rl-openai")
        futures = [pool.submit(work, i) for i in range(len(requests))]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in done if f.exception() is not None and not isinstance(f.exception(), _Cancelled)]
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


def _error_detail(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read().decode("utf-8", "replace")
    except Exception:
        body = ""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else None
        if msg:
            return str(msg)[:500]
    except json.JSONDecodeError:
        pass
    return (body.strip() or str(e.reason) or "no body")[:500]


def _retry_after(e: urllib.error.HTTPError) -> float | None:
    value = e.headers.get("Retry-After") if e.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------------
# vLLM offline engine
# --------------------------------------------------------------------------------------------------------
class VLLMBackend(Backend):
    """vLLM's offline engine (``vllm.LLM(...).chat``), loaded on first use; needs the ``vllm`` extra.

    Args:
        model: HF repo id or local path.
        tensor_parallel_size: GPUs per engine.
        gpu_memory_utilization: share of GPU memory vLLM may use.
        max_model_len: context length (``None``: the model's).
        dtype: weights dtype (``"auto"``).
        batch_size: requests per ``LLM.chat`` call (results are handed on after each call).
        engine_kwargs: more ``vllm.LLM`` keyword arguments.
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": false}``).
    """

    kind = "vllm"

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        batch_size: int = 1024,
        engine_kwargs: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"backend batch_size={batch_size}: must be >= 1")
        self.model, self.batch_size = model, batch_size
        self.engine_kwargs = {"tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization, "dtype": dtype, **(engine_kwargs or {})}
        if max_model_len is not None:
            self.engine_kwargs["max_model_len"] = max_model_len
        self.chat_template_kwargs = chat_template_kwargs
        self._llm: Any | None = None

    @property
    def name(self) -> str:
        return self.model

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.model, "chat_template_kwargs": self.chat_template_kwargs}

    @staticmethod
    def _vllm() -> Any:
        try:
            return importlib.import_module("vllm")
        except ImportError:
            raise BackendError("backend 'vllm' needs the vllm package: pip install 'lit-rl[vllm]' (or use the 'openai' backend against a vLLM server)") from None

    def _engine(self) -> Any:
        if self._llm is None:
            self._llm = self._vllm().LLM(model=self.model, **self.engine_kwargs)
        return self._llm

    def length_tokenizer(self) -> Any | None:
        return self._engine().get_tokenizer()

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None, hooks: GenHooks | None = None) -> list[GenResult]:
        vllm, llm = self._vllm(), self._engine()
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        for start in range(0, len(requests), self.batch_size):
            chunk = list(requests[start:start + self.batch_size])
            params = [vllm.SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens, seed=r.seed) for r in chunk]
            kwargs: dict[str, Any] = {"sampling_params": params, "use_tqdm": False}
            if self.chat_template_kwargs:
                kwargs["chat_template_kwargs"] = self.chat_template_kwargs
            for _ in chunk:
                hooks.started()
            try:
                outs = llm.chat([r.messages for r in chunk], **kwargs)
            finally:
                for _ in chunk:
                    hooks.finished()
            if len(outs) != len(chunk):
                raise BackendError(f"vLLM returned {len(outs)} outputs for {len(chunk)} requests")
            for j, out in enumerate(outs):
                c = out.outputs[0]
                _emit(results, start + j, GenResult(text=c.text, finish_reason=getattr(c, "finish_reason", None), completion_tokens=len(getattr(c, "token_ids", []) or []) or None), on_result, lock)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self._llm = None


# --------------------------------------------------------------------------------------------------------
# Hugging Face transformers generate
# --------------------------------------------------------------------------------------------------------
class HFBackend(Backend):
    """``transformers`` ``generate`` with a local causal LM.

    Requests are batched per ``group`` (one prompt and stage, left-padded) and each batch is sampled under
    ``torch.manual_seed`` of its first request's seed, so results do not depend on how a build was split
    into sessions.

    Args:
        model: HF repo id or local path for ``AutoModelForCausalLM.from_pretrained``.
        tokenizer: tokenizer name/path (default: ``model``); ``"lit_rl/char"`` is the built-in character
            tokenizer.
        tiny_llama: instead of ``model``, a random-init ``LlamaForCausalLM`` built from these
            ``LlamaConfig`` fields (tests and demos; its text is noise).
        model_seed: init seed of ``tiny_llama``.
        device: torch device.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``None`` (the checkpoint's).
        batch_size: most sequences per ``generate`` call.
        name: policy name (default: ``model``, or ``"tiny-llama"``).
    """

    kind = "hf"

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        tiny_llama: dict[str, Any] | None = None,
        model_seed: int = 0,
        device: str = "cpu",
        dtype: str | None = None,
        batch_size: int = 16,
        name: str | None = None,
    ) -> None:
        if (model is None) == (tiny_llama is None):
            raise ValueError("backend 'hf': set exactly one of model (a local causal LM) or tiny_llama (a LlamaConfig dict)")
        if tiny_llama is not None and tokenizer is None:
            tokenizer = "lit_rl/char"
        self.model_name, self.tokenizer_name, self.tiny_llama = model, tokenizer or model, tiny_llama
        self.model_seed, self.device, self.dtype, self.batch_size = model_seed, device, dtype, batch_size
        self._name = name or model or "tiny-llama"
        self._model: Any | None = None
        self._tok: Any | None = None

    @property
    def name(self) -> str:
        return self._name

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self._name, "model": self.model_name, "tiny_llama": self.tiny_llama, "model_seed": self.model_seed}

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.tokenizer_name == "lit_rl/char":
                from lit_rl.models.tokenizer import build_char_tokenizer

                tok = build_char_tokenizer()
            else:
                tok = AutoTokenizer.from_pretrained(self.tokenizer_name)
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            dtype = getattr(torch, self.dtype) if self.dtype else None
            if self.tiny_llama is not None:
                from transformers import LlamaConfig, LlamaForCausalLM

                cfg = LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **self.tiny_llama)
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.model_seed)
                    model = LlamaForCausalLM(cfg)
                if dtype is not None:
                    model = model.to(dtype)
            else:
                kwargs = {"dtype": dtype} if dtype is not None else {}
                model = AutoModelForCausalLM.from_pretrained(self.model_name, **kwargs)
            self._model, self._tok = model.to(self.device).eval(), tok
        return self._model, self._tok

    def length_tokenizer(self) -> Any | None:
        return self._load()[1]

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None, hooks: GenHooks | None = None) -> list[GenResult]:
        import torch

        model, tok = self._load()
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        batches: list[list[int]] = []
        for i, r in enumerate(requests):  # consecutive requests of one group, at most batch_size each
            if batches and requests[batches[-1][0]].group == r.group and len(batches[-1]) < self.batch_size:
                batches[-1].append(i)
            else:
                batches.append([i])
        eos = tok.eos_token_id
        for idx in batches:
            enc = tok.apply_chat_template([requests[i].messages for i in idx], add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True)
            enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            for _ in idx:
                hooks.started()
            try:
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(requests[idx[0]].seed)
                    gen_kwargs: dict[str, Any] = {"max_new_tokens": sampling.max_tokens, "pad_token_id": tok.pad_token_id, "eos_token_id": eos}
                    if sampling.temperature > 0:
                        gen_kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
                    else:
                        gen_kwargs.update(do_sample=False)
                    out = model.generate(**enc, **gen_kwargs)  # (b, P + new)
            finally:
                for _ in idx:
                    hooks.finished()
            new = out[:, enc["input_ids"].shape[1]:]  # (b, new)
            for row, i in enumerate(idx):
                ids = new[row].tolist()
                stopped = eos in ids
                ids = ids[: ids.index(eos)] if stopped else ids
                text = tok.decode(ids, skip_special_tokens=True)
                _emit(results, i, GenResult(text=text, finish_reason="stop" if stopped else "length", completion_tokens=len(ids) + int(stopped)), on_result, lock)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self._model = self._tok = None


# --------------------------------------------------------------------------------------------------------
# Scripted solver
# --------------------------------------------------------------------------------------------------------
class ScriptedBackend(Backend):
    """The scripted solver (:mod:`lit_rl.rollouts.scripted`) behind the backend interface.

    ``generate`` requests get a *verbose* trace (an explanation per deduction, a few hundred to a
    thousand characters, like an AR model's uncontrolled first stage); ``rewrite`` requests get the
    compact trace with the answer copied from the first-stage completion (a rewrite keeps the final
    answer, right or wrong). With ``style="compact"`` first-stage requests are compact too (the
    instruction-mode demo). ``long_rate`` of the rewrites stay verbose, so some completions exceed the
    500-token limit and the filtering has something to do.

    Args:
        task: ``"sudoku"`` or ``"countdown"``.
        error_rate: share of deliberately wrong first-stage answers.
        long_rate: share of rewrites that stay verbose.
        style: first-stage style, ``"verbose"`` or ``"compact"``.
    """

    kind = "scripted"

    def __init__(self, task: str, error_rate: float = 0.1, long_rate: float = 0.05, style: str = "verbose") -> None:
        from lit_rl.rollouts.scripted import SCRIPTED_POLICIES

        if task not in SCRIPTED_POLICIES:
            raise ValueError(f"backend 'scripted': no scripted policy for task {task!r} (known: {sorted(SCRIPTED_POLICIES)})")
        if style not in ("verbose", "compact"):
            raise ValueError(f"backend 'scripted': style={style!r}, expected 'verbose' or 'compact'")
        self.task, self.error_rate, self.long_rate, self.style = task, error_rate, long_rate, style

    @property
    def name(self) -> str:
        return f"scripted-{self.task}"

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.name, "error_rate": self.error_rate, "long_rate": self.long_rate, "style": self.style}

    def length_tokenizer(self) -> Any | None:
        from lit_rl.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer()

    def _complete(self, req: GenRequest) -> str:
        from lit_rl.rollouts.scripted import SCRIPTED_POLICIES

        if req.example is None:
            raise BackendError("backend 'scripted' needs the task example in each request")
        rng = random.Random(req.seed)
        compact = SCRIPTED_POLICIES[self.task](req.example, rng, 0.0 if req.stage == "rewrite" else self.error_rate)
        if req.stage == "rewrite":
            answer = _last_answer(req.previous or "")
            reasoning = _reasoning(compact)
            if rng.random() < self.long_rate:
                reasoning = _reasoning(req.previous or "") or reasoning
            return f"<reasoning>{reasoning}</reasoning>\n<answer>{answer if answer is not None else ''}</answer>"
        if self.style == "compact":
            return compact
        return _verbose(self.task, req.example, compact, rng)

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None, hooks: GenHooks | None = None) -> list[GenResult]:
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        for i, req in enumerate(requests):
            hooks.started()
            try:
                text = self._complete(req)
            finally:
                hooks.finished()
            _emit(results, i, GenResult(text=text, finish_reason="stop"), on_result, lock)
        return [r for r in results if r is not None]


def _last_answer(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    return found[-1] if found else None


def _reasoning(text: str) -> str:
    m = re.search(r"<reasoning>(.*?)</reasoning>", text, flags=re.S)
    return m.group(1) if m else ""


def _verbose(task: str, example: Example, compact: str, rng: random.Random) -> str:
    """Expand a compact scripted trace into a wordy one with the same answer."""
    answer = _last_answer(compact) or ""
    if task == "sudoku":
        steps = re.findall(r"(\d)(\d)(\d)", _reasoning(compact))
        lines = [f"The puzzle is {example.meta['puzzle']}; zeros are empty cells. I fill one cell at a time."]
        for r, c, d in steps:
            why = rng.choice(["the row already holds the other digits", "the column and the 2x2 box rule out the rest", "it is the only candidate left"])
            lines.append(f"Row {r}, column {c}: {why}, so the cell must be {d}.")
            if rng.random() < 0.3:
                lines.append(f"Check: row {r} and column {c} now have no repeated digit.")
        lines.append("Every row, column and box now holds 1-4 exactly once.")
    else:
        lines = [f"I need to reach the target with each number used once. Trying combinations: {_reasoning(compact)}."]
        for _ in range(rng.randint(4, 16)):
            lines.append("Let me double-check the arithmetic of that candidate step by step before answering.")
        lines.append(f"So the expression {answer.strip()} works.")
    return "<reasoning>\n" + "\n".join(lines) + "\n</reasoning>\n<answer>" + answer + "</answer>"


# --------------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------------
BACKENDS: dict[str, type[Backend]] = {"openai": OpenAIBackend, "vllm": VLLMBackend, "hf": HFBackend, "scripted": ScriptedBackend}


def build_backend(spec: dict[str, Any], where: str = "backend") -> Backend:
    """Build a backend from its config block::

        backend:
          type: openai            # openai | vllm | hf | scripted | a dotted path to a Backend subclass
          base_url: ...           # the class's keyword arguments
          model: ...

    Errors name the config key (``where``) and the accepted arguments.
    """
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"{where}: expected a mapping with 'type' (one of {sorted(BACKENDS)} or a dotted class path)")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    kind = spec["type"]
    if kind in BACKENDS:
        cls = BACKENDS[kind]
    elif isinstance(kind, str) and "." in kind:
        module, _, attr = kind.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{where}.type={kind!r}: cannot import ({e})") from None
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise ValueError(f"{where}.type={kind!r}: not a lit_rl.rollouts.backends.Backend subclass")
    else:
        raise ValueError(f"{where}.type={kind!r}: expected one of {sorted(BACKENDS)} or a dotted class path")
    import inspect

    params = inspect.signature(cls.__init__).parameters
    unknown = [k for k in kwargs if k not in params]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        allowed = [p for p in params if p != "self"]
        raise ValueError(f"{where}: unknown option(s) {unknown} for type {kind!r} (accepted: {allowed})")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{where} (type {kind!r}): {e}") from None

