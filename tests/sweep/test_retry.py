"""lit_rl.sweep.retry without a server: the backoff's waits (hand-computed, no real sleeping), which errors
are retried, the error when the budget is spent, and the retrying Optuna storage (a SQLite file whose
session factory fails twice as a dropped PostgreSQL connection would)."""

from __future__ import annotations

import pickle

import optuna
import pytest
from sqlalchemy import exc as sa_exc

from lit_rl.sweep import SweepConfig
from lit_rl.sweep.retry import Backoff, StorageUnavailableError, call_with_retry, is_connection_error


def _dropped() -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))


def test_backoff_doubles_caps_and_stops_at_the_budget():
    # 0.5, 1, 2, then the cap 3, 3; the budget 10 leaves 0.5 for the last wait (0.5+1+2+3+3 = 9.5)
    assert list(Backoff(first=0.5, factor=2, cap=3, timeout=10).delays()) == [0.5, 1, 2, 3, 3, 0.5]
    assert list(Backoff(first=1, factor=1, cap=1, timeout=3).delays()) == [1, 1, 1]
    assert list(Backoff(timeout=0).delays()) == []
    default = list(Backoff().delays())  # 0.5 doubling to the 15 s cap, 300 s in all
    assert default[:7] == [0.5, 1, 2, 4, 8, 15, 15] and sum(default) == pytest.approx(300)
    with pytest.raises(ValueError, match="factor >= 1"):
        Backoff(factor=0.5)


def test_call_with_retry_waits_the_backoff_then_succeeds():
    slept, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) <= 3:
            raise optuna.exceptions.StorageInternalError("commit failed") from _dropped()  # as Optuna re-raises
        return "ok"

    assert call_with_retry(flaky, "get_trial", Backoff(first=0.5, factor=2, cap=3, timeout=10), sleep=slept.append) \
        == "ok"
    assert slept == [0.5, 1, 2] and len(calls) == 4


def test_call_with_retry_gives_up_naming_the_url_without_the_password():
    slept = []

    def down():
        raise _dropped()

    with pytest.raises(StorageUnavailableError) as info:
        call_with_retry(down, "record_heartbeat", Backoff(first=1, factor=2, cap=2, timeout=5),
                        url="postgresql+psycopg://sweeper:hunter2@db:5432/optuna", sleep=slept.append)
    assert slept == [1, 2, 2]
    msg = str(info.value)
    assert "postgresql+psycopg://sweeper:***@db:5432/optuna" in msg and "hunter2" not in msg
    assert "record_heartbeat still failed after 4 attempts over 5 s (storage_retry_s=5)" in msg
    assert "server closed the connection unexpectedly" in msg


def test_other_errors_are_not_retried():
    slept = []
    for error in (ValueError("bad value"), sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")),
                  optuna.exceptions.UpdateFinishedTrialError("trial already finished")):
        assert not is_connection_error(error)

        def fail(error=error):
            raise error

        with pytest.raises(type(error)):
            call_with_retry(fail, "x", Backoff(), sleep=slept.append)
    assert slept == []
    invalidated = sa_exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)
    assert is_connection_error(invalidated) and is_connection_error(sa_exc.InterfaceError("", {}, Exception()))


def test_retrying_storage_rides_out_two_failed_sessions(tmp_path, monkeypatch):
    from optuna.storages._rdb import storage as rdb

    from lit_rl.sweep.retry import RetryingRDBStorage

    url = f"sqlite:///{tmp_path}/o.db"
    storage = RetryingRDBStorage(url, backoff=Backoff(first=0.25, factor=2, cap=1, timeout=5))
    slept = []
    storage.sleep = slept.append
    study = optuna.create_study(storage=storage, study_name="s")
    real, failures = rdb._create_scoped_session, [2]

    def drops_twice(*args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise optuna.exceptions.StorageInternalError("commit failed") from _dropped()
        return real(*args, **kwargs)

    monkeypatch.setattr(rdb, "_create_scoped_session", drops_twice)
    study.set_user_attr("ready", True)  # two dropped sessions, then through
    assert slept == [0.25, 0.5] and failures == [0]
    assert study.user_attrs == {"ready": True}
    # a spawned DDP rank gets the storage pickled: the backoff goes with it
    clone = pickle.loads(pickle.dumps(storage))
    assert type(clone) is RetryingRDBStorage and clone.backoff == storage.backoff


def test_make_storage_retries_only_server_urls(tmp_path):
    from lit_rl.sweep.retry import RetryingRDBStorage

    raw = {"study_name": "s", "base": ["conf/erils.yaml"], "space": {"x": {"type": "categorical", "choices": [1]}},
           "sampler": {"name": "grid"}, "storage": f"sqlite:///{tmp_path}/o.db", "storage_retry_s": 7}
    sqlite = SweepConfig.from_dict(raw).make_storage()
    assert type(sqlite) is optuna.storages.RDBStorage  # one local file: no connection to drop
    with pytest.raises(ValueError, match="storage_retry_s: must be an integer >= 0, got -1"):
        SweepConfig.from_dict({**raw, "storage_retry_s": -1})
    cfg = SweepConfig.from_dict({**raw, "storage": "postgresql+psycopg://u@127.0.0.1:1/db"})
    assert cfg.storage_retry_s == 7
    # building it would connect (port 1 refuses): check the class and kwargs the config picks instead
    import lit_rl.sweep.retry as retry

    seen = {}

    class Probe(RetryingRDBStorage):
        def __init__(self, url, **kwargs):
            seen.update(kwargs, url=url)

    retry.RetryingRDBStorage = Probe
    try:
        cfg.make_storage()
    finally:
        retry.RetryingRDBStorage = RetryingRDBStorage
    assert seen["engine_kwargs"] == {"pool_pre_ping": True} and seen["backoff"] == Backoff(timeout=7)
