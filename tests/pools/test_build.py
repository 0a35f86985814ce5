"""The pool builder: builds from configs, length control in a build, filtering/ordering, crash safety and resume (a
real subprocess killed with SIGKILL), a server that dies mid-build, faults during a build (nothing lost). The config
loader and LengthControl alone are tested in test_build_config.py and test_length_control.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lit_rl.pools.backends import BackendError, BackendRequestError, GenResult, ScriptedBackend
from lit_rl.pools.build import BuildConfigError, build_info_path, build_pool, load_build_config
from lit_rl.pools.pool import PoolFormatError, iter_pool, load_pool, repair_pool_for_resume
from lit_rl.tasks import get_task
from openai_test_server import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
N_PROMPTS, N = 8, 3


def _config(tmp_path, url, name="pool", **over):
    cfg = {
        "task": {"class_path": "lit_rl.tasks.SudokuTask", "init_args": {"num_train": N_PROMPTS}},
        "out": str(tmp_path / f"{name}.jsonl"),
        "n": N,
        "seed": 42,
        "g_ext": 2,
        "length_tokenizer": "lit_rl/char",
        "prompts_per_wave": 3,
        "sampling": {"temperature": 1.0, "max_tokens": 4096},
        "length_control": {"mode": "two_stage", "target_total_tokens": 256},
        "backend": {"type": "openai", "base_url": "${LIT_RL_TEST_URL}", "model": "fake-qwen3", "concurrency": 4,
                    "timeout_s": 10, "max_retries": 3, "backoff_s": 0.01, "max_backoff_s": 0.05},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    os.environ["LIT_RL_TEST_URL"] = url
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted two-stage build against a fault-free server (the pool every other build must equal)."""
    tmp = tmp_path_factory.mktemp("ref")
    with FakeOpenAIServer() as srv:
        res = build_pool(load_build_config(_config(tmp, srv.url, "ref")), progress=False)
    assert res.prompts_done == N_PROMPTS and res.retries == 0
    return Path(res.pool).read_bytes()


def test_reference_pool_content(reference, tmp_path):
    path = tmp_path / "ref.jsonl"
    path.write_bytes(reference)
    header, records = iter_pool(path)
    records = list(records)
    assert header["task"] == "sudoku" and header["policy"] == "fake-qwen3" and header["tokenizer"] == "lit_rl/char"
    assert header["length_unit"] == "tokens" and header["n"] == N and header["seed"] == 42
    assert header["length_control"]["mode"] == "two_stage" and header["sampling"]["max_tokens"] == 4096
    ids = [f"sudoku-train-{i}" for i in range(N_PROMPTS)]
    assert [r.prompt_id for r in records] == [pid for pid in ids for _ in range(N)]  # prompt order, n each
    task = get_task("sudoku", num_train=N_PROMPTS)
    by_id = {ex.id: ex for ex in task.train_examples()}
    for r in records:
        s1 = r.meta["stage1"]
        # the verifier was re-run on the final (rewritten) text; stage-1 text/reward kept for analysis
        assert r.reward == task.reward(r.completion, by_id[r.prompt_id])
        assert s1["reward"] == task.reward(s1["completion"], by_id[r.prompt_id])
        assert r.num_tokens == len(r.completion) or "<answer>" in r.completion  # char tokenizer: tags are 1 token
        assert s1["num_tokens"] > r.num_tokens
        assert r.usable == (r.num_tokens <= 500)
    # usable first within every prompt, reward never looked at
    for pid in ids:
        group = [r for r in records if r.prompt_id == pid]
        assert [r.index for r in group] == list(range(N))
        flags = [r.usable for r in group]
        assert flags == sorted(flags, reverse=True)


