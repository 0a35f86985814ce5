"""Bad sweep YAMLs: every mistake is one ``SweepConfigError`` line naming the sweep file, the line and the key,
and ``python -m lit_rl sweep`` prints that line and exits 2 without a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_rl.sweep import SweepConfig, SweepConfigError, main

ROOT = Path(__file__).resolve().parents[2]


def _raw(tmp_path: Path) -> dict:
    """A valid sweep (nothing is run: the base config is never opened)."""
    return {
        "study_name": "s",
        "base": ["conf/erils.yaml"],
        "overrides": {"trainer": {"max_steps": 4}},
        "space": {"lr": {"type": "float", "low": 0.0001, "high": 0.001, "log": True}},
        "derived": {"data.init_args.g_on": "6 - 2"},
        "objective": {"metric": "val/acc", "direction": "maximize"},
        "n_trials": 2,
        "sampler": {"name": "tpe", "seed": 0},
        "pruner": {"name": "median"},
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
        "output_dir": str(tmp_path / "out"),
    }


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, default_flow_style=False))
    return path


def _set(raw: dict, dotted: tuple, value) -> dict:
    node = raw
    for k in dotted[:-1]:
        node = node[k]
    node[dotted[-1]] = value
    return raw


# (key path to set, value, expected message after "<file>:<line>: ", the key written on that line)
CASES = [
    (("space", "lr"), {"type": "float", "lo": 0.1, "high": 1.0},
     "space.lr: unknown key 'lo' (did you mean 'low'?)", "lo"),
    (("space", "lr"), {"type": "float", "low": 0.1, "high": 1.0, "bounds": 2},
     "space.lr: unknown key 'bounds' (allowed: type, low, high, log, step, choices, grid)", "bounds"),
    (("space", "lr", "low"), "a", "space.lr.low: must be a number (type: float), got 'a'", "low"),
    (("space", "lr", "low"), 0, "space.lr.log: a log scale needs low > 0, got low=0", "log"),
    (("space", "lr", "log"), "yes", "space.lr.log: must be true or false, got 'yes'", "log"),
    (("space", "lr", "type"), "str", "space.lr.type: must be float, int or categorical, got 'str'", "type"),
    (("space", "lr"), 0.1, "space.lr: must be a mapping of type, low, high, log, step, choices, grid, got 0.1", "lr"),
    (("space", "lr"), {"type": "int", "low": 0.5, "high": 4},
     "space.lr.low: must be an integer (type: int), got 0.5", "low"),
    (("space", "lr"), {"type": "categorical", "choices": "abc"},
     "space.lr.choices: must list the values of a categorical parameter, got 'abc'", "choices"),
    (("space", "lr"), {"type": "float", "low": 0.1, "high": 1.0, "step": -1},
     "space.lr.step: must be a number > 0, got -1", "step"),
    (("n_trials",), "10", "n_trials: must be an integer >= 1, got '10'", "n_trials"),
    (("n_trials",), True, "n_trials: must be an integer >= 1, got True", "n_trials"),
    (("n_trials",), 2.5, "n_trials: must be an integer >= 1, got 2.5", "n_trials"),
    (("grace_period",), "60", "grace_period: must be an integer >= 1, got '60'", "grace_period"),
    (("heartbeat_interval",), -5, "heartbeat_interval: must be an integer >= 1, got -5", "heartbeat_interval"),
    (("max_retry",), -1, "max_retry: must be an integer >= 0, got -1", "max_retry"),
    (("tracking_uri",), 5, "tracking_uri: must be a non-empty string, got 5", "tracking_uri"),
    (("storage",), "runs/optuna.db",
     "storage: use a database URL such as sqlite:///runs/sweeps/optuna.db, got 'runs/optuna.db'", "storage"),
    (("study_name",), 5, "study_name: must be a non-empty string, got 5", "study_name"),
    (("base",), 5, "base: must list at least one training config path, got 5", "base"),
    (("base",), [1], "base: must list at least one training config path, got [1]", "base"),
    (("overrides",), [1], "overrides: must be a mapping, got [1]", "overrides"),
    (("sampler",), "tpe", "sampler: must be a mapping, got 'tpe'", "sampler"),
    (("sampler",), {"name": "tpe", "seeds": 1},
     "sampler: cannot build {'name': 'tpe', 'seeds': 1}: TypeError:", "sampler"),
    (("pruner",), {"name": "no.such.Pruner"},
     "pruner: cannot build {'name': 'no.such.Pruner'}: ModuleNotFoundError:", "pruner"),
    (("catch_exceptions",), "no", "catch_exceptions: must be true or false, got 'no'", "catch_exceptions"),
    (("objective",), {"metrc": "val/acc"}, "objective: unknown key 'metrc' (did you mean 'metric'?)", "metrc"),
    (("objective", "direction"), "up", "objective.direction: must be maximize or minimize, got 'up'", "direction"),
    (("derived", "data.init_args.g_on"), "6 -",
     "derived.data.init_args.g_on: cannot parse '6 -': invalid syntax", "data.init_args.g_on"),
    (("derived", "lr"), "1", "derived.lr: is also in space", "lr"),
    (("derived", "data.init_args.g_on"), "6 - g_ex",
     "derived.data.init_args.g_on: unknown name 'g_ex' in '6 - g_ex' (known: lr)", "data.init_args.g_on"),
    (("report_every_n_steps",), 0, "report_every_n_steps: must be an integer >= 1, got 0", "report_every_n_steps"),
]


@pytest.mark.parametrize(("key", "value", "message", "on_line"), CASES,
                         ids=[f"{'.'.join(c[0])}={c[1]!r}" for c in CASES])
def test_a_bad_sweep_names_the_file_line_and_key(tmp_path, key, value, message, on_line):
    path = _write(tmp_path, _set(_raw(tmp_path), key, value))
    with pytest.raises(SweepConfigError) as info:
        SweepConfig.from_yaml(path)
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    m = re.match(rf"^{re.escape(str(path))}:(\d+): (.*)$", text)
    assert m and "\n" not in text, text
    assert m.group(2).startswith(message), text
    line = path.read_text().splitlines()[int(m.group(1)) - 1]
    assert line.strip().startswith(f"{on_line}:") or f" {on_line}:" in line, (text, line)


def test_yaml_syntax_error_and_missing_file_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("study_name: s\nbase: [conf/erils.yaml\nspace: {}\n")
    with pytest.raises(SweepConfigError, match=rf"^{re.escape(str(path))}:\d+: YAML syntax error"):
        SweepConfig.from_yaml(path)
    with pytest.raises(SweepConfigError, match="config file not found"):
        SweepConfig.from_yaml(tmp_path / "nope.yaml")
    path.write_text("- a list\n")
    with pytest.raises(SweepConfigError, match=rf"^{re.escape(str(path))}:1: expected a mapping at the top level"):
        SweepConfig.from_yaml(path)


def test_a_plain_dict_gets_the_key_without_a_file(tmp_path):
    with pytest.raises(SweepConfigError, match=r"^space\.lr: unknown key 'lo'"):
        SweepConfig.from_dict(_set(_raw(tmp_path), ("space", "lr"), {"type": "float", "lo": 0.1, "high": 1.0}))
    SweepConfig.from_dict(_raw(tmp_path))  # the base case is valid


def test_main_prints_one_line_and_exits_2(tmp_path, capsys):
    path = _write(tmp_path, _set(_raw(tmp_path), ("n_trials",), "10"))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:") and err.endswith("n_trials: must be an integer >= 1, got '10'\n"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    # a command-line override is named as such
    path = _write(tmp_path, _raw(tmp_path))
    assert main(["--config", str(path), "--storage", "runs/optuna.db"]) == 2
    assert capsys.readouterr().err.startswith("error: command line (--storage): storage: use a database URL")
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_python_m_lit_rl_sweep_exits_2_without_a_traceback(tmp_path):
    path = _write(tmp_path, _set(_raw(tmp_path), ("space", "lr"), {"type": "float", "lo": 0.1, "high": 1.0}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "lit_rl", "sweep", "--config", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"error: {path}:" in proc.stderr and "space.lr: unknown key 'lo' (did you mean 'low'?)" in proc.stderr
