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
import math
import threading
import warnings
from typing import Any, Callable, Iterable, Sequence

RewardFunc = Callable[..., list[float]]

#: the largest reward size a task takes from a reward function by default (``Task.max_abs_reward``): |r| above
#: it is refused in one line. Rewards reach the loss as float32 advantages; 1e6 is far below what overflows
#: there (group statistics square them: about 1.8e19) and far above any reward in the papers (0-3).
MAX_ABS_REWARD = 1e6


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


#: packages a reward function may need that lit_rl's core install leaves out: how to get each
OPTIONAL_INSTALLS = {
    "trl": "TRL's reward functions need trl: pip install trl (lit_rl's dev extra has it: pip install 'lit-rl[dev]')",
    "math_verify": "math-verify comes with lit_rl's math extra: pip install 'lit-rl[math]'",
    "datasets": "datasets comes with lit_rl's datasets extra: pip install 'lit-rl[datasets]'",
}


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
        missing = (getattr(e, "name", None) or "").split(".")[0]
        hint = f"; {OPTIONAL_INSTALLS[missing]}" if missing in OPTIONAL_INSTALLS else ""
        raise ValueError(f"reward function {path!r}: cannot import module {module_name!r} ({e}){hint}") from e
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
    timeout: float | None = None, max_abs: float | None = None, **kwargs: Any
) -> list[float]:
    """Call a reward function as TRL does (module doc) and check its output: one number per completion
    (``None`` or NaN -> NaN: no reward, it adds nothing, as TRL's ``nansum``).

    Raises :class:`~lit_rl.errors.RewardError` naming the function (and the row and its prompt id) for an output
    that is not a list of that length, an entry that is not a number (a string, a list ...), an infinite value, a
    finite one above ``max_abs`` in size (:data:`MAX_ABS_REWARD` for tasks), and for an exception the function
    raised (:func:`_failure`: the first row it raises on alone, the exception, the function's line).
    With ``timeout`` (seconds), a call that has not returned by then is left running in a background thread and
    its values for this batch are NaN; the first such call of each function is a warning naming it.
    """
    name = reward_func_name(f)
    call = _caller(f, prompts, completions, completion_ids, kwargs)
    try:
        if timeout is None:
            out = call()
        else:
            done, out = _call_with_timeout(call, timeout)
    except Exception as e:  # noqa: BLE001 - the user's function failed: one line naming it, the row, the prompt
        raise _failure(name, e, f, prompts, completions, completion_ids, kwargs, timeout) from e
    if timeout is not None:
        if not done:
            if name not in _TIMED_OUT:
                _TIMED_OUT.add(name)
                warnings.warn(
                    f"reward function {name} did not return within reward_timeout = {timeout:g} s (a batch of "
                    f"{len(completions)} completions): its rewards of this batch count as None (they add nothing) "
                    "and the call is left running in the background. Shown once per function", stacklevel=2)
            return [float("nan")] * len(completions)
    return check_reward_output(name, out, len(completions), kwargs.get("prompt_id"), max_abs=max_abs)


def _caller(f: RewardFunc, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None,
            kwargs: dict[str, Any]) -> Callable[[], Any]:
    """``f`` bound to one batch, called as TRL calls it (module doc)."""
    args: dict[str, Any] = {"prompts": prompts, "completions": completions, **kwargs}
    if completion_ids is not None:
        args["completion_ids"] = completion_ids
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):  # builtins, some C callables: TRL's keyword call
        return lambda: f(**args)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if "completions" in named or var_kw and not _positional_only(params):
        return lambda: f(**(args if var_kw else {k: v for k, v in args.items() if k in named}))
    # lit_rl's older positional form f(prompts, completions, **kwargs) under other names
    rest = {k: v for k, v in args.items() if k not in ("prompts", "completions") and (var_kw or k in named)}
    return lambda: f(prompts, completions, **rest)


