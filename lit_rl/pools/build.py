"""Build an external rollout pool (ERILS §IV-A, App. B): ``python -m lit_rl rollouts build --config YAML``.

For each training prompt of the task, in the task's recorded order, ``n`` candidates (paper: 6) are
generated with the configured backend and length control; the verifier is run on each final
completion; lengths are counted with the external model's tokenizer; candidates over
``max_usable_tokens`` (500) are marked unusable and usable ones move to the front (reward is never
looked at); the prompt's records are appended and fsynced together.

Config (YAML; ``${VAR}`` / ``${VAR:-default}`` are replaced by environment variables, an unset variable
without a default is an error)::

    task:                       # the training prompts: class_path + init_args, as in the training configs
      class_path: lit_rl.tasks.SudokuTask
      init_args: {num_train: 10000}
    out: data/pools/sudoku_qwen3.jsonl      # plain JSONL (a .gz name is refused; gzip a finished pool yourself)
    n: 6                        # candidates per prompt
    seed: 42                    # dataset seed: every request's seed derives from it (prompt id, candidate, stage)
    limit: null                 # only the first N prompts (a later run with a larger limit extends the pool)
    g_ext: 2                    # G_ext of the default ERILS run (statistics: "default usable")
    max_usable_tokens: 500
    length_tokenizer: Qwen/Qwen3-30B-A3B-Instruct-2507   # or auto | lit_rl/char | chars
    prompts_per_wave: 256       # prompts whose requests are in the backend at once
    sampling: {temperature: 1.0, max_tokens: 4096, top_p: 1.0}
    length_control: {mode: two_stage, target_total_tokens: 256, instruction: ..., rewrite_prompt: ...}
    backend: {type: openai, base_url: "${LIT_RL_EXTERNAL_URL}", model: Qwen/Qwen3-30B-A3B-Instruct-2507, ...}
    mlflow: {tracking_uri: "sqlite:///runs/mlflow.db", experiment_name: lit_rl-external-pools}   # optional

Crash safety and resume: the header is written first (atomically), then each prompt's ``n`` records in
one append + ``fsync``, in prompt order. Rerunning the same command on an existing pool checks that the
header matches the config (task, policy, sampling, length control, tokenizer, ``n``, seed), cuts a torn
tail (a truncated line or an incomplete last prompt) and generates only the prompts that are missing, so
an interrupted build and an uninterrupted one give the same file. A pool that holds its header and no record (a
build whose first requests failed, e.g. ``max_tokens`` beyond the server's context) is started over when the
config changed. ``<pool>.build.json`` records each session (wall time, requests, retries, endpoint) and the
total generation wall time (ERILS Table XII). Auth and request errors (HTTP 401/403, other 4xx) reach the caller
as :class:`BackendAuthError` / :class:`BackendRequestError`: retrying the same request cannot help.

Scheduling: prompts go to the backend in waves of ``prompts_per_wave``; a prompt is written as soon as its
``n`` final completions are in and every earlier prompt is written (file order = prompt order). With
two-stage length control all first-stage requests of a wave finish before its rewrites start, so a crash
loses at most one wave of work; a larger wave keeps a server busier at the cost of more lost work.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from lit_rl.atomic import atomic_write_text
from lit_rl.pools.backends import (Backend, BackendAuthError, BackendError, BackendRequestError, GenHooks,
                                      GenRequest, GenResult, build_backend, request_seed)
from lit_rl.pools.length_control import LengthCounter, resolve_length_counter
from lit_rl.pools.pool import (
    PoolAppender,
    PoolRecord,
    _header,
    create_pool,
    pool_stem,
    repair_pool_for_resume,
    reorder_usable_first,
)
from lit_rl.tasks.base import Example, Task

from lit_rl.pools.build_config import (  # noqa: F401  (re-exported: the config's public names)
    RESUME_KEYS,
    BuildConfig,
    BuildConfigError,
    build_task,
    load_build_config,
    resolve_env,
)

# --------------------------------------------------------------------------------------------------------
# side file: per-session wall time, requests, retries (Table XII)
# --------------------------------------------------------------------------------------------------------
def build_info_path(pool: str | Path) -> Path:
    return pool_stem(pool).with_name(pool_stem(pool).name + ".build.json")


def read_build_info(pool: str | Path) -> dict[str, Any] | None:
    p = build_info_path(pool)
    if not p.is_file():
        return None
    try:
        info = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # bad JSON or UTF-8: the side file is advisory, start a new one
        return None
    return info if isinstance(info, dict) else None


def _write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------------------------------------
@dataclass
class BuildResult:
    """Outcome of :func:`build_pool`.

    Attributes:
        pool: the pool path.
        prompts_total: prompts in this build (after ``limit``).
        prompts_done: complete prompts in the file now.
        prompts_generated: prompts generated by this session.
        resumed_from: prompts already complete when this session started.
        dropped_lines: torn lines removed before resuming.
        wall_time_s: this session's wall time.
        generation_wall_time_s: total over all sessions of this pool.
        requests, retries: this session's requests (attempts) and retries.
        header: the pool header.
    """

    pool: Path
    prompts_total: int
    prompts_done: int
    prompts_generated: int
    resumed_from: int
    dropped_lines: int
    wall_time_s: float
    generation_wall_time_s: float
    requests: int
    retries: int
    header: dict[str, Any]


def make_header(cfg: BuildConfig, task: Task, backend: Backend, counter: LengthCounter) -> dict[str, Any]:
    """The pool header: everything that determines the records, nothing that varies between sessions."""
    return _header(
        task.name,
        backend.name,
        counter.name,
        length_unit=counter.unit,
        length_fallback=counter.fallback,
        task_spec=cfg.task_spec,
        backend=backend.describe(),
        n=cfg.n,
        seed=cfg.seed,
        g_ext=cfg.g_ext,
        max_usable_tokens=cfg.max_usable_tokens,
        max_reward=float(task.max_reward),
        correct_reward=float(task.correct_reward),
        sampling=asdict(cfg.sampling),
        length_control=asdict(cfg.length_control),
        builder="lit_rl.pools.build",
    )


def _check_resume(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    diff = [k for k in RESUME_KEYS if json.dumps(old.get(k), sort_keys=True) != json.dumps(new.get(k), sort_keys=True)]
    if diff:
        detail = "; ".join(f"{k}: pool has {json.dumps(old.get(k))[:120]}, config has {json.dumps(new.get(k))[:120]}"
                           for k in diff)
        raise BuildConfigError(
            f"{path} exists but was built with different settings ({detail}). Resume with the original config, "
            "write to a new --out, or pass --overwrite to start over"
        )


def _started_over(path: Path, header: dict[str, Any], log: Callable[[str], None]) -> bool:
    """True when ``path`` holds a pool header and not one record, and that header differs from ``header``: a build
    that failed at its first requests (e.g. a server refusing ``max_tokens`` beyond its context) left nothing to
    resume, so the corrected config starts over instead of being refused as a different build."""
    with path.open("rb") as fh:
        first, rest = fh.readline(), fh.read(1)
    if rest or not first.endswith(b"\n"):
        return False
    try:
        old = json.loads(first)
    except (ValueError, RecursionError):  # not a header: the resume path names the problem
        return False
    if not isinstance(old, dict) or old.get("lit_rl_pool") is None:
        return False
    try:
        _check_resume(path, old, header)
    except BuildConfigError:
        log(f"{path} holds no prompts yet and was started with other settings: starting over")
        return True
    return False


def _same_kind(err: BackendError, message: str) -> BackendError:
    """``err``'s class with ``message`` (auth and request errors stay distinguishable for callers)."""
    try:
        return type(err)(message)
    except TypeError:  # a subclass with another signature
        return BackendError(message)


