"""The interface every external-generation backend implements (see :mod:`lit_rl.pools.backends`).

A backend turns chat requests into completions::

    results = backend.generate(requests, sampling, on_result=None, hooks=None)   # list[GenResult]

* ``requests``: :class:`GenRequest` (chat ``messages``, a per-request ``seed``, the ``group`` it belongs to
  (one prompt and stage), and for the scripted solver the task :class:`~lit_rl.tasks.base.Example`);
* ``sampling``: :class:`Sampling` (temperature, top-p, max new tokens), the same for every request;
* ``on_result(i, result)``: called as soon as request ``i`` is done, one call at a time (the builder
  writes a prompt as soon as all its candidates are done); an exception raised there stops the batch;
* ``hooks``: :class:`GenHooks`, counters for requests in flight and retries (the progress bar).

On a failure that retries cannot fix, ``generate`` raises :class:`BackendError`; results already handed to
``on_result`` stay valid.
"""

from __future__ import annotations

import hashlib
import threading
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
                raise ValueError(f"sampling.{key}={value!r}: must be "
                                 f"{'an integer' if key == 'max_tokens' else 'a number'}")
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

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None,
                 hooks: GenHooks | None = None) -> list[GenResult]:
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


def emit(results: list[GenResult | None], i: int, res: GenResult, on_result: OnResult | None,
         lock: threading.Lock) -> None:
    with lock:
        results[i] = res
        if on_result is not None:
            on_result(i, res)
