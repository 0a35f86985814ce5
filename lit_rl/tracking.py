"""MLflow tracking URIs: which ones lit_rl accepts, and a reachability probe for the config preflight."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["check_tracking_uri", "get_or_create_experiment", "sqlite_artifact_location", "sqlite_file_problem",
           "tracking_uri_problem"]


def _sqlite_db(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for other URIs and in-memory stores)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri == prefix + ":memory:":
        return None
    return Path(uri[len(prefix):])


#: a SQLite store on a disk with less free space than this is refused before a fit starts
MIN_FREE_BYTES = 1 << 20


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def sqlite_file_problem(db: Path) -> str | None:
    """Why the SQLite file ``db`` cannot serve as an MLflow store (``None``: it is missing, empty, or opens and
    answers a query): not a SQLite database (its header), or SQLite's own error on opening it."""
    import sqlite3

    try:
        if not db.is_file() or db.stat().st_size == 0:
            return None
        with open(db, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        return f"{db} cannot be read ({e.strerror or e})"
    if head != b"SQLite format 3\x00":
        return f"{db} is not an SQLite database (no SQLite header); move it away or name another file"
    try:
        con = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=5)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"{db} cannot be opened by SQLite ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    return None


def check_tracking_uri(uri: str) -> str:
    """Accept ``sqlite:///...`` (and a tracking server ``http(s)://...``); MLflow 3's file store raises."""
    if uri.startswith("sqlite:///") or uri.startswith(("http://", "https://")):
        return uri
    raise ValueError(
        f"MLflow tracking URI {uri!r}: use a sqlite:/// URI (e.g. sqlite:///runs/mlflow.db) or a tracking server; "
        "MLflow 3's file store is not supported"
    )


def tracking_uri_problem(uri: str, timeout: float = 3.0) -> str | None:
    """Why MLflow could not use ``uri`` (``None`` if it looks usable): sqlite files whose folder cannot be
    created, servers that do not accept a connection within ``timeout`` seconds."""
    db = _sqlite_db(uri)
    if db is not None:
        folder = db.parent
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            return f"MLflow store {uri!r} unreachable: cannot create or write {folder}"
        if db.exists() and not os.access(db, os.R_OK | os.W_OK):
            return f"MLflow store {uri!r} unreachable: {db} is not readable and writable"
        problem = sqlite_file_problem(db)
        if problem:
            return f"MLflow store {uri!r} cannot be used: {problem}"
        free = _free_bytes(probe)
        if free is not None and free < MIN_FREE_BYTES:
            return (f"MLflow store {uri!r} cannot be written: {free // 1024} KiB free on {probe} (SQLite needs "
                    f"room for the runs and its journal); free space or point tracking_uri elsewhere")
        return None
    if uri.startswith(("http://", "https://")):
        u = urlparse(uri)
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            with socket.create_connection((u.hostname or "localhost", port), timeout=timeout):
                return None
        except OSError as e:
            return f"MLflow tracking server {uri!r} unreachable ({e.strerror or e})"
    if uri.startswith("file:") or "://" not in uri:
        return (f"MLflow tracking URI {uri!r}: MLflow 3's file store is not supported; "
                "use sqlite:///runs/mlflow.db or a server")
    return None


def sqlite_artifact_location(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go for an embedded SQLite store: ``<db folder>/mlartifacts`` (as a
    ``file://`` URI), so ``sqlite:///runs/mlflow.db`` keeps everything under ``runs/``. MLflow's own default
    is ``./mlruns`` in whatever folder the process started. ``None`` (MLflow's default) for other stores:
    a tracking server decides its artifact root."""
    db = _sqlite_db(tracking_uri)
    return None if db is None else (db.absolute().parent / "mlartifacts").as_uri()


def get_or_create_experiment(client, name: str, artifact_location: str | None = None) -> str:
    """The id of the active experiment ``name``, created if missing; safe when several processes start at once.

    Lightning's ``MLFlowLogger`` (and a plain ``get_experiment_by_name`` + ``create_experiment``) races: two
    fits or sweep workers that start together on a new experiment both find none, and the second create
    fails with ``RESOURCE_ALREADY_EXISTS`` (seen with two fits on one MLflow server with a PostgreSQL store).
    Here the loser looks the experiment up again. A *deleted* experiment of that name still raises MLflow's
    error (restore or purge it: MLflow keeps the name). A new experiment on an embedded SQLite store keeps
    its artifacts next to the database (:func:`sqlite_artifact_location`) unless ``artifact_location`` says.
    """
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage != "deleted":
        return exp.experiment_id
    if artifact_location is None:
        artifact_location = sqlite_artifact_location(getattr(client, "tracking_uri", ""))
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        exp = client.get_experiment_by_name(name)
        if exp is None or exp.lifecycle_stage == "deleted":
            raise
        return exp.experiment_id