class _Progress:
    """Rich progress bar: prompts done / total, stage, requests in flight, retries."""

    def __init__(self, enabled: bool, total: int, done: int, label: str) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("prompts · {task.fields[stage]} · in flight {task.fields[in_flight]} · retries "
                       "{task.fields[retries]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            refresh_per_second=4,
        )
        self.task_id = self.progress.add_task(label, total=total, completed=done, stage="-", in_flight=0, retries=0)
        self.progress.start()

    def hooks_changed(self, hooks: GenHooks) -> None:
        if self.enabled:
            self.progress.update(self.task_id, in_flight=hooks.in_flight, retries=hooks.retries)

    def stage(self, name: str) -> None:
        if self.enabled:
            self.progress.update(self.task_id, stage=name)

    def advance(self, k: int = 1) -> None:
        if self.enabled:
            self.progress.advance(self.task_id, k)

    def stop(self) -> None:
        if self.enabled:
            self.progress.stop()


def _record(cfg: BuildConfig, task: Task, backend: Backend, counter: LengthCounter, ex: Example, j: int,
            final: GenResult, final_seed: int, stage1: tuple[GenResult, int] | None) -> PoolRecord:
    text = final.text.strip()
    meta: dict[str, Any] = {
        "candidate": j,
        "seed": final_seed,
        "finish_reason": final.finish_reason,
        "completion_tokens": final.completion_tokens,
        "length_control": cfg.length_control.mode,
    }
    if stage1 is not None:
        res1, seed1 = stage1
        text1 = res1.text.strip()
        meta["stage1"] = {
            "completion": text1,
            "reward": float(task.reward(text1, ex)),
            "num_tokens": counter(text1),
            "finish_reason": res1.finish_reason,
            "completion_tokens": res1.completion_tokens,
            "seed": seed1,
        }
    return PoolRecord(
        prompt_id=ex.id,
        index=j,
        source=backend.name,
        completion=text,
        reward=float(task.reward(text, ex)),  # the verifier on the FINAL completion; stage-1 reward never reused
        num_tokens=counter(text),
        tokenizer=counter.name,
        meta=meta,
    )


