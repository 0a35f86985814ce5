"""lit_rl.loggers.MLFlowLogger's outbox on a real MLflow SQLite store with an outage injected into the client's
``log_batch`` (the real tracking server, killed mid-fit, is tests/test_tracking_server.py)."""

from __future__ import annotations

import json
import warnings

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import (INTERNAL_ERROR, INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST,
                                          TEMPORARILY_UNAVAILABLE)
from mlflow.tracking import MlflowClient

from lit_rl.loggers import MLFlowLogger, TrackingUnavailableError, is_transient, main, read_spill


def _logger(tmp_path, **kw) -> MLFlowLogger:
    kw = {"retry_every_s": 0.0, "final_wait_s": 0.0, "spill_dir": str(tmp_path / "spill"), **kw}
    return MLFlowLogger(experiment_name="x", tracking_uri=f"sqlite:///{tmp_path}/m.db", **kw)


class Outage:
    """Makes the logger's client fail ``log_batch`` with MLflow's error for an unreachable server while
    ``down``; counts the attempts."""

    def __init__(self, lg: MLFlowLogger) -> None:
        self.down, self.calls, self.real = False, 0, lg.experiment.log_batch
        lg.experiment.log_batch = self

    def __call__(self, *a, **kw):
        self.calls += 1
        if self.down:
            raise MlflowException("API request to http://h:5000/api/2.0/mlflow/runs/log-batch failed with "
                                  "exception ConnectionError(Max retries exceeded)", error_code=INTERNAL_ERROR)
        return self.real(*a, **kw)


def _steps(lg: MLFlowLogger, key: str = "loss") -> list[int]:
    client = MlflowClient(lg._tracking_uri)
    return [m.step for m in sorted(client.get_metric_history(lg.run_id, key), key=lambda m: m.step)]


def test_an_outage_keeps_metrics_training_goes_on_and_the_backlog_arrives_in_order(tmp_path):
    lg = _logger(tmp_path)
    out = Outage(lg)
    lg.log_metrics({"loss": 1.0}, step=0)
    out.down = True
    with pytest.warns(UserWarning, match="not taking metrics.*training goes on"):
        for s in range(1, 5):
            lg.log_metrics({"loss": 1.0 + s, "acc": 0.1}, step=s)  # returns: the fit is not stopped
    assert _steps(lg) == [0] and len(lg._outbox) == 8
    out.down = False
    with pytest.warns(UserWarning, match="answers again"):
        lg.log_metrics({"loss": 9.0}, step=5)
    assert _steps(lg) == [0, 1, 2, 3, 4, 5] and _steps(lg, "acc") == [1, 2, 3, 4] and not lg._outbox
    lg.finalize("success")
    assert MlflowClient(lg._tracking_uri).get_run(lg.run_id).info.status == "FINISHED"


def test_while_down_a_send_is_tried_only_every_retry_every_s(tmp_path):
    lg = _logger(tmp_path, retry_every_s=3600.0)
    out = Outage(lg)
    out.down = True
    with pytest.warns(UserWarning, match="tried again every 3600 s"):
        for s in range(10):
            lg.log_metrics({"loss": float(s)}, step=s)
    assert out.calls == 1, "a down server is asked once per retry period, not once per step"
    assert len(lg._outbox) == 10


def test_a_request_the_server_will_never_take_is_raised_at_once(tmp_path):
    lg = _logger(tmp_path)
    lg.experiment.log_batch = lambda *a, **k: (_ for _ in ()).throw(
        MlflowException("bad value", error_code=INVALID_PARAMETER_VALUE))
    with pytest.raises(MlflowException, match="bad value"):
        lg.log_metrics({"loss": 1.0}, step=0)


def test_is_transient_sorts_outages_from_bad_requests():
    import requests

    assert is_transient(ConnectionRefusedError("x")) and is_transient(requests.ConnectionError("x"))
    assert is_transient(MlflowException("x", error_code=TEMPORARILY_UNAVAILABLE))
    assert not is_transient(MlflowException("x", error_code=RESOURCE_DOES_NOT_EXIST))
    assert not is_transient(ValueError("x"))


