"""The PostgreSQL fixture's contract without a server: no binaries means a skip naming the reason, and a
failure instead under ``CI=true`` (a CI run must not go green by skipping the PostgreSQL tests)."""

import pytest

from support.postgres import find_bin_dir, start_or_skip


def test_no_server_binaries_skip_with_the_reason_and_fail_under_ci(tmp_path, monkeypatch):
    monkeypatch.setenv("LIT_RL_PG_BIN", str(tmp_path))  # a folder without initdb
    with pytest.raises(Exception, match="initdb is missing"):
        find_bin_dir()
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="PostgreSQL could not start: .*initdb is missing"):
        start_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="initdb is missing.*CI=true: a PostgreSQL test must run"):
        start_or_skip()
