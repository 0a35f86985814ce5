"""Every constructor check is reachable from the preflight, and the checker itself never crashes.

Each case runs ``python -m lit_rl fit --config conf/erils.yaml --config tests/tiny_overlay.yaml --config <bad>``
in-process (``lit_rl.cli.main``), as ``test_bad_inputs.py`` does. Each must exit 2 with exactly one ``error:`` line
naming the overlay's file and line and the field, before anything is built (no run folder). Before the fix the
constructor cases were 118-line jsonargparse tracebacks (exit 1), ``val_check_interval: 0`` trained a batch and
died on ``ZeroDivisionError``, the shape cases crashed the checker (``AttributeError`` / ``UnicodeDecodeError``),
and the misspelled nested key and the empty overlay printed 50-66 lines of usage.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from lit_rl import cli

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "data/pools/sudoku_scripted.jsonl.gz"

# name -> (overlay bytes, the overlay line the message must name, fragments the message must contain)
CASES: dict[str, tuple[bytes, int, list[str]]] = {
    "surrogate_num_t_zero": (
        b"model:\n  init_args:\n    surrogate:\n      init_args:\n        num_t: 0\n", 5,
        ["model.init_args.surrogate.init_args.num_t", "must be >= 1, got 0"]),
    "surrogate_unknown_mode": (
        b"model:\n  init_args:\n    surrogate:\n      init_args:\n        mode: elbow\n", 5,
        ["surrogate.init_args.mode", "must be 'mix', 'eubo' or 'elbo', got 'elbow'"]),
    "surrogate_w_out_of_range": (
        b"model:\n  init_args:\n    surrogate:\n      init_args:\n        w: 5.0\n", 5,
        ["surrogate.init_args.w", "must be in [0, 1], got 5.0"]),
    "hidden_size_not_divisible_by_heads": (
        b"model:\n  init_args:\n    policy:\n      init_args:\n        hidden_size: 33\n", 5,
        ["model.init_args.policy.init_args.hidden_size", "33 is not divisible by num_heads = 2"]),
    "val_check_interval_zero": (
        b"trainer:\n  val_check_interval: 0\n", 2, ["trainer.val_check_interval", "must be >= 1", "got 0"]),
    "init_args_as_list": (
        b"model:\n  init_args:\n    policy:\n      init_args: [32, 1]\n", 4,
        ["model.init_args.policy.init_args", "expected a mapping, got list"]),
    "model_init_args_as_list": (
        b"model:\n  init_args: [1]\n", 2, ["model.init_args", "expected a mapping, got list"]),
    "trainer_as_list": (b"trainer: [1]\n", 1, ["trainer", "expected a mapping, got list"]),
    "latin1_byte_in_comment": (
        b"# r\xe9glages\ntrainer:\n  max_steps: 4\n", 1, ["not UTF-8 text (byte 0xe9)"]),
    "nested_misspelled_key": (
        b"data:\n  init_args:\n    generation:\n      gen_lenght: 64\n", 4,
        ["data.init_args.generation.gen_lenght", "unknown key for DecodeSettings",
         "accepted: gen_length, block_length, steps"]),
    "settings_as_list": (
        b"data:\n  init_args:\n    eval_generation: [64, 32]\n", 3,
        ["data.init_args.eval_generation", "expected a mapping (DecodeSettings), got list"]),
    "empty_overlay": (b"# nothing here yet\n\n", 1, ["the config file is empty"]),
    "kv_cache_for_remote_code": (
        b"model:\n  init_args:\n    policy:\n      class_path: lit_rl.models.PretrainedDiffusionLM\n"
        b"      init_args: {path: tests/fixtures/tiny_llada}\ndata:\n  init_args:\n    generation:\n"
        b"      cache: prefix\n", 9,
        ["data.init_args.generation.cache", "'prefix', but the policy PretrainedDiffusionLM", "use cache: none"]),
}


def _cb(cls: str, body: str) -> bytes:
    """An overlay whose one callback is ``cls`` with the ``init_args`` lines ``body`` (from line 5)."""
    return f"trainer:\n  callbacks:\n    - class_path: {cls}\n      init_args:\n{body}".encode()


def _node(keys: tuple[str, ...], cls: str, body: str) -> bytes:
    """An overlay setting the class at ``keys`` (e.g. ``model``, ``init_args``, ``loss_fn``) to ``cls`` with the
    ``init_args`` lines ``body``."""
    lines = [f"{'  ' * i}{k}:" for i, k in enumerate(keys)]
    pad = "  " * len(keys)
    return ("\n".join(lines) + f"\n{pad}class_path: {cls}\n{pad}init_args:\n" + body).encode()


# The classes whose argument rules moved into check_args (item 6's second part); each case failed before (a
# jsonargparse traceback, or for tasks a line at the task, not the key). Name -> as CASES, plus the base configs
# when they are not conf/erils.yaml + tests/tiny_overlay.yaml.
ERILS = ("conf/erils.yaml", "tests/tiny_overlay.yaml")
AR = ("conf/double_rollout.yaml", "tests/tiny_dr_overlay.yaml")
MOVED: dict[str, tuple[bytes, int, list[str], tuple[str, ...]]] = {
    "PassAtKEvaluation": (
        _cb("callbacks.PassAtKEvaluation", "        every_n_steps: 0\n"), 5,
        ["trainer.callbacks[0].init_args.every_n_steps", "must be >= 1, got 0"], ERILS),
    "PassAtKEvaluation_configs": (
        _cb("callbacks.PassAtKEvaluation", "        configs:\n          - {name: a}\n          - {name: a}\n"), 5,
        ["trainer.callbacks[0].init_args.configs", "names must be unique, got ['a', 'a']"], ERILS),
    "RolloutTracker": (
        _cb("callbacks.RolloutTracker", "        every_n_batches: 0\n"), 5,
        ["trainer.callbacks[0].init_args.every_n_batches", "must be >= 1, got 0"], ERILS),
    "FormatWarmup": (
        _cb("callbacks.FormatWarmup", "        batch_size: 0\n"), 5,
        ["trainer.callbacks[0].init_args.batch_size", "must be >= 1, got 0"], ERILS),
    "ScriptedSFTWarmup": (
        _cb("callbacks.ar_warmup.ScriptedSFTWarmup", "        error_rate: 1.5\n"), 5,
        ["trainer.callbacks[0].init_args.error_rate", "must be in [0, 1], got 1.5"], AR),
    "ContinuationReliability": (
        _cb("callbacks.ContinuationReliability", "        length_bins: 0\n"), 5,
        ["trainer.callbacks[0].init_args.length_bins", "must be >= 1, got 0"], AR),
    "D1Loss": (
        _node(("model", "init_args", "loss_fn"), "lit_rl.algorithms.d1.D1Loss", "        epsilon: 1.5\n"), 6,
        ["model.init_args.loss_fn.init_args.epsilon", "must be in (0, 1), got 1.5"], ERILS),
    "_EstimatorLoss": (
        _node(("model", "init_args", "loss_fn"), "lit_rl.algorithms.d1.D1Loss", "        p_mask_prompt: 1.0\n"), 6,
        ["model.init_args.loss_fn.init_args.p_mask_prompt", "must be in [0, 1), got 1.0"], ERILS),
    "WD1Loss": (
        _node(("model", "init_args", "loss_fn"), "lit_rl.algorithms.d1.WD1Loss", "        group_reduction: max\n"),
        6, ["model.init_args.loss_fn.init_args.group_reduction", "must be 'mean' or 'sum', got 'max'"], ERILS),
    "DenoisingSFTLoss": (
        _node(("model", "init_args", "loss_fn"), "lit_rl.algorithms.losses.DenoisingSFTLoss", "        eps: 1.0\n"),
        6, ["model.init_args.loss_fn.init_args.eps", "must be in (0, 1), got 1.0"], ERILS),
    "DenoisingSFT": (
        b"model:\n  init_args:\n    eps: 0.0\n", 3, ["model.init_args.eps", "must be in (0, 1), got 0.0"],
        ("conf/erils.yaml", "conf/erils_sft.yaml", "tests/tiny_overlay.yaml")),
    "DoubleRolloutEstimate": (
        b"model:\n  init_args:\n    processors:\n"
        b"      - class_path: lit_rl.algorithms.dr_estimate.DoubleRolloutEstimate\n"
        b"        init_args: {rows: off_policy}\n", 5,
        ["model.init_args.processors[0].init_args.rows", "must be 'all' or 'on_policy', got 'off_policy'"],
        ("conf/erils.yaml", "conf/erils_double_rollout.yaml", "tests/tiny_overlay.yaml")),
    "AdvantageProcessor": (
        b"model:\n  init_args:\n    advantages:\n      init_args:\n        nan_policy: skip\n", 5,
        ["model.init_args.advantages.init_args.nan_policy", "must be 'drop' or 'raise', got 'skip'"], ERILS),
    "ConstantWithWarmup": (
        b"model:\n  init_args:\n    scheduler:\n      class_path: lit_rl.optim.ConstantWithWarmup\n      init_args:\n"
        b"        warmup_steps: -1\n", 6,
        ["model.init_args.scheduler.init_args.warmup_steps", "must be >= 0, got -1"], ERILS),
    "WarmupCosine": (
        b"model:\n  init_args:\n    scheduler:\n      init_args:\n        total_steps: 4\n", 5,
        ["model.init_args.scheduler.init_args.total_steps", "must be > warmup_steps (8), got 4"], ERILS),
    "ARRolloutDataModule": (
        b"data:\n  init_args:\n    num_generations: 0\n", 3,
        ["data.init_args.num_generations", "must be >= 1, got 0"], AR),
    "HFBackend": (
        _node(("data", "init_args", "backend"), "lit_rl.generation.ar.HFBackend", "        prune_finished: 2.0\n"), 6,
        ["data.init_args.backend.init_args.prune_finished", "must be in [0, 1], got 2.0"], AR),
    "AROnPolicy": (
        b"data:\n  init_args:\n    sources:\n      - class_path: datamodules.sources.AROnPolicy\n"
        b"        init_args: {num: 0}\n", 5, ["data.init_args.sources[0].init_args.num", "must be >= 1, got 0"], AR),
    "DiffusionOnPolicy": (
        b"data:\n  init_args:\n    sources:\n      - class_path: datamodules.sources.DiffusionOnPolicy\n"
        b"        init_args: {num: 0}\n", 5, ["data.init_args.sources[0].init_args.num", "must be >= 1, got 0"], ERILS),
    "ExternalPool": (
        b"data:\n  init_args:\n    sources:\n      - class_path: datamodules.sources.ExternalPool\n"
        b"        init_args:\n          num: 2\n          pool_path: null\n", 7,
        ["data.init_args.sources[0].init_args.pool_path", "required: the external rollout pool file"], ERILS),
    "RolloutDataModule_sources_group_size": (
        b"data:\n  init_args:\n    group_size: 3\n    sources:\n"
        b"      - class_path: datamodules.sources.DiffusionOnPolicy\n        init_args: {num: 2}\n", 3,
        ["data.init_args.group_size", "G = 3 but the sources hold 2 rows per prompt"], ERILS),
    "Task": (
        b"data:\n  init_args:\n    task:\n      init_args:\n        prompt_style: d2\n", 5,
        ["data.init_args.task.init_args.prompt_style", "must be one of ['d1_eval', 'd1_train'], got 'd2'"], ERILS),
    "Task_reward_weights": (
        b"data:\n  init_args:\n    task:\n      init_args:\n        reward_weights: [1.0, 2.0]\n", 5,
        ["data.init_args.task.init_args.reward_weights", "2 entries for 0 reward_funcs"], ERILS),
    "SudokuTask": (
        b"data:\n  init_args:\n    task:\n      init_args:\n        min_blanks: 0\n", 5,
        ["data.init_args.task.init_args.min_blanks", "need 1 <= min_blanks <= max_blanks <= 12"], ERILS),
    "ChainSumTask": (
        _node(("data", "init_args", "task"), "lit_rl.tasks.ChainSumTask", "        max_digit: 12\n"), 6,
        ["data.init_args.task.init_args.max_digit", "must be in 1..9, got 12"], ERILS),
    "CountdownTask": (
        _node(("data", "init_args", "task"), "lit_rl.tasks.CountdownTask", "        num_train: -1\n"), 6,
        ["data.init_args.task.init_args.num_train", "must be >= 0, got -1"], ERILS),
    "PromptTask": (
        _node(("data", "init_args", "task"), "lit_rl.tasks.PromptTask", "        answer_check: fuzzy\n"), 6,
        ["data.init_args.task.init_args.answer_check", "must be one of"], ERILS),
    "MLFlowLogger": (
        b"trainer:\n  logger:\n    init_args:\n      send_timeout_s: 0\n", 4,
        ["trainer.logger.init_args.send_timeout_s", "must be > 0, got 0"], ERILS),
}


def _run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue()


def _check_one_line(text: bytes, line: int, fragments: list[str], bases: tuple[str, ...], tmp_path: Path) -> None:
    overlay = tmp_path / "bad.yaml"
    overlay.write_bytes(text)
    args = ["fit"]
    for base in bases:
        args += ["--config", str(ROOT / base)]
    rc, stderr = _run(args + [
        f"--trainer.default_root_dir={tmp_path}/run",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/run/mlflow.db",
        *([f"--data.init_args.pool_path={POOL}"] if bases == ERILS else []), "--config", str(overlay),
    ])
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert rc == 2, f"exit status {rc}; stderr tail: {stderr[-1500:]}"
    assert len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr[-2000:]
    assert f"{overlay}:{line}:" in errors[0], errors[0]
    for frag in fragments:
        assert frag in errors[0], f"{frag!r} not in {errors[0]!r}"
    assert not (tmp_path / "run").exists(), "a run started (its folder exists)"


@pytest.mark.parametrize("name", list(CASES))
def test_constructor_and_shape_problems_are_one_line_with_file_and_line(name, tmp_path):
    _check_one_line(*CASES[name], ERILS, tmp_path)


@pytest.mark.parametrize("name", list(MOVED))
def test_each_check_args_is_reached_wherever_its_class_appears(name, tmp_path):
    """Callbacks under ``trainer.callbacks``, losses, processors, schedulers, backends and sources in ``init_args``
    lists and nested ``class_path`` blocks, the logger, the task: one line at the key."""
    _check_one_line(*MOVED[name], tmp_path)


def test_a_check_args_rule_has_one_home():
    """The constructor and the preflight raise the same rule: the constructor's error is the FieldError that the
    preflight reports at the key."""
    from lit_rl.algorithms.surrogates import SPGSurrogate
    from lit_rl.errors import FieldError

    with pytest.raises(FieldError, match=r"^num_t: must be >= 1, got 0$"):
        SPGSurrogate(num_t=0)


@pytest.mark.parametrize("policy,cache,ok", [
    ("lit_rl.models.NativeLLaDA", "dual", True), ("lit_rl.models.NativeDream", "prefix", True),
    ("lit_rl.models.PretrainedDiffusionLM", "dual", False), ("lit_rl.models.PretrainedDiffusionLM", "none", True)])
def test_the_kv_cache_check_knows_which_policies_have_a_cached_forward(policy, cache, ok, tmp_path):
    """lit_rl's native LLaDA / Dream decode with the cache (docs/decoding.md); a checkpoint's own code does not."""
    from lit_rl.config.preflight import preflight
    from lit_rl.errors import ConfigError

    overlay = tmp_path / "policy.yaml"
    overlay.write_text(f"model:\n  init_args:\n    policy:\n      class_path: {policy}\n"
                       f"      init_args: {{path: tests/fixtures/tiny_llada}}\n"
                       f"data:\n  init_args:\n    generation:\n      cache: {cache}\n")
    argv = ["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
            "--config", str(overlay)]
    if ok:
        assert preflight(argv, data=False) is not None
    else:
        with pytest.raises(ConfigError, match="no KV cache"):
            preflight(argv, data=False)