def test_past_max_unsent_the_outbox_goes_to_one_atomic_file_and_finalize_sends_it(tmp_path):
    lg = _logger(tmp_path, max_unsent=2)
    out = Outage(lg)
    out.down = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(7):
            lg.log_metrics({"loss": float(s)}, step=s)
    files = sorted((tmp_path / "spill").glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) == 2 and not list((tmp_path / "spill").glob(".*partial"))
    assert {f.stat().st_mode & 0o777 for f in files} == {0o600}  # the tracking URI may hold credentials
    chunks = [read_spill(f) for f in files]
    assert {h["run_id"] for h, _ in chunks} == {lg.run_id}
    assert sorted(m.step for _, ms in chunks for m in ms) == list(range(6))
    assert [m.step for m in lg._outbox] == [6]  # memory holds only what came after the spills
    out.down = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg.finalize("success")
    assert _steps(lg) == list(range(7)) and not any(f.exists() for f in files)


def test_a_server_that_never_answers_fails_the_fit_naming_uri_run_and_file_and_replay_sends_them(tmp_path, capsys):
    lg = _logger(tmp_path)
    out = Outage(lg)
    lg.log_metrics({"loss": 0.0}, step=0)
    out.down = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in range(1, 4):
            lg.log_metrics({"loss": float(s)}, step=s)
        with pytest.raises(TrackingUnavailableError) as err:
            lg.finalize("success")
    msg = str(err.value)
    files = sorted((tmp_path / "spill").glob("*.jsonl"))
    assert len(files) == 1
    for part in (lg._tracking_uri, lg.run_id, str(files[0]), "python -m lit_rl.loggers replay"):
        assert part in msg
    assert _steps(lg) == [0]
    assert main(["replay", str(files[0])]) == 0 and "sent 3 metrics" in capsys.readouterr().out
    assert _steps(lg) == [0, 1, 2, 3] and not files[0].exists()
    # replay twice (a file kept with --keep, sent again) adds nothing: MLflow ignores identical metrics
    lg2 = _logger(tmp_path / "b")
    out2 = Outage(lg2)
    out2.down = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg2.log_metrics({"loss": 5.0}, step=1)
        with pytest.raises(TrackingUnavailableError):
            lg2.finalize("success")
    f2 = next((tmp_path / "b" / "spill").glob("*.jsonl"))
    main(["replay", "--keep", str(f2)])
    main(["replay", str(f2)])
    assert _steps(lg2) == [1]


def test_after_a_failed_fit_an_outage_is_a_warning_not_a_second_error(tmp_path):
    lg = _logger(tmp_path, final_wait_s=3600.0)  # were it to wait, the test would time out
    out = Outage(lg)
    out.down = True
    with pytest.warns(UserWarning, match="did not take the metrics"):
        lg.log_metrics({"loss": 1.0}, step=0)
        lg.finalize("failed")  # no raise: Lightning is handling the fit's own exception
    assert out.calls == 2  # the send in log_metrics and one try at the end
    assert len(list((tmp_path / "spill").glob("*.jsonl"))) == 1


def test_a_malformed_spill_line_names_file_and_line(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"tracking_uri": "sqlite:///x.db", "run_id": "r"}) + "\n" + '{"key": "a", "value": 1}\n')
    with pytest.raises(ValueError, match=r"s\.jsonl:2: not a lit_rl metrics spill line"):
        read_spill(p)


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_unsent"):
        _logger(tmp_path, max_unsent=0)


def test_an_artifact_logged_during_an_outage_is_uploaded_as_it_was_when_logged(tmp_path):
    lg = _logger(tmp_path)
    out = Outage(lg)
    client = lg.experiment._client
    real_upload = client.log_artifact

    def upload(*a, **kw):
        if out.down:
            raise MlflowException("API request failed: connection refused", error_code=INTERNAL_ERROR)
        return real_upload(*a, **kw)

    client.log_artifact = upload
    samples = tmp_path / "samples.jsonl"
    samples.write_text("step 1\n")
    out.down = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg.log_metrics({"loss": 1.0}, step=1)
        assert lg.experiment.log_artifact(lg.run_id, str(samples)) is None  # deferred, training goes on
        samples.write_text("step 1\nstep 2\n")  # the callback appends after logging
        assert _steps(lg) == [] and len(lg._uploads) == 1
        out.down = False
        lg.log_metrics({"loss": 2.0}, step=2)
    assert _steps(lg) == [1, 2] and not lg._uploads
    got = MlflowClient(lg._tracking_uri).download_artifacts(lg.run_id, "samples.jsonl", str(tmp_path / "dl"))
    assert open(got).read() == "step 1\n", "the upload is the file as it was when it was logged"
    assert not (tmp_path / "spill" / f"{lg.run_id}-artifacts" / "0").exists()


