"""Issue #42, item 6: every constructor check is reachable from the preflight, and the checker itself never crashes.

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
}


def _run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, err.getvalue()


@pytest.mark.parametrize("name", list(CASES))
def test_constructor_and_shape_problems_are_one_line_with_file_and_line(name, tmp_path):
    text, line, fragments = CASES[name]
    overlay = tmp_path / "bad.yaml"
    overlay.write_bytes(text)
    rc, stderr = _run([
        "fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "tests/tiny_overlay.yaml"),
        f"--trainer.default_root_dir={tmp_path}/run",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path}/run/mlflow.db",
        f"--data.init_args.pool_path={POOL}", "--config", str(overlay),
    ])
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert rc == 2, f"exit status {rc}; stderr tail: {stderr[-1500:]}"
    assert len(errors) == 1 and len(stderr.strip().splitlines()) == 1, stderr[-2000:]
    assert f"{overlay}:{line}:" in errors[0], errors[0]
    for frag in fragments:
        assert frag in errors[0], f"{frag!r} not in {errors[0]!r}"
    assert not (tmp_path / "run").exists(), "a run started (its folder exists)"


def test_a_check_args_rule_has_one_home():
    """The constructor and the preflight raise the same rule: the constructor's error is the FieldError that the
    preflight reports at the key."""
    from lit_rl.algorithms.surrogates import SPGSurrogate
    from lit_rl.errors import FieldError

    with pytest.raises(FieldError, match=r"^num_t: must be >= 1, got 0$"):
        SPGSurrogate(num_t=0)


def test_val_check_interval_zero_is_refused_when_the_trainer_is_built():
    """The same rule guards a trainer built without the preflight (``LitRLCLI`` in code, sweeps' trial runs)."""
    from lit_rl.config.trainer_rules import check_trainer_args
    from lit_rl.errors import FieldError

    check_trainer_args(val_check_interval=1)
    check_trainer_args(val_check_interval=0.5)
    for bad in (0, -2, 1.5, 0.0):
        with pytest.raises(FieldError, match="val_check_interval"):
            check_trainer_args(val_check_interval=bad)
