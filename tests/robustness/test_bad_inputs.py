"""Malformed configs and data fail fast, before any training, with one clear message naming field, file, line.

Every case runs the real command line (``python -m lit_rl fit --config conf/erils.yaml --config
tests/tiny_overlay.yaml --config <bad overlay>``) in-process through ``lit_rl.cli.main``, which runs the
preflight (:mod:`lit_rl.config`) before LightningCLI. Each must: exit with status 2, print exactly one ``error:`` line
that names the config file and line (or the command-line option) and the field, and for data files the data file and
line; take seconds; and leave no trace of a run (no MLflow store, no checkpoint).
"""

from __future__ import annotations

import contextlib
import gzip
import inspect
import io
import json
import re
import time
from pathlib import Path

import pytest

from lit_rl import cli
from lit_rl.config import preflight
from lit_rl.pools import pool as pool_mod

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"
MAIN = cli.main


def _pool_lines() -> list[str]:
    with gzip.open(POOL, "rt", encoding="utf-8") as fh:
        return [next(fh) for _ in range(40)]


def _write_pool(tmp: Path, lines: list[str]) -> Path:
    p = tmp / "pool.jsonl"
    p.write_text("".join(lines), encoding="utf-8")
    return p


def _bad_record(mutate) -> callable:
    def make(tmp: Path) -> Path:
        lines = _pool_lines()
        rec = json.loads(lines[3])
        out = mutate(rec)
        lines[3] = (out if isinstance(out, str) else json.dumps(out)) + "\n"
        return _write_pool(tmp, lines)

    return make


def _pool_patched(check: str) -> bool:
    """Whether lit_rl/pools/pool.py already has the reader fix the report proposes."""
    src = inspect.getsource(pool_mod)
    return {"surrogate": "surrogate" in src, "recursion": "RecursionError" in src}[check]


def _truncated(tmp: Path) -> Path:
    lines = _pool_lines()
    return _write_pool(tmp, lines[:-1] + [lines[-1].rstrip("\n")[:30]])


