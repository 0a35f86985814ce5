"""TRL-compatible reward callables.

A reward function has TRL's signature and is called as TRL's ``GRPOTrainer`` calls it, by keyword::

    f(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns) -> list[float | None]

``prompts`` and ``completions`` are parallel lists; lit_rl's prompts are chat messages, so completions come
in TRL's conversational form (``[{"role": "assistant", "content": text}]`` per item) unless the task sets
``reward_completions: text``; ``completion_ids`` are the completions' token ids (up to and including the
first EOS); ``columns`` are the dataset columns as lists (``answer``, ``prompt_id`` and every key of
``Example.meta``). TRL's own functions (``trl.rewards.think_format_reward(completions, **kwargs)``,
``get_soft_overlong_punishment(...)``) therefore plug in unchanged. A function that takes its arguments
positionally under other names (lit_rl's older ``f(p, c, **kw)``) is still called positionally, and only
the keywords a function accepts are passed when it has no ``**kwargs``. ``None`` in the output means "no
reward" (NaN; it adds nothing to the total, as TRL's ``nansum``). Functions may be given as callables or as
``"package.module.attr"`` / ``"package.module:attr"`` strings, so they can live in config files.

>>> def brevity(prompts, completions, **kwargs):
...     return [-0.001 * len(c) for c in completions]
>>> [f.__name__ for f in resolve_reward_funcs([brevity, "lit_rl.tasks.rewards.zero_reward"])]
['brevity', 'zero_reward']
"""

from __future__ import annotations

import importlib
import inspect
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


def call_reward_func(
    f: RewardFunc, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None = None,
    **kwargs: Any
) -> list[float]:
    """Call a reward function as TRL does (module doc) and check its output: one float per completion
    (``None`` -> NaN). Raises ``ValueError`` naming the function on a wrong output length."""
    name = getattr(f, "__name__", None) or type(f).__name__
    args: dict[str, Any] = {"prompts": prompts, "completions": completions, **kwargs}
    if completion_ids is not None:
        args["completion_ids"] = completion_ids
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):  # builtins, some C callables: TRL's keyword call
        params = None
    if params is None:
        out = f(**args)
    else:
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if "completions" in named or var_kw and not _positional_only(params):
            out = f(**(args if var_kw else {k: v for k, v in args.items() if k in named}))
        else:  # lit_rl's older positional form f(prompts, completions, **kwargs) under other names
            rest = {k: v for k, v in args.items() if k not in ("prompts", "completions") and (var_kw or k in named)}
            out = f(prompts, completions, **rest)
    out = list(out)
    if len(out) != len(completions):
        raise ValueError(f"reward function {name} returned {len(out)} values for {len(completions)} completions")
    return [float("nan") if v is None else float(v) for v in out]


def _positional_only(params: Any) -> bool:
    """Whether the first two parameters are positional (and not named like TRL's keywords)."""
    pos = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(pos) >= 2 and pos[0].name != "prompts"


def completion_id_lists(completion: Any, lengths: Any) -> list[list[int]]:
    """TRL's ``completion_ids``: each row of ``completion (N, L)`` up to its length ``lengths (N,)`` (the
    first EOS included), as lists; one host transfer for the batch."""
    return [row[:n] for row, n in zip(completion.tolist(), lengths.tolist())]


def reward_func_name(f: RewardFunc) -> str:
    """The name TRL logs a reward function under (``rewards/<name>/mean``)."""
    return getattr(f, "__name__", None) or type(f).__name__
