"""lit_rl/config/signatures.py: the keyword arguments a config may give a class, and the scalar type check."""

from __future__ import annotations

from typing import Optional

from lit_rl.config.signatures import import_class, params, type_problem


class _Base:
    def __init__(self, a: int = 1, shared: float = 0.5) -> None:
        pass


class _Middle(_Base):  # no __init__ of its own
    pass


class _Child(_Middle):
    def __init__(self, b: str = "x", shared: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)


class _Open:
    def __init__(self, c: int = 0, **kwargs) -> None:
        pass


def test_params_follow_kwargs_up_the_mro_and_the_first_definition_wins():
    names, hints, open_kwargs = params(_Child)
    assert list(names) == ["b", "shared", "a"]
    assert names["shared"].default is True  # the child's, not the base's 0.5
    assert hints == {"b": str, "shared": bool, "a": int, "return": type(None)}
    assert open_kwargs is False  # _Base ends the chain without **kwargs
    names, hints, open_kwargs = params(_Open)
    assert list(names) == ["c"] and open_kwargs is True
    assert import_class("lit_rl.config.signatures.params") is params


def test_type_problem_by_hand():
    assert type_problem(int, 3) is None
    assert type_problem(int, True) == "expected int, got bool True"
    assert type_problem(float, 3) is None  # YAML's 3 for a float
    assert type_problem(float, False) == "expected float, got bool False"
    assert type_problem(bool, 1) == "expected bool, got int 1"
    assert type_problem(str, 5) == "expected str, got int 5"
    assert type_problem(int, None) == "must not be null"
    assert type_problem(int | None, None) is None
    assert type_problem(Optional[float], "x") == "expected float | null, got str 'x'"
    assert type_problem(int | str, 1.5) == "expected int | str, got float 1.5"
    assert type_problem(list[int], "not a list") is None  # not a scalar type: left to jsonargparse
    assert type_problem(_Base, 3) is None
