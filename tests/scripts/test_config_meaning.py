"""scripts/config_meaning.py: class paths compared by what they import, differences found by key, and the overlays
that set one key of the base's logger resolve to the base's logger with that key changed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("config_meaning", ROOT / "scripts/config_meaning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_moved_class_path_is_the_same_value_and_a_changed_one_is_not():
    cm = _script()
    old = {"trainer": {"plugins": [{"class_path": "lit_rl.reliability.AtomicCheckpointIO"}]}}
    new = {"trainer": {"plugins": [{"class_path": "lit_rl.checkpoint_io.AtomicCheckpointIO"}]}}
    assert cm._canonical(old) == cm._canonical(new)
    other = {"trainer": {"plugins": [{"class_path": "lightning.pytorch.plugins.TorchCheckpointIO"}]}}
    assert cm._canonical(other) != cm._canonical(new)


def test_first_differences_names_nested_keys_list_items_and_one_sided_keys():
    cm = _script()
    a = {"model": {"init_args": {"lr": 1e-3, "beta": 1.0}}, "trainer": {"callbacks": [{"x": 1}, {"y": 2}]}}
    b = {"model": {"init_args": {"lr": 3e-4}}, "trainer": {"callbacks": [{"x": 1}, {"y": 3}]}, "seed": 0}
    assert cm.first_differences(a, b, limit=5) == [
        "model.init_args.beta (only old)", "model.init_args.lr: 0.001 -> 0.0003", "seed (only new)",
        "trainer.callbacks[1].y: 2 -> 3"]
    assert cm.first_differences(a, a) == []


def test_overlays_inherit_the_base_logger_and_change_only_what_they_set():
    resolved = _script().resolve_all(ROOT)
    base = resolved["conf/erils.yaml"]["trainer"]["logger"]
    for overlay, run_name in (("conf/spg.yaml", "spg-sudoku-tiny"),
                              ("conf/erils_countdown.yaml", "erils-countdown-tiny")):
        logger = resolved[overlay]["trainer"]["logger"]
        assert logger["class_path"] == "lit_rl.loggers.MLFlowLogger"
        assert logger["init_args"] == {**base["init_args"], "run_name": run_name}
    assert resolved["conf/smoke.yaml"]["trainer"]["logger"]["init_args"]["experiment_name"] == "lit_rl-smoke"