def test_resume_after_torn_tail_reproduces_the_pool(reference, tmp_path):
    with FakeOpenAIServer() as srv:
        cfg_path = _config(tmp_path, srv.url)
        out = tmp_path / "pool.jsonl"
        lines = reference.split(b"\n")
        header_len = len(lines[0]) + 1
        # cut points: right after the header, inside a prompt (line boundary), in the middle of a line
        for cut in (header_len, header_len + sum(len(x) + 1 for x in lines[1:3]),
                    header_len + sum(len(x) + 1 for x in lines[1:5]) + 40):
            out.write_bytes(reference[:cut])
            res = build_pool(load_build_config(cfg_path), progress=False)
            assert out.read_bytes() == reference and res.prompts_done == N_PROMPTS
        state = repair_pool_for_resume(out, N)
        assert state.done == [f"sudoku-train-{i}" for i in range(N_PROMPTS)] and state.dropped_lines == 0


def test_repair_rejects_damage_in_the_middle(reference, tmp_path):
    out = tmp_path / "pool.jsonl"
    lines = reference.split(b"\n")
    out.write_bytes(b"\n".join(lines[:2] + [b"{broken"] + lines[3:]))
    with pytest.raises(PoolFormatError, match="pool.jsonl:3"):
        repair_pool_for_resume(out, N)
    out.write_bytes(b"\n".join(lines[:1] + lines[1:3] + lines[4:]))  # a prompt with 2 of 3 records mid-file
    with pytest.raises(PoolFormatError, match="has 2 records before"):
        repair_pool_for_resume(out, N)


def test_transient_faults_during_a_build_lose_nothing(reference, tmp_path):
    faults = ["timeout", "500", "503", "malformed", "no_choices", "truncated", "reset", None]

    def fault(i, body, attempt):  # a different fault on the first attempt of most requests
        return faults[body["seed"] % len(faults)] if attempt == 1 else None

    with FakeOpenAIServer(fault=fault, timeout_sleep_s=3.0) as srv:
        cfg_path = _config(tmp_path, srv.url, backend={"timeout_s": 1.5, "max_retries": 4, "concurrency": 8},
                           prompts_per_wave=8)
        res = build_pool(load_build_config(cfg_path), progress=False)
        assert set(srv.faults_sent) == set(faults) - {None}
    assert (tmp_path / "pool.jsonl").read_bytes() == reference
    info = json.loads(build_info_path(tmp_path / "pool.jsonl").read_text())
    assert res.retries >= sum(srv.faults_sent.values()) and info["sessions"][0]["retries"] == res.retries
    assert set(info["sessions"][0]["retry_reasons"]) >= {"timeout", "http_500", "http_503", "malformed", "truncated",
                                                         "connection"}


def test_server_dies_mid_build_then_resume(reference, tmp_path):
    srv = FakeOpenAIServer(die_after=20).start()  # dies during the second wave
    try:
        cfg_path = _config(tmp_path, srv.url, backend={"max_retries": 2})
        with pytest.raises(BackendError, match=r"(?s)failed after 3 attempts; last error: connection: cannot reach"
                           r".*keeps the \d+ complete prompts; rerun"):
            build_pool(load_build_config(cfg_path), progress=False)
        out = tmp_path / "pool.jsonl"
        header, records = iter_pool(out)  # valid file: whole prompts only
        done = [r.prompt_id for r in records]
        assert 0 < len(done) < N_PROMPTS * N and len(done) % N == 0
        info = json.loads(build_info_path(out).read_text())
        assert info["status"].startswith("failed: ") and info["prompts_done"] == len(done) // N
        srv.restart()  # the same port
        res = build_pool(load_build_config(cfg_path), progress=False)
        assert res.resumed_from == len(done) // N and res.prompts_done == N_PROMPTS
        assert out.read_bytes() == reference
        info = json.loads(build_info_path(out).read_text())
        assert [s["status"][:6] for s in info["sessions"]] == ["failed", "comple"] and info["status"] == "complete"
    finally:
        srv.stop()


