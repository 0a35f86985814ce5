"""Storage calls that ride out a dropped database connection (a PostgreSQL restart, a failover, a network
blip): :class:`Backoff` (the waits), :func:`call_with_retry` and :class:`RetryingRDBStorage`, an Optuna
``RDBStorage`` whose every database call is retried with exponential backoff on connection errors.

What is retried: SQLAlchemy ``OperationalError``/``InterfaceError`` and DBAPI errors that invalidated the
connection, found anywhere in the exception's cause chain (Optuna re-raises them as ``StorageInternalError``).
Anything else (a bad value, a missing table, Optuna's "trial already finished") is raised at once. When the
budget (``Backoff.timeout`` seconds of waiting) is spent, :class:`StorageUnavailableError` names the storage URL
(password hidden), the call and the last error.

A call is re-run whole, so a commit that reached the server but whose reply was lost is run twice: for a
state change that is Optuna's own guard (a second finish raises, a second claim returns ``False``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

log = logging.getLogger("lit_rl.sweep")

# RetryingRDBStorage: built on first access by the module __getattr__ below (Optuna is imported then)
__all__ = ["Backoff", "RetryingRDBStorage", "StorageUnavailableError", "call_with_retry", "is_connection_error"]  # noqa: F822


class StorageUnavailableError(ConnectionError):
    """The storage stayed unreachable for the whole retry budget."""


@dataclass(frozen=True)
class Backoff:
    """Waits of ``first * factor**i`` seconds, each at most ``cap``, until they add up to ``timeout``
    (the last wait is cut to land on it). ``timeout`` 0: no retry."""

    first: float = 0.5
    factor: float = 2.0
    cap: float = 15.0
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.first <= 0 or self.factor < 1 or self.cap < self.first or self.timeout < 0:
            raise ValueError(f"Backoff needs first > 0, factor >= 1, cap >= first, timeout >= 0; got {self}")

    def delays(self) -> Iterator[float]:
        waited, delay = 0.0, self.first
        while waited < self.timeout:
            step = min(delay, self.cap, self.timeout - waited)
            yield step
            waited += step
            delay *= self.factor


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a lost or refused database connection."""
    from sqlalchemy import exc as sa_exc

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return True
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _safe_url(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as it is
        return url


def call_with_retry(fn: Callable[[], Any], what: str, backoff: Backoff, url: str = "",
                    sleep: Callable[[float], None] = time.sleep) -> Any:
    """``fn()``, re-run after each wait of ``backoff`` while it raises a connection error."""
    delays = backoff.delays()
    attempt, waited = 0, 0.0
    while True:
        try:
            return fn()
        except Exception as e:
            if not is_connection_error(e):
                raise
            delay = next(delays, None)
            if delay is None:
                raise StorageUnavailableError(
                    f"storage {_safe_url(url)}: {what} still failed after {attempt + 1} attempt{'s' * (attempt > 0)} "
                    f"over {waited:g} s "
                    f"(storage_retry_s={backoff.timeout:g}); last error: {_root_message(e)}") from e
            attempt += 1
            log.warning("storage %s: %s failed (%s); retry %d in %.1f s", _safe_url(url), what, _root_message(e),
                        attempt, delay)
            sleep(delay)
            waited += delay


def _root_message(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"


def _make_rdb_class():
    import optuna

    base = optuna.storages.RDBStorage
    # every method that opens a database session, public or called by Optuna's cached storage and
    # fail_stale_trials (names absent from an Optuna version are skipped)
    names = [
        "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
        "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
        "get_study_system_attrs", "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies",
        "create_new_trial", "_create_new_trial", "set_trial_param", "_set_trial_param", "get_trial_param",
        "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
        "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials", "_get_trials", "get_best_trial",
        "_get_best_trial_id", "record_heartbeat", "_get_stale_trial_ids", "get_n_trials",
    ]
    local = threading.local()

    def retried(name: str):
        method = getattr(base, name)

        def call(self, *args, **kwargs):
            if getattr(local, "depth", 0):  # called from another retried method: its retry covers this one
                return method(self, *args, **kwargs)
            local.depth = 1
            try:
                return call_with_retry(lambda: method(self, *args, **kwargs), name, self.backoff, self.url,
                                       self.sleep)
            finally:
                local.depth = 0

        call.__name__ = call.__qualname__ = name
        call.__doc__ = method.__doc__
        return call

    body: dict[str, Any] = {
        "__doc__": "An ``RDBStorage`` whose database calls are retried with ``backoff`` on connection errors.",
        "__module__": __name__,
        "sleep": staticmethod(time.sleep),
    }

    def __init__(self, url: str, *args, backoff: Backoff = Backoff(), **kwargs) -> None:
        self.backoff = backoff
        base.__init__(self, url, *args, **kwargs)

    body["__init__"] = __init__
    for name in names:
        if name in vars(base):  # defined by RDBStorage itself, not only inherited from BaseStorage
            body[name] = retried(name)
    return type("RetryingRDBStorage", (base,), body)


def __getattr__(name: str):  # the class is built on first use, so importing this module stays light
    if name == "RetryingRDBStorage":
        cls = _make_rdb_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