def _failure(name: str, err: Exception, f: RewardFunc, prompts: list[Any], completions: list[Any],
             completion_ids: list[list[int]] | None, kwargs: dict[str, Any], timeout: float | None = None
             ) -> Exception:
    """The :class:`~lit_rl.errors.RewardError` for a reward function that raised on a batch: the first row it
    raises on alone (each row called by itself, as a batch of one), its prompt id, the exception and the
    function's line where it was raised. ``LIT_RL_DEBUG=1`` makes the CLI print the traceback as well."""
    import traceback

    from lit_rl.errors import RewardError, one_line

    n = len(completions)
    where = ""
    frames = traceback.extract_tb(err.__traceback__)
    if frames:
        where = f" ({frames[-1].filename}:{frames[-1].lineno})"
    import time

    row, tried, t0 = None, 0, time.monotonic()
    for i in range(n):
        if i >= SEARCH_ROWS or time.monotonic() - t0 > SEARCH_SECONDS:  # a slow or paid reward: bounded calls
            break
        tried += 1
        one = {k: v[i : i + 1] if isinstance(v, (list, tuple)) and len(v) == n else v for k, v in kwargs.items()}
        ids = completion_ids[i : i + 1] if completion_ids is not None else None
        call = _caller(f, prompts[i : i + 1], completions[i : i + 1], ids, one)
        try:
            if timeout is None:
                call()
            elif not _call_with_timeout(call, timeout)[0]:
                break  # hangs on a row alone: stop looking
        except Exception:  # noqa: BLE001 - raised again on this row alone
            row = i
            break
    pids = kwargs.get("prompt_id")
    at = (f"on a batch of {n} completions (each row alone passes)" if tried == n
          else f"on a batch of {n} completions (the first {tried} rows alone pass)")
    if row is not None:
        pid = pids[row] if isinstance(pids, (list, tuple)) and row < len(pids) else None
        at = f"at row {row}" + (f" (prompt {pid!r})" if pid is not None else "")
    msg = one_line(err, 200)
    return RewardError(f"reward function {name} raised {type(err).__name__}{': ' + msg if msg else ''} {at}{where}; "
                       "LIT_RL_DEBUG=1 prints the traceback")


#: a failed batch is searched for its first failing row by calling the function on at most this many rows, for
#: at most this many seconds (a network or LLM-judge reward must not be called hundreds of times to word an error)
SEARCH_ROWS, SEARCH_SECONDS = 16, 10.0

#: reward functions that have timed out in this process (each is warned about once)
_TIMED_OUT: set[str] = set()


def _call_with_timeout(call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """``(True, call())`` if it returns within ``timeout`` seconds (its exception is raised here), else
    ``(False, None)``; the call runs in a daemon thread, which a Python thread cannot be stopped in."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = call()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["err"] = e

    t = threading.Thread(target=run, name="lit_rl-reward", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False, None
    if "err" in box:
        raise box["err"]
    return True, box["out"]


def check_reward_output(name: str, out: Any, n: int, prompt_ids: Sequence[Any] | None = None,
                        max_abs: float | None = None) -> list[float]:
    """A reward function's output as ``n`` floats (``None`` -> NaN), or a :class:`~lit_rl.errors.RewardError`
    naming the function, the row and its prompt id (also for a finite value above ``max_abs`` in size)."""
    from lit_rl.errors import RewardError

    def row(i: int) -> str:
        pid = prompt_ids[i] if prompt_ids is not None and i < len(prompt_ids) else None
        return f"row {i}" + (f" (prompt {pid!r})" if pid is not None else "")

    if out is None or isinstance(out, (str, bytes, dict)) or not hasattr(out, "__iter__") or _is_scalar(out):
        raise RewardError(f"reward function {name} returned {_short(out)}; it must return a list of one float (or "
                          f"None) per completion ({n})")
    out = list(out)
    if len(out) != n:
        raise RewardError(f"reward function {name} returned {len(out)} values for {n} completions")
    values = []
    for i, v in enumerate(out):
        if v is None:
            values.append(float("nan"))
            continue
        if isinstance(v, (str, bytes)) or not _is_scalar(v):
            raise RewardError(f"reward function {name} returned {_short(v)} at {row(i)}: expected a float or None")
        x = float(v)
        if math.isinf(x):
            raise RewardError(f"reward function {name} returned {x} at {row(i)}: rewards must be finite (None or "
                              "NaN means no reward)")
        if max_abs is not None and abs(x) > max_abs:
            raise RewardError(f"reward function {name} returned {x:g} at {row(i)}: a reward's size must be at most "
                              f"{max_abs:g} (the task's max_abs_reward; larger values overflow the update)")
        values.append(x)
    return values


def _is_scalar(v: Any) -> bool:
    """A real number: bool / int / float, or a 0-d tensor / NumPy scalar (anything ``float()`` takes that is not
    text or a container)."""
    if isinstance(v, (bool, int, float)):
        return True
    if getattr(v, "ndim", None) == 0 or getattr(v, "shape", None) == ():
        try:
            float(v)
        except (TypeError, ValueError):
            return False
        return True
    return False


def _short(v: Any) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r if len(r) <= 40 else r[:37] + '...'}"


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