def test_kill_and_resume_subprocess(reference, tmp_path):
    """SIGKILL a real ``rollouts build`` mid-way; the resumed pool equals the uninterrupted one."""
    with FakeOpenAIServer(delay_s=0.15) as srv:
        cfg_path = _config(tmp_path, srv.url, backend={"concurrency": 2}, prompts_per_wave=2)
        out = tmp_path / "pool.jsonl"
        env = {**os.environ, "LIT_RL_TEST_URL": srv.url, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "lit_rl", "rollouts", "build", "--config", str(cfg_path),
                                 "--no_progress", "--no_stats"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        lines = 0
        while time.time() < deadline and proc.poll() is None:
            lines = out.read_bytes().count(b"\n") - 1 if out.exists() else 0
            if lines >= 2 * N:  # at least two prompts written
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = out.read_bytes()
        header, records = iter_pool(out)
        written = len(list(records))
        assert 0 < written < N_PROMPTS * N  # killed mid-build, the file is a valid prefix
        assert reference.startswith(killed_at)
        res = build_pool(load_build_config(cfg_path), progress=False)
    assert res.resumed_from == written // N and res.prompts_generated == N_PROMPTS - written // N
    sessions = json.loads(build_info_path(out).read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "complete"]
    assert out.read_bytes() == reference  # same prompts, same records, no duplicates
    ids = [r.prompt_id for r in iter_pool(out)[1]]
    assert len(ids) == N_PROMPTS * N and len(set(ids)) == N_PROMPTS


def test_resume_with_a_different_config_is_refused(reference, tmp_path):
    out = tmp_path / "pool.jsonl"
    out.write_bytes(reference)
    with FakeOpenAIServer() as srv:
        cfg_path = _config(tmp_path, srv.url, sampling={"temperature": 0.7})
        with pytest.raises(BuildConfigError,
                           match=r"different settings \(sampling: pool has .*\"temperature\": 1.0.*--overwrite"):
            build_pool(load_build_config(cfg_path), progress=False)
        # a larger limit (or an unchanged config) extends/keeps the pool; --overwrite starts over
        res = build_pool(load_build_config(_config(tmp_path, srv.url)), progress=False)
        assert res.prompts_generated == 0 and out.read_bytes() == reference


def test_instruction_mode_appends_the_instruction(tmp_path):
    seen = []
    with FakeOpenAIServer(fault=lambda i, body, attempt: seen.append(body["messages"]) or None) as srv:
        cfg = load_build_config(_config(tmp_path, srv.url, length_control={
            "mode": "instruction", "target_total_tokens": 77,
            "instruction": "Be brief: about {target_total_tokens} tokens."}, n=2), {"limit": 2})
        res = build_pool(cfg, progress=False)
    assert res.prompts_done == 2 and len(seen) == 4
    task = get_task("sudoku", num_train=2)
    # requests run concurrently, so the server sees them in any order: compare as a multiset
    expected = sorted(
        task.messages(e)[-1]["content"].rstrip() + "\n\nBe brief: about 77 tokens." for e in task.train_examples()
        for _ in range(2)
    )
    assert sorted(m[-1]["content"] for m in seen) == expected
    recs = list(iter_pool(res.pool)[1])
    assert all("stage1" not in r.meta and r.meta["length_control"] == "instruction" for r in recs)


class _Canned(ScriptedBackend):
    """Hand-made candidates: lengths and rewards known in advance."""

    def __init__(self, texts):
        super().__init__("sudoku")
        self.texts = texts

    def generate(self, requests, sampling, on_result=None, hooks=None):
        out = []
        for i, r in enumerate(requests):
            # n consecutive requests per prompt
            res = GenResult(self.texts[r.example.id][i % len(self.texts[r.example.id])])
            out.append(res)
            if on_result:
                on_result(i, res)
        return out


def test_filtering_and_ordering_by_length_only(tmp_path):
    task = get_task("sudoku", num_train=2)
    e0, e1 = task.train_examples()
    right0, right1 = f"<answer>{e0.answer}</answer>", f"<answer>{e1.answer}</answer>"
    pad = lambda k: "<reasoning>" + "x" * k + "</reasoning>\n"  # noqa: E731  (k + 3 tokens with the char tokenizer)
    texts = {
        # prompt 0: candidates 0 and 2 too long (one of them correct), 1 and 3 usable (one wrong)
        e0.id: [pad(600) + right0, pad(10) + "<answer>0</answer>", pad(700) + right0, pad(20) + right0],
        # prompt 1: only one usable candidate -> not usable with G_ext = 2
        e1.id: [pad(900) + right1, pad(5) + right1, pad(800) + right1, pad(501) + right1],
    }
    cfg = load_build_config(_config(tmp_path, "http://unused", n=4, length_control={"mode": "instruction"},
                                    task={"init_args": {"num_train": 2}}))
    res = build_pool(cfg, progress=False, backend=_Canned(texts), task=task)
    recs = list(iter_pool(res.pool)[1])
    p0 = [r for r in recs if r.prompt_id == e0.id]
    assert [r.meta["candidate"] for r in p0] == [1, 3, 0, 2]  # usable first, original order kept
    assert [r.usable for r in p0] == [True, True, False, False]
    assert [r.reward for r in p0] == [0.0, 1.0, 1.0, 1.0]  # a wrong usable one stays ahead of right long ones
    pool = load_pool(res.pool, g_ext=2, valid_ids=[e0.id, e1.id], task="sudoku")
    assert list(pool) == [e0.id] and [r.meta["candidate"] for r in pool[e0.id]] == [1, 3]


def test_embedded_config_builds_here(tmp_path):
    cfg = load_build_config(ROOT / "conf/external/sudoku_embedded.yaml",
                            {"out": str(tmp_path / "emb.jsonl"), "limit": 12})
    res = build_pool(cfg, progress=False)
    header, recs = iter_pool(res.pool)
    recs = list(recs)
    assert res.prompts_done == 12 and len(recs) == 72 and header["policy"] == "scripted-sudoku"
    assert all(r.meta["stage1"]["num_tokens"] > 500 for r in recs)  # verbose first stage
    assert sum(r.usable for r in recs) > 60


def test_resume_with_a_changed_n_cuts_nothing(reference, tmp_path):
    # the pool ends in a torn prompt; a resume with another n must refuse before repairing anything
    out = tmp_path / "pool.jsonl"
    torn = reference[: len(reference) - 50]
    out.write_bytes(torn)
    with FakeOpenAIServer() as srv:
        with pytest.raises(BuildConfigError, match=r"different settings \(n: pool has 3, config has 6"):
            build_pool(load_build_config(_config(tmp_path, srv.url, n=6)), progress=False)
        assert out.read_bytes() == torn
        assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.partial"))


def test_build_info_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    from lit_rl.pools import build

    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("replace") or real_replace(a, b))
    build._write_json_atomic(tmp_path / "x.build.json", {"a": 1})
    # the file's data is fsynced before the rename (then the folder: lit_rl.atomic)
    assert calls[:2] == ["fsync", "replace"] and json.loads((tmp_path / "x.build.json").read_text()) == {"a": 1}


