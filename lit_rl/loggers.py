"""An MLflow logger whose metrics survive a tracking server that goes away: :class:`MLFlowLogger`.

Lightning's ``MLFlowLogger`` sends each ``log_metrics`` call at once. MLflow's client retries a failed request
with backoff: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` = 7 and ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` = 2, so about
4 minutes. Then it raises, and the exception ends the fit. Meanwhile training stands still, and Lightning's
``finalize("failed")`` then waits the same 4 minutes again.

This subclass is a drop-in for it (``class_path: lit_rl.loggers.MLFlowLogger``). It changes only how metrics
reach the server:

1. ``log_metrics`` puts the metrics in an outbox and sends the outbox in batches of up to 1,000 (MLflow's
   limit), which is one request per call while the server answers, as with Lightning's logger.
2. When a send fails, the metrics stay in the outbox, a warning names the URI, and training goes on.
   Sends fail for a refused connection (checked first with a TCP probe, so a server that is down costs no
   training time), for 5xx replies, or for an unreachable database. A send uses MLflow's HTTP retries cut to
   ``send_retries`` (2, a few seconds), so a server that dies mid-request stalls training for seconds. A send
   is tried again every ``retry_every_s`` seconds, and the first one that works sends the backlog in step
   order.
3. When the outbox holds more than ``max_unsent`` metrics, they go to disk: one complete JSON-lines file
   under ``spill_dir``, written atomically. Memory stays bounded.
4. ``finalize`` keeps trying for ``final_wait_s`` seconds, then sends the spilled files. If the server
   still does not answer, the outbox is spilled too, and :class:`TrackingUnavailableError` names the URI, the
   run, the count and the files. ``python -m lit_rl.loggers replay FILE...`` sends them later. It is safe to
   re-run: MLflow ignores a metric it already has (same key, step, timestamp and value). After a failed fit,
   the original exception is kept and this is only a warning.

Errors that waiting cannot fix are raised at once, as Lightning's logger does: a bad value, or a run that
does not exist.

Artifact uploads through ``logger.experiment`` wait out an outage the same way: ``log_artifact``,
``log_artifacts``, ``log_table``, ``log_text`` and ``log_dict``, which the callbacks call during training. A file
is copied when its upload is deferred, because the callbacks append to theirs. The uploads run in call order once
the metrics are through. If the server is still away at the end, the error names the copies; they are kept
under ``spill_dir``, and they are also in the run folder, where the callbacks wrote them.

A process that is killed loses what is still in memory. Those are the metrics of steps since the last
checkpoint, and a resumed run logs them again. Parameters and tags still go straight through MLflow's client,
with its retries. They are sent at the start and end of a fit, after the preflight has probed the server
(:mod:`lit_rl.tracking`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from lightning.pytorch.loggers import MLFlowLogger as _LightningMLFlowLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from lit_rl.atomic import atomic_write_text
from lit_rl.errors import FieldError, one_line
from lit_rl.tracking import get_or_create_experiment, tracking_uri_problem

__all__ = ["MLFlowLogger", "TrackingUnavailableError", "is_transient", "read_spill", "replay", "root_cause"]

log = logging.getLogger("lit_rl.loggers")

BATCH = 1000  # MLflow's limit of metrics per log_batch request
# MLflow error codes that waiting can fix: server errors, a busy or unreachable backend, rate limits
_TRANSIENT_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED",
                    "SERVICE_UNDER_MAINTENANCE"}


class TrackingUnavailableError(ConnectionError):
    """The tracking server did not take a run's metrics before the end of the fit (the message names the URI,
    the run and the files holding the metrics it did not take)."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage (connection refused or reset, timeout, 5xx, backend database down) rather
    than a request the server will never accept."""
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(exc, (OSError, requests.RequestException)):
        return True
    if isinstance(exc, MlflowException):
        return exc.error_code in _TRANSIENT_CODES
    return False


@contextlib.contextmanager
def _mlflow_http(retries: int, timeout_s: float):
    """MLflow's own HTTP knobs (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``..._BACKOFF_FACTOR``, ``..._TIMEOUT``; its
    client reads them at each request), set only while this logger sends: an outage costs a send a few
    seconds, not MLflow's default 4 minutes of retries. Other calls keep the defaults."""
    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(timeout_s)))}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _metric_row(m: Any) -> dict[str, Any]:
    return {"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step}


def read_spill(path: str | Path) -> tuple[dict[str, str], list[Any]]:
    """A spill file's header (``tracking_uri``, ``run_id``; ``end_status`` in the last file of a fit whose end the
    store missed) and its metrics; a malformed line raises
    ``ValueError`` naming the file and the line."""
    from mlflow.entities import Metric

    path = Path(path)
    header: dict[str, str] = {}
    metrics = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            if n == 1:
                header = {"tracking_uri": str(row["tracking_uri"]), "run_id": str(row["run_id"])}
                if row.get("end_status") in ("FINISHED", "FAILED", "KILLED"):
                    header["end_status"] = row["end_status"]
            else:
                metrics.append(Metric(key=str(row["key"]), value=float(row["value"]),
                                      timestamp=int(row["timestamp"]), step=int(row["step"])))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a lit_rl metrics spill line ({type(e).__name__}: {e})") from None
    if not header:
        raise ValueError(f"{path}: empty; a spill file starts with a tracking_uri/run_id header line")
    return header, metrics


def replay(paths: Sequence[str | Path], tracking_uri: str | None = None, delete: bool = True) -> int:
    """Send spilled metrics to their run (``tracking_uri`` overrides the header's); returns how many were sent.
    A file with an ``end_status`` also ends its run so (if it still shows RUNNING). A file is deleted once all of
    it has been sent (``delete``)."""
    from mlflow.tracking import MlflowClient

    sent = 0
    for path in paths:
        header, metrics = read_spill(path)
        client = MlflowClient(tracking_uri=tracking_uri or header["tracking_uri"])
        for i in range(0, len(metrics), BATCH):
            client.log_batch(header["run_id"], metrics=metrics[i : i + BATCH])
        sent += len(metrics)
        if header.get("end_status") and client.get_run(header["run_id"]).info.status == "RUNNING":
            client.set_terminated(header["run_id"], header["end_status"])  # the end the store missed
        if delete:
            Path(path).unlink()
    return sent


class _DeferringClient:
    """The logger's ``MlflowClient``: every call goes through, except the artifact uploads in ``DEFERRED``, which
    go to :meth:`MLFlowLogger._artifact_call`."""

    DEFERRED = ("log_artifact", "log_artifacts", "log_table", "log_text", "log_dict")

    def __init__(self, client: Any, owner: "MLFlowLogger") -> None:
        self._client, self._owner = client, owner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in self.DEFERRED:
            return lambda *a, **kw: self._owner._artifact_call(attr, name, a, kw)
        return attr


class MLFlowLogger(_LightningMLFlowLogger):
    """Lightning's ``MLFlowLogger`` with an outbox for metrics: a tracking-server outage neither stops
    training nor loses a metric, and a server that never comes back fails the fit clearly at its end.
    See the module docstring for the rules.

    Args (beyond Lightning's):
        retry_every_s: while the server is away, seconds between attempts to send the outbox.
        final_wait_s: how long ``finalize`` keeps trying before it spills the outbox and fails.
        max_unsent: metrics kept in memory before they are spilled to ``spill_dir``.
        spill_dir: folder of the spill files (``<run_id>-<n>.jsonl``).
        send_retries, send_timeout_s: MLflow's HTTP retries and socket timeout for this logger's sends (its
            defaults, 7 retries with backoff factor 2, would stall training for 4 minutes at each outage).
    """

    @staticmethod
    def check_args(retry_every_s: float = 30.0, final_wait_s: float = 300.0, max_unsent: int = 200_000,
                   send_retries: int = 2, send_timeout_s: float = 60.0) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        for name, v in (("retry_every_s", retry_every_s), ("final_wait_s", final_wait_s),
                        ("send_retries", send_retries)):
            if v < 0:
                raise FieldError(name, f"must be >= 0, got {v}")
        if max_unsent < 1:
            raise FieldError("max_unsent", f"must be >= 1, got {max_unsent}")
        if send_timeout_s <= 0:
            raise FieldError("send_timeout_s", f"must be > 0, got {send_timeout_s}")

    def __init__(self, *args: Any, retry_every_s: float = 30.0, final_wait_s: float = 300.0,
                 max_unsent: int = 200_000, spill_dir: str = "runs/mlflow_unsent", send_retries: int = 2,
                 send_timeout_s: float = 60.0, **kwargs: Any) -> None:
        MLFlowLogger.check_args(retry_every_s=retry_every_s, final_wait_s=final_wait_s, max_unsent=max_unsent,
                                send_retries=send_retries, send_timeout_s=send_timeout_s)
        super().__init__(*args, **kwargs)
        self.retry_every_s, self.final_wait_s, self.max_unsent = retry_every_s, final_wait_s, max_unsent
        self.spill_dir = Path(spill_dir)
        self.send_retries, self.send_timeout_s = send_retries, send_timeout_s
        self._outbox: list[Any] = []
        self._spilled: list[Path] = []
        self._down_since: float | None = None  # when the current outage began (None: the last send worked)
        self._next_try = 0.0
        self._last_error = ""
        self._uploads: list[tuple[Any, str, tuple, dict]] = []  # deferred artifact calls, in call order
        self._client_view: _DeferringClient | None = None
        self._gave_up = False  # finalize said the store did not take the metrics
        #: every metric's step when set: a ``validate``/``test`` run logs at its checkpoint's step
        #: (:mod:`lit_rl.eval_runs`); Lightning's evaluation loops log at step 0
        self.eval_step: int | None = None

    @property
    def experiment(self) -> Any:
        if not self._initialized and self._run_id is None and self._experiment_id is None and rank_zero_only.rank == 0:
            # Lightning's own lookup-then-create races when fits start together on a new experiment
            self._experiment_id = get_or_create_experiment(self._mlflow_client, self._experiment_name,
                                                           self._artifact_location)
        client = super().experiment
        if rank_zero_only.rank != 0:  # Lightning's stand-in: nothing is sent from other ranks
            return client
        if self._client_view is None or self._client_view._client is not client:
            self._client_view = _DeferringClient(client, self)
        return self._client_view

    # artifacts ---------------------------------------------------------------------------------------
    def _artifact_call(self, call: Any, name: str, args: tuple, kwargs: dict) -> Any:
        if not self._uploads and self._down_since is None and self._server_problem() is None:
            if self._attempt(lambda: call(*args, **kwargs)):
                return None
        self._uploads.append((call, name, self._snapshot(name, args), kwargs))
        return None

    def _snapshot(self, name: str, args: tuple) -> tuple:
        """``args`` with the local file or folder of a ``log_artifact(s)`` call replaced by a copy."""
        if name not in ("log_artifact", "log_artifacts") or len(args) < 2:
            return args
        src = Path(args[1])
        dst = self.spill_dir.resolve() / f"{self.run_id}-artifacts" / str(len(self._uploads)) / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
        return (args[0], str(dst), *args[2:])

    def _send_uploads(self) -> bool:
        while self._uploads:
            call, name, args, kwargs = self._uploads[0]
            if not self._attempt(lambda: call(*args, **kwargs)):
                return False
            self._uploads.pop(0)
            if name in ("log_artifact", "log_artifacts"):
                shutil.rmtree(Path(args[1]).parent, ignore_errors=True)
        return True

    # 1. queue and send -------------------------------------------------------------------------------
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from lightning.fabric.utilities.logger import _add_prefix
        from mlflow.entities import Metric

        metrics = _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        stamp = int(time.time() * 1000)
        for key, value in metrics.items():
            if isinstance(value, str):
                log.warning("Discarding metric with string value %s=%s.", key, value)
                continue
            clean = re.sub("[^a-zA-Z0-9_/. -]+", "", key)  # the characters MLflow allows in a metric name
            if clean != key:
                rank_zero_warn(f"MLflow allows only '_', '/', '.', ' ' and '-' besides letters and digits in a "
                               f"metric name; logging {key!r} as {clean!r}", category=RuntimeWarning)
            at = self.eval_step if self.eval_step is not None else (step or 0)
            self._outbox.append(Metric(key=clean, value=float(value), timestamp=stamp, step=at))
        self._send(wait=False)
        if len(self._outbox) > self.max_unsent:
            self._spill()

    def _http(self):
        return _mlflow_http(self.send_retries, self.send_timeout_s)

    def _attempt(self, fn: Any) -> bool:
        """Run ``fn()`` with this logger's short HTTP retries: ``True`` if it worked, ``False`` (the outage
        noted) on an outage; any other error is raised. MLflow's SQL store logs each failed query with its
        traceback and every bound parameter (a full disk printed 2,400 lines); those records are dropped here,
        the outage is said once (:meth:`_note_outage`)."""
        try:
            with self._http(), _quiet(_SQL_STORE_LOGGER):
                fn()
        except Exception as e:  # noqa: BLE001 - sorted by is_transient; the rest is raised
            if not is_transient(e):
                raise
            self._note_outage(e)
            return False
        return True

    def _server_problem(self) -> str | None:
        uri = self._tracking_uri or ""
        return tracking_uri_problem(uri, timeout=2.0) if uri.startswith(("http://", "https://")) else None

    def _send(self, wait: bool) -> bool:
        """Send the outbox; ``True`` when it is empty. ``wait=False`` tries at most once (and not before the
        outage's next try time)."""
        if not self._outbox and not self._uploads:
            return True
        if not wait and time.monotonic() < self._next_try:
            return False
        problem = self._server_problem()

        def send_outbox() -> None:
            if problem:
                raise ConnectionRefusedError(problem)
            while self._outbox:
                self.experiment.log_batch(run_id=self.run_id, metrics=self._outbox[:BATCH])
                del self._outbox[:BATCH]

        if not self._attempt(send_outbox):
            return False
        if not self._send_uploads():
            return False
        if self._down_since is not None:
            rank_zero_warn(f"{self._store} answers again after "
                           f"{time.monotonic() - self._down_since:.0f} s; what was kept meanwhile was sent")
        self._down_since = None
        return True

    # 2. an outage --------------------------------------------------------------------------------------
    @property
    def _store(self) -> str:
        """How the lines name the store: ``MLflow store sqlite:///...`` or ``MLflow tracking server http://...``."""
        uri = str(self._tracking_uri or "")
        return f"MLflow {'store' if uri.startswith('sqlite:') else 'tracking server'} {uri}"

    def _note_outage(self, e: BaseException) -> None:
        self._last_error = root_cause(e)
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            rank_zero_warn(f"{self._store} is not taking metrics ({self._last_error}); training goes on, metrics "
                           f"are kept and sent when it answers (tried again every {self.retry_every_s:g} s)")
        self._next_try = now + self.retry_every_s

    def _store_full(self) -> bool:
        """A SQLite store whose disk is full: waiting at the end does not help (nothing frees the disk)."""
        return str(self._tracking_uri or "").startswith("sqlite:") and any(
            w in self._last_error for w in ("disk is full", "No space left", "disk I/O error"))

    # 3. spill to disk --------------------------------------------------------------------------------
    def _spill(self, end_status: str | None = None) -> Path | None:
        """Write the outbox to a spill file (``end_status``: also when empty, the run's end for the replay)."""
        if not self._outbox and end_status is None:
            return None
        head = {"tracking_uri": self._tracking_uri, "run_id": self.run_id}
        lines = [json.dumps({**head, "end_status": end_status} if end_status else head)]
        lines += [json.dumps(_metric_row(m)) for m in self._outbox]
        path = self.spill_dir.resolve() / f"{self.run_id}-{uuid.uuid4().hex[:8]}.jsonl"
        atomic_write_text(path, "\n".join(lines) + "\n", mode=0o600)  # its tracking URI may hold credentials
        rank_zero_warn(f"{self._store}: {len(self._outbox)} unsent metrics of run "
                       f"{self.run_id} written to {path}")
        self._spilled.append(path)
        self._outbox.clear()
        return path

    # 4. the end of the fit ---------------------------------------------------------------------------
    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self._initialized or self._gave_up:  # said already (Lightning calls it again after the error)
            return
        ok = status in ("success", "finished")
        wait = self.final_wait_s if ok and not self._store_full() else 0.0  # a failed fit: one try, no wait
        deadline = time.monotonic() + wait
        _until(lambda: self._send(wait=True), deadline)
        while not self._outbox and self._spilled and self._server_problem() is None:
            if not self._attempt(lambda: replay(self._spilled[:1], tracking_uri=self._tracking_uri)):
                break  # the files stay; the error below names them
            self._spilled.pop(0)
        if self._outbox or self._spilled or self._uploads:
            self._spill(end_status="FINISHED" if ok else "FAILED")
            files = " ".join(str(p) for p in self._spilled)
            waited = f"waited {wait:g} s at the end; " if wait else ""
            msg = (f"{self._store} did not take the metrics of run {self.run_id} ({waited}last error: "
                   f"{self._last_error})")
            if ok:
                msg += "; training went on to the end, its checkpoints are saved as usual"
            if files:
                msg += (f"; the metrics are in {files}; send them with: python -m lit_rl.loggers replay {files}"
                        + (" once the disk has room" if self._store_full() else ""))
            if self._uploads:
                kept = ", ".join(str(a[1]) if n in ("log_artifact", "log_artifacts")
                                 else f"{n} {kw.get('artifact_file', '')}".strip() for _, n, a, kw in self._uploads)
                msg += f"; {len(self._uploads)} artifact uploads did not happen (copies: {kept})"
            self._gave_up = True
            if ok:
                raise TrackingUnavailableError(msg)
            rank_zero_warn(msg)  # the fit failed already: keep its own error, and do not wait on the server
            return
        end = super().finalize
        if _until(lambda: self._attempt(lambda: end(status)), deadline):  # the end status, with the same patience
            return
        msg = (f"{self._store}: every metric of run {self.run_id} was sent, but the "
               f"run could not be marked {'FINISHED' if ok else 'FAILED'} (last error: {self._last_error}); "
               "it shows as RUNNING")
        if ok:
            raise TrackingUnavailableError(msg)
        rank_zero_warn(msg)


_SQL_STORE_LOGGER = "mlflow.store.db.utils"


@contextlib.contextmanager
def _quiet(name: str):
    """Drop the records of logger ``name`` below CRITICAL while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def root_cause(e: BaseException) -> str:
    """The first line of the innermost cause of ``e`` (``__cause__``, ``__context__``, SQLAlchemy's ``orig``):
    ``database or disk is full`` rather than MLflow's and SQLAlchemy's wrapping of it."""
    seen, inner = set(), e
    while id(inner) not in seen:
        seen.add(id(inner))
        nxt = getattr(inner, "orig", None) or inner.__cause__
        ctx = inner.__context__
        if nxt is None and ctx is not None and type(ctx).__module__.split(".")[0] in ("sqlalchemy", "sqlite3"):
            nxt = ctx  # raised while handling the database's error (not an unrelated one being handled)
        if not isinstance(nxt, BaseException):
            break
        inner = nxt
    text = str(inner).strip() or str(e).strip()
    return one_line(text, 500) or type(inner).__name__


def _until(fn: Any, deadline: float) -> bool:
    """Call ``fn()`` until it returns True (then True) or ``deadline`` (``time.monotonic()``) has passed (then
    False); at least once, with backoff from 1 s up to 15 s between calls."""
    delay = 1.0
    while not fn():
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(2 * delay, 15.0)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lit_rl.loggers",
                                description="Send metrics that lit_rl's MLFlowLogger spilled to disk.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replay", help="send spill files to their runs, deleting each once sent")
    r.add_argument("files", nargs="+")
    r.add_argument("--tracking_uri", default=None, help="send to this server instead of the one in the file")
    r.add_argument("--keep", action="store_true", help="keep the files after sending")
    a = p.parse_args(argv)
    n = replay(a.files, tracking_uri=a.tracking_uri, delete=not a.keep)
    print(f"sent {n} metrics from {len(a.files)} file(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
