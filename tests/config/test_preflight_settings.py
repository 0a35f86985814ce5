"""The preflight builds every settings dataclass of a config from its YAML, so the class's own rules run
before anything else is built, reported at the argument's file and line."""

from pathlib import Path

import pytest

from lit_rl.config import ConfigError, preflight

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path, base: str, overlay: str):
    path = tmp_path / "bad.yaml"
    path.write_text(overlay)
    with pytest.raises(ConfigError) as err:
        preflight(["fit", "--config", str(ROOT / base), "--config", str(path)])
    return str(err.value), path


def test_a_settings_rule_is_reported_at_its_field(tmp_path):
    # DecodeSettings raises FieldError("steps", ...): the message names the steps line, not the block
    msg, path = _check(tmp_path, "conf/erils.yaml", "data:\n  init_args:\n    generation:\n      gen_length: 64\n"
                       "      block_length: 16\n      steps: 6\n")
    assert msg.startswith(f"{path}:6: data.init_args.generation.steps: steps = 6 is not divisible"), msg


def test_other_settings_classes_are_checked_without_preflight_code_of_their_own(tmp_path):
    # DoubleRolloutSettings' own __post_init__ (no rule of it is written in the preflight)
    msg, path = _check(tmp_path, "conf/double_rollout.yaml",
                       "model:\n  init_args:\n    double_rollout:\n      rho: 1.5\n")
    assert f"{path}:3: model.init_args.double_rollout" in msg and "rho must be in (0, 1]" in msg, msg
    msg, path = _check(tmp_path, "conf/double_rollout.yaml",
                       "model:\n  init_args:\n    loss:\n      aggregation: mean\n")
    assert f"{path}:3: model.init_args.loss" in msg and "aggregation must be one of" in msg, msg


def test_settings_nested_in_a_list_are_checked_at_their_place(tmp_path):
    overlay = (
        "trainer:\n  callbacks:\n    - class_path: callbacks.PassAtKEvaluation\n      init_args:\n        configs:\n"
        "          - name: a\n            generation: {gen_length: 32, block_length: 32, steps: 8}\n"
        "          - name: b\n            num_samples: 0\n"
    )
    msg, path = _check(tmp_path, "conf/erils.yaml", overlay)
    assert f"{path}:8: trainer.callbacks[0].init_args.configs[1]" in msg and "num_samples must be >= 1" in msg, msg


def test_an_unknown_std_rule_is_reported_at_its_line(tmp_path):
    # GRPOLossSettings raises FieldError("std_of", ...) (group | baseline, lit_rl.core.advantages.STD_OF)
    msg, path = _check(tmp_path, "conf/double_rollout.yaml",
                       "model:\n  init_args:\n    loss:\n      scale_std: true\n      std_of: others\n")
    assert f"{path}:5: model.init_args.loss.std_of" in msg and "must be one of ('group', 'baseline')" in msg, msg