def build_pool(
    cfg: BuildConfig,
    *,
    progress: bool = True,
    overwrite: bool = False,
    backend: Backend | None = None,
    task: Task | None = None,
    log: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build (or resume) the pool described by ``cfg``; see the module docstring.

    Raises :class:`BackendError` when the backend fails for good (the file then holds every prompt
    finished so far; rerunning resumes) and :class:`BuildConfigError` for config/pool mismatches.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    t_start = time.perf_counter()
    task = task or build_task(cfg.task_spec)
    own_backend = backend is None
    backend = backend or build_backend(cfg.backend_spec, where=f"{cfg.source}: backend")
    examples = task.train_examples()
    if cfg.limit is not None:
        examples = examples[: cfg.limit]
    ids = [ex.id for ex in examples]
    if len(set(ids)) != len(ids):
        raise BuildConfigError(f"{cfg.source}: the task's training prompt ids are not unique")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counter = resolve_length_counter(cfg.length_tokenizer, backend)
    for w in caught:
        log(f"warning: {w.message}")
    header = make_header(cfg, task, backend, counter)
    out = cfg.out
    out.parent.mkdir(parents=True, exist_ok=True)
    info_path = build_info_path(out)

    done: set[str] = set()
    dropped = 0
    info: dict[str, Any] = {"pool": str(out), "sessions": []}
    if out.exists() and not overwrite and _started_over(out, header, log):
        overwrite = True
    if out.exists() and not overwrite:
        # the header is compared before any torn tail is cut: a changed config must not delete finished work
        state = repair_pool_for_resume(out, cfg.n, check_header=lambda old: _check_resume(out, old, header))
        header = state.header
        unknown = [pid for pid in state.done if pid not in set(ids)]
        if unknown and cfg.limit is None:
            raise BuildConfigError(f"{out}: holds prompt {unknown[0]!r}, "
                                   "which is not a training prompt of this task config")
        done, dropped = set(state.done), state.dropped_lines
        info = read_build_info(out) or info
        for old in info.get("sessions", []):
            if old.get("status") == "running":  # that process died without a word (SIGKILL, power loss)
                old["status"] = "killed"
        if dropped:
            log(f"resume: removed {dropped} torn line(s) at the end of {out}")
        log(f"resume: {len(done & set(ids))}/{len(ids)} prompts already in {out}")
    else:
        create_pool(out, header)
        info_path.unlink(missing_ok=True)
    pending = [ex for ex in examples if ex.id not in done]
    resumed_from = len(ids) - len(pending)

    session: dict[str, Any] = {
        "started": _now(),
        "status": "running",
        "prompts_generated": 0,
        "wall_time_s": 0.0,
        "requests": 0,
        "retries": 0,
        "backend": backend.session_info(),
        "dropped_lines": dropped,
    }
    info["sessions"].append(session)
    info.update(prompts_total=len(ids), status="running")
    hooks = GenHooks()
    bar = _Progress(progress, len(ids), resumed_from, f"{task.name} pool")
    hooks.on_change = bar.hooks_changed

    def save_info(status: str) -> None:
        session.update(status=status, wall_time_s=round(time.perf_counter() - t_start, 3), requests=hooks.requests,
                       retries=hooks.retries, retry_reasons=dict(hooks.retry_reasons))
        info["status"] = status
        info["prompts_done"] = resumed_from + session["prompts_generated"]
        info["generation_wall_time_s"] = round(sum(s.get("wall_time_s", 0.0) for s in info["sessions"]), 3)
        _write_json_atomic(info_path, info)

    save_info("running")
    last_save = [time.perf_counter()]
    n, two_stage = cfg.n, cfg.length_control.two_stage
    lc = cfg.length_control
    status = "failed"
    try:
        with PoolAppender(out) as appender:
            for w0 in range(0, len(pending), cfg.prompts_per_wave):
                wave = pending[w0 : w0 + cfg.prompts_per_wave]
                reqs1 = [
                    GenRequest(lc.first_stage_messages(task, ex), request_seed(cfg.seed, ex.id, j, "generate"),
                               f"{ex.id}/generate", ex, "generate")
                    for ex in wave
                    for j in range(n)
                ]
                finals: list[GenResult | None] = [None] * len(reqs1)
                next_prompt = [0]

                def flush_ready(final_reqs: list[GenRequest], stage1: list[GenResult] | None) -> None:
                    # write complete prompts in prompt order (a prompt is complete when its n finals are in)
                    while (next_prompt[0] < len(wave)
                           and all(finals[next_prompt[0] * n + j] is not None for j in range(n))):
                        p = next_prompt[0]
                        ex = wave[p]
                        cands = [
                            _record(cfg, task, backend, counter, ex, j, finals[p * n + j], final_reqs[p * n + j].seed,
                                    (stage1[p * n + j], reqs1[p * n + j].seed) if stage1 is not None else None)
                            for j in range(n)
                        ]
                        appender.append_prompt(reorder_usable_first(cands, cfg.max_usable_tokens))
                        session["prompts_generated"] += 1
                        next_prompt[0] += 1
                        bar.advance()
                    if time.perf_counter() - last_save[0] > 2.0:  # keep the session record fresh for a kill
                        save_info("running")
                        last_save[0] = time.perf_counter()

                if two_stage:
                    bar.stage("stage 1: generate")
                    stage1 = backend.generate(reqs1, cfg.sampling, hooks=hooks)
                    reqs2 = [
                        GenRequest(lc.rewrite_messages(task, r.example, res.text),
                                   request_seed(cfg.seed, r.example.id, j % n, "rewrite"), f"{r.example.id}/rewrite",
                                   r.example, "rewrite", res.text)
                        for j, (r, res) in enumerate(zip(reqs1, stage1))
                    ]
                    bar.stage("stage 2: rewrite")
                    final_reqs, stage1_results = reqs2, stage1
                else:
                    bar.stage("generate")
                    final_reqs, stage1_results = reqs1, None

                def on_result(i: int, res: GenResult) -> None:
                    finals[i] = res
                    flush_ready(final_reqs, stage1_results)

                backend.generate(final_reqs, cfg.sampling, on_result=on_result, hooks=hooks)
                save_info("running")
        status = "complete"
    except BackendError as e:
        status = f"failed: {e}"
        kept = f"{out} keeps the {resumed_from + session['prompts_generated']} complete prompts; "
        if isinstance(e, (BackendAuthError, BackendRequestError)):  # the same request fails the same way again
            kept += "rerun the same command to resume once the cause is fixed (the server's answer above)"
        else:
            kept += "rerun the same command to resume"
        raise _same_kind(e, f"{e}\n{kept}") from None
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        bar.stop()
        save_info(status)
        if own_backend:
            backend.close()
    return BuildResult(
        pool=out,
        prompts_total=len(ids),
        prompts_done=resumed_from + session["prompts_generated"],
        prompts_generated=session["prompts_generated"],
        resumed_from=resumed_from,
        dropped_lines=dropped,
        wall_time_s=session["wall_time_s"],
        generation_wall_time_s=info["generation_wall_time_s"],
        requests=hooks.requests,
        retries=hooks.retries,
        header=header,
    )
