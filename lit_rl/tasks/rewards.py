"""TRL-compatible reward callables.

A reward function has TRL's signature ``f(prompts, completions, **kwargs) -> list[float]``: ``prompts``
and ``completions`` are parallel lists (plain strings, or TRL's conversational form: a list of message
dicts per item), and ``kwargs`` are the dataset columns as lists (here ``answer``, ``prompt_id`` and every
key of ``Example.meta``), plus whatever the caller adds. Functions may be given as callables or as
``"package.module.attr"`` / ``"package.module:attr"`` strings, so they can live in config files.

>>> def brevity(prompts, completions, **kwargs):
...     return [-0.001 * len(c) for c in completions]
>>> [f.__name__ for f in resolve_reward_funcs([brevity, "lit_rl.tasks.rewards.zero_reward"])]
['brevity', 'zero_reward']
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

RewardFunc = Callable[..., list[float]]


def zero_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """A reward callable that gives 0 to everything (handy as a placeholder or in tests)."""
    return [0.0] * len(completions)


def completion_text(completion: Any) -> str:
    """The text of one completion in TRL's standard (``str``) or conversational (``[{"content"}]``) form."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        return "".join(completion_text(m) for m in completion)
    return "" if completion is None else str(completion)


def import_object(path: str) -> Any:
    """Import ``"pkg.mod.attr"`` or ``"pkg.mod:attr"`` (the attribute may be dotted after a colon)."""
    if ":" in path:
        module_name, attr = path.split(":", 1)
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward function {path!r}: expected 'package.module.attr' or 'package.module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward function {path!r}: cannot import module {module_name!r} ({e})") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"reward function {path!r}: module {module_name!r} has no attribute {attr!r}") from e
    return obj


def resolve_reward_funcs(specs: Iterable[RewardFunc | str] | RewardFunc | str | None) -> list[RewardFunc]:
    """Turn callables and ``"module.attr"`` strings into a list of reward callables.

    Raises ``ValueError`` naming the entry when a string cannot be imported or an entry is not callable.
    """
    if specs is None:
        return []
    if isinstance(specs, str) or callable(specs):
        specs = [specs]
    funcs: list[RewardFunc] = []
    for i, spec in enumerate(specs):
        f = import_object(spec) if isinstance(spec, str) else spec
        if not callable(f):
            raise ValueError(f"reward_funcs[{i}] ({spec!r}) is not callable")
        funcs.append(f)
    return funcs


def call_reward_func(f: RewardFunc, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Call a TRL-style reward and check its output: one float per completion (``None`` -> NaN, as TRL)."""
    out = f(prompts, completions, **kwargs)
    out = list(out)
    if len(out) != len(completions):
        name = getattr(f, "__name__", repr(f))
        raise ValueError(f"reward function {name} returned {len(out)} values for {len(completions)} completions")
    return [float("nan") if v is None else float(v) for v in out]