# name -> (overlay YAML (``{pool}`` = a bad pool file, ``{tmp}`` = the temp folder), extra args,
#          fragments the message must contain, the key whose line the message must name, pool maker)
CASES: dict[str, tuple] = {
    "gen_length_not_multiple_of_block": (
        "data:\n  init_args:\n    generation: {gen_length: 60, block_length: 32, steps: 4}\n",
        [], ["data.init_args.generation.gen_length", "L_gen = 60 is not a multiple of block_length = 32"],
        "generation", None),
    "steps_not_divisible_by_blocks": (
        "data:\n  init_args:\n    generation: {gen_length: 64, block_length: 16, steps: 6}\n",
        [], ["data.init_args.generation.steps", "steps = 6 is not divisible by the number of blocks", "= 4"],
        "generation", None),
    "generation_cache_unknown": (
        "data:\n  init_args:\n    generation:\n      cache: full\n",
        [], ["data.init_args.generation.cache", "must be 'none', 'prefix' or 'dual'", "'full'"], "cache", None),
    "generation_threshold_out_of_range": (
        "data:\n  init_args:\n    eval_generation:\n      threshold: 1.5\n",
        [], ["data.init_args.eval_generation.threshold", "must be in (0, 1]"], "threshold", None),
    "eval_temperature_negative": (
        "data:\n  init_args:\n    eval_generation:\n      temperature: -1.0\n",
        [], ["data.init_args.eval_generation.temperature", "must be >= 0"], "temperature", None),
    "passk_generation_bad_block": (
        "trainer:\n  callbacks:\n    - class_path: callbacks.PassAtKEvaluation\n      init_args:\n        configs:\n"
        "          - name: det\n"
        "            generation: {gen_length: 48, block_length: 32, steps: 32, temperature: 0.0}\n",
        [], ["trainer.callbacks[0].init_args.configs[0].generation.gen_length", "not a multiple"], "generation", None),
    "group_size_mismatch": (
        "data:\n  init_args:\n    g_on: 4\n    g_ext: 2\n    group_size: 5\n",
        [], ["data.init_args.group_size", "G = 5 but g_on + g_ext = 4 + 2 = 6"], "group_size", None),
    "g_on_plus_g_ext_zero": (
        "data:\n  init_args:\n    g_on: 0\n    g_ext: 0\n",
        [], ["data.init_args.g_on", "g_on + g_ext = 0"], "g_on", None),
    "g_on_negative": (
        "data:\n  init_args:\n    g_on: -1\n",
        [], ["data.init_args.g_on", "must be >= 0, got -1"], "g_on", None),
    "g_ext_without_pool": (
        "data:\n  init_args:\n    g_ext: 2\n    pool_path: null\n",
        [], ["data.init_args.pool_path", "required when g_ext > 0"], "pool_path", None),
    "pool_file_missing": (
        "data:\n  init_args:\n    pool_path: {tmp}/no_such_pool.jsonl\n",
        [], ["data.init_args.pool_path", "external rollout pool not found", "no_such_pool.jsonl",
             "python -m lit_rl rollouts build"], "pool_path", None),
    "pool_bad_json_line": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["data.init_args.pool_path", "pool.jsonl:4:", "invalid JSON"], "pool_path",
        _bad_record(lambda r: '{"prompt_id": "sudoku-train-0", "index": 1,')),
    "pool_missing_field": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "missing field 'completion'"], "pool_path",
        _bad_record(lambda r: {k: v for k, v in r.items() if k != "completion"})),
    "pool_wrong_field_type": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "field 'num_tokens' has type str"], "pool_path",
        _bad_record(lambda r: {**r, "num_tokens": "61"})),
    "pool_nan_reward": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "field 'reward' is not finite"], "pool_path",
        _bad_record(lambda r: json.dumps(r).replace(f'"reward": {json.dumps(r["reward"])}', '"reward": NaN'))),
    "pool_prompt_id_not_in_dataset": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "prompt_id 'sudoku-train-999999' is not in the task's training set"], "pool_path",
        _bad_record(lambda r: {**r, "prompt_id": "sudoku-train-999999"})),
    "pool_other_task": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:1:", "pool is for task 'countdown'"], "pool_path",
        lambda tmp: _write_pool(
            tmp, [json.dumps({**json.loads(_pool_lines()[0]), "task": "countdown"}) + "\n"] + _pool_lines()[1:])),
    "pool_truncated_last_line": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:40:", "truncated last line"], "pool_path", _truncated),
    "pool_lone_surrogate": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "completion"], "pool_path",
        _bad_record(lambda r: json.dumps({**r, "completion": "<answer>12\ud80034</answer>"}))),
    "pool_json_nesting_bomb": (
        "data:\n  init_args:\n    pool_path: {pool}\n",
        [], ["pool.jsonl:4:", "invalid JSON"], "pool_path", _bad_record(lambda r: "[" * 100_000 + "]" * 100_000)),
    "empty_dataset": (
        "data:\n  init_args:\n    task:\n      init_args:\n        num_train: 0\n",
        [], ["data.init_args.task.init_args.num_train", "training set of task 'sudoku' is empty"], "num_train", None),
    "num_train_prompts_zero": (
        "data:\n  init_args:\n    num_train_prompts: 0\n",
        [], ["data.init_args.num_train_prompts", "training set would be empty"], "num_train_prompts", None),
    "eval_batch_size_zero": (
        "data:\n  init_args:\n    eval_batch_size: 0\n",
        [], ["data.init_args.eval_batch_size", "must be >= 1, got 0"], "eval_batch_size", None),
    "eval_size_zero": (
        "data:\n  init_args:\n    eval_size: 0\n",
        [], ["data.init_args.eval_size", "evaluation set would be empty"], "eval_size", None),
    "missing_data_path": (
        "data:\n  init_args:\n    g_ext: 0\n    task:\n      class_path: lit_rl.tasks.MathTask\n"
        "      init_args:\n        train_path: {tmp}/math_train.jsonl\n",
        [], ["data.init_args.task.init_args.train_path", "data file not found", "math_train.jsonl"],
        "train_path", None),
    "unknown_task": (
        "data:\n  init_args:\n    task:\n      class_path: lit_rl.tasks.SudokuTsak\n",
        [], ["data.init_args.task.class_path", "unknown task 'lit_rl.tasks.SudokuTsak'"], "class_path", None),
    "unknown_callback_class": (
        "trainer:\n  callbacks:\n    - class_path: callbacks.FormatWarmUp\n",
        [], ["trainer.callbacks[0].class_path", "cannot import 'callbacks.FormatWarmUp'"], "class_path", None),
    "unknown_config_key": (
        "data:\n  init_args:\n    prompts_per_bach: 6\n",
        [], ["data.init_args.prompts_per_bach", "unknown key for datamodules.RolloutDataModule", "prompts_per_batch"],
        "prompts_per_bach", None),
    "wrong_type": (
        "data:\n  init_args:\n    prompts_per_batch: six\n",
        [], ["data.init_args.prompts_per_batch", "expected int, got str 'six'"], "prompts_per_batch", None),
    "wrong_type_model": (
        "model:\n  init_args:\n    grad_clip: [1.0]\n",
        [], ["model.init_args.grad_clip", "expected float | null, got list"], "grad_clip", None),
    "unknown_top_level_key": (
        "traner:\n  max_steps: 4\n",
        [], ["traner", "unknown top-level key"], "traner", None),
    "unknown_trainer_option": (
        "trainer:\n  max_step: 4\n",
        [], ["trainer.max_step", "unknown Trainer option"], "max_step", None),
    "yaml_syntax_error": (
        "data:\n  init_args:\n    g_on: [4\n    g_ext: 2\n",
        [], ["YAML syntax error"], None, None),
    "max_steps_not_multiple_of_mu": (
        "trainer:\n  max_steps: 5\n",
        [], ["trainer.max_steps", "5 optimizer updates is not a multiple of model.updates_per_batch = 2"],
        "max_steps", None),
    "sequence_longer_than_positions": (
        "data:\n  init_args:\n    generation: {gen_length: 96, block_length: 32, steps: 3}\n",
        [], ["data.init_args.generation.gen_length",
             "max_prompt_len + L_gen = 64 + 96 = 160 exceeds the policy's max_positions = 128"], "generation", None),
    "updates_per_batch_zero": (
        "model:\n  init_args:\n    updates_per_batch: 0\n",
        [], ["model.init_args.updates_per_batch", "must be >= 1"], "updates_per_batch", None),
    "max_consecutive_skips_zero": (
        "model:\n  init_args:\n    max_consecutive_skips: 0\n",
        [], ["model.init_args.max_consecutive_skips", "must be >= 1"], "max_consecutive_skips", None),
    "mlflow_server_unreachable": (
        "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.MLFlowLogger\n"
        "    init_args:\n      tracking_uri: http://127.0.0.1:9\n",
        [], ["trainer.logger.init_args.tracking_uri", "MLflow tracking server 'http://127.0.0.1:9' unreachable"],
        "tracking_uri", None),
    "mlflow_sqlite_unwritable": (
        "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.MLFlowLogger\n"
        "    init_args:\n      tracking_uri: sqlite:///{tmp}/a_file/mlflow.db\n",
        [], ["trainer.logger.init_args.tracking_uri", "unreachable: cannot create or write", "a_file"], "tracking_uri",
        lambda tmp: (tmp / "a_file").write_text("not a folder")),
    "ckpt_path_missing": (
        "ckpt_path: {tmp}/nope.ckpt\n",
        [], ["ckpt_path", "checkpoint file not found"], "ckpt_path", None),
}

