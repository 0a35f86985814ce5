"""lit_rl/config/classes.py: a class's ``check_args`` run with the config's values, settings built from their YAML."""

from __future__ import annotations

import dataclasses

import pytest

from lit_rl.config.classes import build_settings, run_check_args
from lit_rl.config.lines import ConfigView
from lit_rl.errors import ConfigError, FieldError

CALLS: list[tuple] = []


@dataclasses.dataclass
class _Inner:
    k: int = 1

    def __post_init__(self) -> None:
        if self.k < 0:
            raise FieldError("k", f"must be >= 0, got {self.k}")


@dataclasses.dataclass
class _Outer:
    inner: _Inner | None = None
    items: list[_Inner] = dataclasses.field(default_factory=list)


class _Base:
    LIMIT = 10

    @classmethod
    def check_args(cls, n: int = 1) -> None:
        CALLS.append(("base", cls.__name__, n))
        if n > cls.LIMIT:
            raise FieldError("n", f"must be <= {cls.LIMIT}, got {n}")

    def __init__(self, n: int = 1) -> None:
        pass


class _Child(_Base):
    LIMIT = 3

    @staticmethod
    def check_args(mode: str = "a", n: int = 1, inner: _Inner | None = None) -> None:
        CALLS.append(("child", mode, n, inner))
        if mode not in ("a", "b"):
            raise ValueError(f"bad mode {mode!r}")

    def __init__(self, mode: str = "a", n: int = 2, inner: _Inner | None = None) -> None:
        pass


class _Required:
    @staticmethod
    def check_args(path: str) -> None:
        CALLS.append(("required", path))

    def __init__(self, path: str) -> None:
        pass


def test_check_args_of_each_class_base_first_with_the_constructors_defaults():
    cfg = ConfigView(data={}, where={("model",): "over.yaml:1", ("model", "init_args", "n"): "over.yaml:5"})
    CALLS.clear()
    run_check_args(cfg, ("model",), _Child, {"mode": "b", "inner": {"k": 4}})
    # n: the constructor's default 2, not check_args' 1; the classmethod bound to the configured class
    assert CALLS == [("base", "_Child", 2), ("child", "b", 2, _Inner(k=4))]
    CALLS.clear()
    with pytest.raises(ConfigError) as err:
        run_check_args(cfg, ("model",), _Child, {"n": 4})  # _Child.LIMIT = 3, not _Base's 10
    assert str(err.value) == "over.yaml:5: model.init_args.n: must be <= 3, got 4"
    assert CALLS == [("base", "_Child", 4)]
    with pytest.raises(ConfigError) as err:
        run_check_args(cfg, ("model",), _Child, {"mode": "c"})
    assert str(err.value) == "over.yaml:1: model.init_args: _Child: bad mode 'c'"
    CALLS.clear()
    run_check_args(cfg, ("model",), _Required, {})  # a required argument left out: not called
    run_check_args(cfg, ("model",), _Required, {"path": "p"})
    assert CALLS == [("required", "p")]


def test_build_settings_builds_nested_and_listed_dataclasses_and_reports_at_the_key():
    path = ("data", "init_args", "gen")
    cfg = ConfigView(data={}, where={path: "a.yaml:3", path + ("items", 1, "k"): "a.yaml:7"})
    built = build_settings(cfg, path, _Outer | None, {"inner": {"k": 2}, "items": [{"k": 0}, {"k": 5}]})
    assert built == _Outer(inner=_Inner(k=2), items=[_Inner(k=0), _Inner(k=5)])
    bad = [({"items": [{"k": 0}, {"k": -1}]}, "a.yaml:7: data.init_args.gen.items[1].k: must be >= 0, got -1"),
           ({"inner": {"kk": 1}}, "a.yaml:3: data.init_args.gen.inner.kk: unknown key for _Inner (accepted: k)"),
           ([1], "a.yaml:3: data.init_args.gen: expected a mapping (_Outer), got list [1]")]
    for value, message in bad:
        with pytest.raises(ConfigError) as err:
            build_settings(cfg, path, _Outer, value)
        assert str(err.value) == message
    node = {"class_path": "x.Y", "init_args": {}}
    assert build_settings(cfg, path, _Outer, node) is node  # a class_path node: left to the key checks
    assert build_settings(cfg, path, _Outer, None) is None
    assert build_settings(cfg, path, int, "5") == "5"