def test_the_runs_end_status_waits_out_an_outage_too_and_says_so_when_it_cannot(tmp_path):
    lg = _logger(tmp_path, final_wait_s=60.0)
    lg.log_metrics({"loss": 1.0}, step=0)
    client = lg.experiment._client
    real, fails = client.set_terminated, [2]

    def set_terminated(*a, **kw):
        if fails[0]:
            fails[0] -= 1
            raise MlflowException("API request failed: connection refused", error_code=INTERNAL_ERROR)
        return real(*a, **kw)

    client.set_terminated = set_terminated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lg.finalize("success")
    assert fails == [0] and MlflowClient(lg._tracking_uri).get_run(lg.run_id).info.status == "FINISHED"

    lg2 = _logger(tmp_path / "b")
    lg2.log_metrics({"loss": 1.0}, step=0)
    lg2.experiment._client.set_terminated = lambda *a, **k: (_ for _ in ()).throw(
        MlflowException("API request failed: connection refused", error_code=INTERNAL_ERROR))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TrackingUnavailableError, match="could not be marked FINISHED.*RUNNING"):
            lg2.finalize("success")
    assert _steps(lg2) == [0]


def test_two_fits_starting_together_on_a_new_experiment_share_it(tmp_path, monkeypatch):
    """The race Lightning's lookup-then-create loses: the other fit creates the experiment between this
    logger's lookup (none yet) and its create; the logger must join it, not fail with RESOURCE_ALREADY_EXISTS."""
    uri = f"sqlite:///{tmp_path}/m.db"
    other = MlflowClient(uri)
    other.search_experiments()  # creates the store's tables first
    real_get = MlflowClient.get_experiment_by_name
    lookups = []

    def late_lookup(self, name):
        lookups.append(name)
        if len(lookups) == 1:  # this logger looks first; the other fit creates the experiment right after
            other.create_experiment(name)
            return None
        return real_get(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", late_lookup)
    lg = MLFlowLogger(experiment_name="together", tracking_uri=uri, spill_dir=str(tmp_path / "spill"))
    lg.log_metrics({"loss": 1.0}, step=0)
    lg.finalize("success")
    (exp,) = [e for e in other.search_experiments() if e.name == "together"]
    assert lg.experiment_id == exp.experiment_id and len(lookups) == 2
    assert [r.info.run_id for r in other.search_runs([exp.experiment_id])] == [lg.run_id]


def test_a_deleted_experiment_of_that_name_is_still_mlflows_error(tmp_path):
    from lit_rl.tracking import get_or_create_experiment

    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(MlflowException, match="already exists"):
        get_or_create_experiment(client, "gone")
    assert get_or_create_experiment(client, "new") == client.get_experiment_by_name("new").experiment_id


def test_artifacts_of_an_embedded_store_go_next_to_its_database(tmp_path, monkeypatch):
    """``sqlite:///runs/mlflow.db`` keeps artifacts under ``runs/mlartifacts``; MLflow's default put them in
    ``./mlruns`` of whatever folder the process started in."""
    from lit_rl.tracking import sqlite_artifact_location

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    logger = MLFlowLogger(experiment_name="e", tracking_uri=f"sqlite:///{tmp_path}/runs/mlflow.db")
    logger.experiment.log_text(logger.run_id, "hello", "notes/a.txt")
    logger.finalize("success")
    assert (tmp_path / "runs" / "mlartifacts").is_dir()
    assert list((tmp_path / "runs" / "mlartifacts").rglob("a.txt"))
    assert not (elsewhere / "mlruns").exists()
    assert sqlite_artifact_location("sqlite:///runs/x.db") == (elsewhere / "runs" / "mlartifacts").as_uri()
    assert sqlite_artifact_location("http://host:5000") is None