NEEDS_PATCH = {"pool_lone_surrogate": "surrogate", "pool_json_nesting_bomb": "recursion"}


def _params():
    for name in CASES:
        marks = []
        if name in NEEDS_PATCH and not _pool_patched(NEEDS_PATCH[name]):
            marks.append(pytest.mark.xfail(
                strict=True, reason="needs the lit_rl/pools/pool.py reader fix from the robustness review"))
        yield pytest.param(name, marks=marks, id=name)


def _line_of(text: str, key: str) -> int:
    for i, line in enumerate(text.splitlines(), start=1):
        if re.search(rf"(^|[\s{{,-]){re.escape(key)}:", line):
            return i
    raise AssertionError(f"{key} not in overlay")


def _run(args: list[str]) -> tuple[int, str, float]:
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            rc = MAIN(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue(), time.perf_counter() - t0


def _args(tmp: Path, overlay: Path, extra: list[str]) -> list[str]:
    return [
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp}/run", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp}/run/mlflow.db",
        f"--data.init_args.pool_path={POOL}", "--config", str(overlay), *extra,
    ]


MESSAGES: dict[str, str] = {}


@pytest.mark.parametrize("name", list(_params()))
def test_bad_input_fails_fast_with_one_clear_message(name, tmp_path):
    text, extra, fragments, key, make_pool = CASES[name]
    pool = make_pool(tmp_path) if make_pool else None
    text = text.replace("{tmp}", str(tmp_path)).replace("{pool}", str(pool))
    overlay = tmp_path / "bad.yaml"
    overlay.write_text(text)
    rc, stderr, dt = _run(_args(tmp_path, overlay, extra))
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert rc == 2, f"exit status {rc}; stderr tail: {stderr[-1500:]}"
    assert len(errors) == 1, stderr[-2000:]
    msg = errors[0]
    MESSAGES[name] = msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    if key is not None:
        assert f"{overlay}:{_line_of(text, key)}:" in msg, f"config file and line of {key!r} not in {msg!r}"
    else:
        assert re.search(rf"{re.escape(str(overlay))}:\d+:", msg), msg
    assert dt < 20, f"took {dt:.1f}s"
    assert not (tmp_path / "run").exists(), "a run started (its folder exists)"