def test_a_refused_first_request_keeps_its_error_type_and_a_fixed_config_starts_over(tmp_path):
    # a server answers 400 to the first build (as vLLM does for max_tokens beyond its context): not retried,
    # a BackendRequestError, nothing written; the corrected config is not refused as "a different build"
    with FakeOpenAIServer(fault=lambda i, body, attempt: "400" if body["max_tokens"] > 2048 else None) as srv:
        with pytest.raises(BackendRequestError, match=r"(?s)HTTP 400 .*not retried.*keeps the 0 complete prompts; "
                                                      r"rerun the same command to resume once the cause is fixed"):
            build_pool(load_build_config(_config(tmp_path, srv.url)), progress=False)
        out = tmp_path / "pool.jsonl"
        assert out.read_bytes().count(b"\n") == 1  # the header alone
        logs = []
        res = build_pool(load_build_config(_config(tmp_path, srv.url, sampling={"max_tokens": 2048})), progress=False,
                         log=logs.append)
    assert res.prompts_done == N_PROMPTS and res.resumed_from == 0
    assert any("holds no prompts yet and was started with other settings: starting over" in m for m in logs)
    header, records = iter_pool(out)
    assert header["sampling"]["max_tokens"] == 2048 and len(list(records)) == N_PROMPTS * N
