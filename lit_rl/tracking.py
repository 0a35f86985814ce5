"""MLflow tracking URIs: which ones lit_rl accepts, and a reachability probe for the config preflight."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["check_tracking_uri", "tracking_uri_problem"]


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
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        folder = db.parent
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            return f"MLflow store {uri!r} unreachable: cannot create or write {folder}"
        if db.exists() and not os.access(db, os.R_OK | os.W_OK):
            return f"MLflow store {uri!r} unreachable: {db} is not readable and writable"
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