def test_missing_config_file(tmp_path):
    rc, stderr, _ = _run(["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(tmp_path / "nope.yaml")])
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "nope.yaml: config file not found" in errors[0], stderr[-1500:]
    MESSAGES["missing_config_file"] = errors[0]
    rc, stderr, _ = _run(["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(tmp_path)])
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert rc == 2 and errors == [f"error: {tmp_path}: is a folder, not a config file (--config takes a YAML file, "
                                  f"e.g. {tmp_path / 'config.yaml'})"], stderr[-1500:]  # was "not found"


def test_command_line_override_is_named(tmp_path):
    rc, stderr, _ = _run(["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config",
                          str(ROOT / "tests/tiny_overlay.yaml"), "--data.init_args.generation.block_length=48"])
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, stderr[-1500:]
    assert ("command line (--data.init_args.generation.block_length)" in errors[0]
            or "generation.gen_length" in errors[0]), errors[0]
    MESSAGES["command_line_override"] = errors[0]


def test_unknown_backend_in_pool_build(tmp_path):
    """The external pool builder's backend (``rollouts build``): an unknown type is named with its key."""
    cfg = tmp_path / "build.yaml"
    cfg.write_text(
        "task: {class_path: lit_rl.tasks.SudokuTask, init_args: {num_train: 4}}\n"
        f"out: {tmp_path}/pool.jsonl\nn: 2\ng_ext: 1\nbackend:\n  type: vllmm\n"
    )
    rc, stderr, dt = _run(["rollouts", "build", "--config", str(cfg), "--no_progress", "--no_stats"])
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, stderr[-1500:]
    assert "backend.type='vllmm'" in errors[0] and "expected one of" in errors[0], errors[0]
    MESSAGES["unknown_backend (rollouts build)"] = errors[0]
    assert not (tmp_path / "pool.jsonl").exists() or (tmp_path / "pool.jsonl").stat().st_size < 1000


@pytest.mark.parametrize("extra", [[], ["--config", "conf/spg.yaml"], ["--config", "conf/erils_joint.yaml"],
                                   ["--config", "conf/erils_external_only.yaml"]],
                         ids=["erils", "spg", "joint", "external_only"])
def test_shipped_configs_pass_the_preflight(extra):
    preflight(["fit", "--config", "conf/erils.yaml", *extra])
    preflight(["fit", "--config", "conf/erils.yaml", *extra, "--config", "tests/tiny_overlay.yaml"])


def test_print_messages():
    """Last in file order: the list for the report."""
    if len(MESSAGES) < 20:
        pytest.skip("run the whole file for the list")
    for name, msg in MESSAGES.items():
        print(f"[bad-input] {name}: {msg}")
