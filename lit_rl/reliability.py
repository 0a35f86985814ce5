"""Reliability: atomic checkpoint writes, RNG state capture, and a fail-fast config preflight.

* :class:`AtomicCheckpointIO` — a Lightning ``CheckpointIO`` plugin that writes every checkpoint to a
  temporary file in the target folder, ``fsync``\\ s it, renames it over the target (``os.replace``, atomic
  on POSIX) and ``fsync``\\ s the folder. A process killed during a save leaves the previous checkpoint
  intact (Lightning's default writes through an fsspec transaction whose temp file lives in ``/tmp``, so the
  final move is a copy when ``/tmp`` is another file system, and nothing is fsynced). Temp files are named
  ``.<name>.<random>.partial`` so that ``--ckpt_path last`` never picks one up. Use it with
  ``trainer.plugins: [lit_rl.reliability.AtomicCheckpointIO]``.
* :func:`capture_rng_state` / :func:`restore_rng_state` — python, numpy, torch (CPU and CUDA) global RNG
  states as plain tensors/ints (loadable with ``torch.load(weights_only=True)``).
* :func:`preflight` — validates a ``fit``/``validate``/``test`` command line (its ``--config`` YAML files and
  ``--key=value`` overrides) before anything is built: unknown keys, wrong scalar types, classes that do not
  import, decoding settings, rollout group sizes, ``max_steps`` vs ``updates_per_batch``, sequence length vs
  the tiny model's ``max_positions``, data files, the external pool (every line, every prompt id), empty
  datasets, the MLflow tracking URI and ``ckpt_path``. A problem raises :class:`ConfigError` whose one-line
  message names the config file and line, the field, and for data files the data file and line.
  :func:`checked_main` is ``python -m lit_rl`` with the preflight in front.
"""

from __future__ import annotations

import importlib
import inspect
import os
import random
import socket
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_rl.atomic import atomic_write

__all__ = [
    "AtomicCheckpointIO",
    "ConfigError",
    "atomic_torch_save",
    "capture_rng_state",
    "checked_main",
    "preflight",
    "restore_rng_state",
]


# ---------------------------------------------------------------------------------------------------------
# atomic checkpoint writes
# ---------------------------------------------------------------------------------------------------------
def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through :func:`atomic_write` (temp file + fsync + ``os.replace``)."""
    atomic_write(path, lambda fh: torch.save(obj, fh))


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`~lightning.fabric.plugins.io.TorchCheckpointIO` with atomic, durable local writes.

    Remote paths (``s3://`` ...) are left to Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)


# ---------------------------------------------------------------------------------------------------------
# RNG states
# ---------------------------------------------------------------------------------------------------------
def capture_rng_state() -> dict[str, Any]:
    """Global RNG states of python, numpy, torch CPU and CUDA (plain tensors, ints and tuples only)."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (missing entries are left alone)."""
    import numpy as np

    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        n = state["numpy"]
        keys = n["keys"].numpy().astype("uint32") if isinstance(n["keys"], torch.Tensor) else np.asarray(n["keys"], dtype="uint32")
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------------------
# config preflight
# ---------------------------------------------------------------------------------------------------------
class ConfigError(ValueError):
    """A malformed configuration or data file; the message names the field, the file and the line."""


Path_ = tuple  # a config key path, e.g. ("data", "init_args", "generation", "gen_length")


@dataclass
class _Config:
    data: dict[str, Any]
    where: dict[tuple, str]  # key path -> "file:line" or "command line (--key)"

    def loc(self, path: Sequence[Any]) -> str:
        """The most specific known location of ``path`` (its own, else its nearest ancestor's)."""
        p = tuple(path)
        while p:
            if p in self.where:
                return self.where[p]
            p = p[:-1]
        return "<defaults>"

    def get(self, path: Sequence[Any], default: Any = None) -> Any:
        node: Any = self.data
        for k in path:
            if isinstance(node, dict) and k in node:
                node = node[k]
            elif isinstance(node, list) and isinstance(k, int) and 0 <= k < len(node):
                node = node[k]
            else:
                return default
        return node


def _dotted(path: Sequence[Any]) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def _fail(cfg: _Config, path: Sequence[Any], problem: str) -> ConfigError:
    return ConfigError(f"{cfg.loc(path)}: {_dotted(path)}: {problem}")


def load_yaml_with_lines(path: Path) -> tuple[Any, dict[tuple, str]]:
    """A YAML file's data and where each key sits: ``{key path tuple: "file:line"}``; a missing file or a
    syntax error raises :class:`ConfigError` naming the file and line (the preflight and sweep configs)."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"{path}: config file not found (--config)")
    text = path.read_text(encoding="utf-8")
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else {}
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError(f"{path}:{line}: YAML syntax error: {e.problem or e.context}") from None
    where: dict[tuple, str] = {}

    def walk(n: Any, p: tuple) -> None:
        where[p] = f"{path}:{n.start_mark.line + 1}"
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    where[p + (k.value,)] = f"{path}:{k.start_mark.line + 1}"
                    walk(v, p + (k.value,))
                    where[p + (k.value,)] = f"{path}:{k.start_mark.line + 1}"
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, p + (i,))

    if node is not None:
        walk(node, ())
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: expected a mapping at the top level, got {type(data).__name__}")
    return data, where


_CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")


def _merge(base: Any, new: Any) -> Any:
    """jsonargparse-like merge: mappings merge key by key, a changed ``class_path`` drops the old
    ``init_args``, anything else (lists included) is replaced."""
    if isinstance(base, dict) and isinstance(new, dict):
        out = dict(base)
        if "class_path" in new and "class_path" in base and new["class_path"] != base["class_path"]:
            out.pop("init_args", None)
        for k, v in new.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    return new


def _set_override(cfg: _Config, dotted: str, raw: str) -> None:
    """Apply ``--a.b.c=value`` (``a.b`` of a ``class_path`` node may skip ``init_args``, as in jsonargparse)."""
    import yaml

    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    keys = dotted.split(".")
    node: Any = cfg.data
    path: tuple = ()
    for i, k in enumerate(keys):
        if not isinstance(node, dict):
            return
        if "class_path" in node and k not in _CLASS_KEYS:
            node = node.setdefault("init_args", {})
            path += ("init_args",)
        path += (k,)
        if i == len(keys) - 1:
            node[k] = _merge(node[k], value) if isinstance(node.get(k), dict) and isinstance(value, dict) else value
        else:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
    for key in [w for w in cfg.where if w[: len(path)] == path]:
        del cfg.where[key]
    cfg.where[path] = f"command line (--{dotted})"


def parse_command_line(argv: Sequence[str]) -> tuple[str | None, _Config] | None:
    """``(subcommand, merged config)`` of a LightningCLI command line, or ``None`` if it is not one this
    preflight understands (``--help``, ``--print_config``, list appends ...): the CLI then checks alone."""
    argv = list(argv)
    sub = argv[0] if argv and not argv[0].startswith("-") else None
    rest = argv[1:] if sub else argv
    cfg = _Config({}, {})
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            return None
        if tok in ("--help", "-h") or tok.startswith(("--print_config", "--print-config")) or "+=" in tok:
            return None
        key, eq, val = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(rest):
                return None
            val = rest[i + 1]
            i += 1
        i += 1
        if key == "config":
            data, where = load_yaml_with_lines(Path(val))
            cfg.data = _merge(cfg.data, data)
            cfg.where.update(where)
        else:
            _set_override(cfg, key, val)
    return sub, cfg


# -- class signatures ---------------------------------------------------------------------------------
def _import(class_path: str) -> Any:
    module, _, attr = class_path.rpartition(".")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _params(cls: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """Accepted keyword parameters of ``cls`` (following ``**kwargs`` up the MRO), their resolved type
    hints, and whether arbitrary keywords are accepted."""
    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    chain = [c for c in cls.__mro__ if c is not object] if isinstance(cls, type) else [cls]
    open_kwargs = True
    for c in chain:
        init = c.__init__ if isinstance(c, type) else c
        if isinstance(c, type) and "__init__" not in vars(c):
            continue
        try:
            sig = inspect.signature(init)
        except (TypeError, ValueError):
            return params, hints, True
        try:
            hints.update({k: v for k, v in typing.get_type_hints(init).items() if k not in hints})
        except Exception:  # noqa: BLE001 - unresolvable annotations: no type checks for them
            pass
        var_kw = False
        for name, p in sig.parameters.items():
            if name == "self" or p.kind == p.VAR_POSITIONAL:
                continue
            if p.kind == p.VAR_KEYWORD:
                var_kw = True
                continue
            params.setdefault(name, p)
        if not var_kw:
            open_kwargs = False
            break
    return params, hints, open_kwargs


_SCALARS = (int, float, bool, str)


def _type_problem(hint: Any, value: Any) -> str | None:
    """A message if ``value`` (from YAML) clearly cannot be ``hint`` (scalar types and their unions only)."""
    origin = typing.get_origin(hint)
    members = typing.get_args(hint) if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) else (hint,)
    if not all(m is type(None) or m in _SCALARS for m in members):
        return None  # a class, a list, a Literal ...: left to jsonargparse
    if value is None:
        return None if type(None) in members else "must not be null"
    for m in members:
        if m is bool and isinstance(value, bool):
            return None
        if m is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if m is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if m is str and isinstance(value, str):
            return None
    names = " | ".join("null" if m is type(None) else m.__name__ for m in members)
    return f"expected {names}, got {type(value).__name__} {value!r}"


# -- the checks ---------------------------------------------------------------------------------------
_TOP_KEYS = {"seed_everything", "trainer", "model", "data", "threads", "ckpt_path", "optimizer", "lr_scheduler", "config",
             # the Trainer.fit/validate/test/predict arguments LightningCLI exposes (a saved fit config has them)
             "weights_only", "verbose", "return_predictions"}
#: init args that name an input file that must exist
_INPUT_PATHS = {"pool_path", "train_path", "eval_path", "test_csv", "data_path"}


def _check_class(cfg: _Config, path: tuple, node: dict) -> None:
    cp = node.get("class_path")
    if not isinstance(cp, str):
        raise _fail(cfg, path + ("class_path",), f"expected a dotted class path, got {cp!r}")
    if "." not in cp:
        return  # a short name that jsonargparse resolves among the subclasses
    try:
        cls = _import(cp)
    except (ImportError, AttributeError, ValueError) as e:
        what = "unknown task" if "task" in path else "cannot import"
        raise _fail(cfg, path + ("class_path",), f"{what} {cp!r} ({type(e).__name__}: {e})") from None
    args = node.get("init_args") or {}
    if not isinstance(args, dict):
        raise _fail(cfg, path + ("init_args",), f"expected a mapping, got {type(args).__name__}")
    params, hints, open_kwargs = _params(cls)
    for k, v in args.items():
        if k not in params:
            if open_kwargs:
                continue
            close = [p for p in params if p.lower().startswith(str(k).lower()[:4])] or sorted(params)
            raise _fail(cfg, path + ("init_args", k), f"unknown key for {cp} (accepted: {', '.join(close)})")
        if k in hints:
            problem = _type_problem(hints[k], v)
            if problem:
                raise _fail(cfg, path + ("init_args", k), problem)


def _walk_classes(cfg: _Config, node: Any, path: tuple) -> None:
    if isinstance(node, dict):
        if "class_path" in node:
            _check_class(cfg, path, node)
            for k, v in (node.get("init_args") or {}).items() if isinstance(node.get("init_args"), dict) else ():
                _walk_classes(cfg, v, path + ("init_args", k))
        else:
            for k, v in node.items():
                _walk_classes(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_classes(cfg, v, path + (i,))


def _check_keys(cfg: _Config) -> None:
    for k in cfg.data:
        if k not in _TOP_KEYS:
            raise _fail(cfg, (k,), f"unknown top-level key (accepted: {', '.join(sorted(_TOP_KEYS))})")
    trainer = cfg.data.get("trainer")
    if isinstance(trainer, dict):
        import lightning

        params, hints, _ = _params(lightning.Trainer)
        for k, v in trainer.items():
            if k not in params:
                raise _fail(cfg, ("trainer", k), "unknown Trainer option")
            if k in hints and not isinstance(v, (dict, list)):
                problem = _type_problem(hints[k], v)
                if problem:
                    raise _fail(cfg, ("trainer", k), problem)
    _walk_classes(cfg, cfg.data, ())


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_generation(cfg: _Config, path: tuple, gen: Any) -> None:
    from lit_rl.generation.settings import DecodeSettings

    if not isinstance(gen, dict):
        return
    d = DecodeSettings.__dataclass_fields__
    vals = {k: gen.get(k, d[k].default) for k in ("gen_length", "block_length", "steps", "temperature")}
    for k in ("gen_length", "block_length", "steps"):
        if not _is_int(vals[k]):
            return  # type errors are reported by the key checks
        if vals[k] <= 0:
            raise _fail(cfg, path + (k,), f"must be a positive integer, got {vals[k]}")
    L, B, S = vals["gen_length"], vals["block_length"], vals["steps"]
    if L % B:
        raise _fail(cfg, path + ("gen_length",), f"L_gen = {L} is not a multiple of block_length = {B} ({cfg.loc(path + ('block_length',))})")
    if S % (L // B):
        raise _fail(cfg, path + ("steps",), f"steps = {S} is not divisible by the number of blocks L_gen/block_length = {L}/{B} = {L // B}")
    t = vals["temperature"]
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t < 0:
        raise _fail(cfg, path + ("temperature",), f"must be >= 0, got {t}")
    if gen.get("cache", "none") not in ("none", "prefix", "dual"):
        raise _fail(cfg, path + ("cache",), f"must be 'none', 'prefix' or 'dual', got {gen['cache']!r}")
    r = gen.get("refresh_every")
    if r is not None and (not _is_int(r) or r < 1):
        raise _fail(cfg, path + ("refresh_every",), f"must be a positive integer or null, got {r!r}")
    th = gen.get("threshold")
    if th is not None and (isinstance(th, bool) or not isinstance(th, (int, float)) or not 0 < th <= 1):
        raise _fail(cfg, path + ("threshold",), f"must be in (0, 1] or null, got {th!r}")


def _walk_generations(cfg: _Config, node: Any, path: tuple) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("generation", "eval_generation") and isinstance(v, dict):
                _check_generation(cfg, path + (k,), v)
            else:
                _walk_generations(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_generations(cfg, v, path + (i,))


def _init_args(cfg: _Config, key: str) -> tuple[tuple, dict]:
    node = cfg.data.get(key)
    if isinstance(node, dict) and isinstance(node.get("init_args"), dict):
        return (key, "init_args"), node["init_args"]
    return (key, "init_args"), {}


def _class_of(cfg: _Config, key: str) -> Any:
    node = cfg.data.get(key)
    cp = node.get("class_path") if isinstance(node, dict) else None
    if not isinstance(cp, str) or "." not in cp:
        return None
    try:
        return _import(cp)
    except Exception:  # noqa: BLE001 - reported by the key checks
        return None


def _default(cls: Any, name: str, fallback: Any = None) -> Any:
    if cls is None:
        return fallback
    params, _, _ = _params(cls)
    p = params.get(name)
    return fallback if p is None or p.default is inspect.Parameter.empty else p.default


def _check_semantics(cfg: _Config) -> None:
    _walk_generations(cfg, cfg.data, ())
    mpath, margs = _init_args(cfg, "model")
    dpath, dargs = _init_args(cfg, "data")
    mcls, dcls = _class_of(cfg, "model"), _class_of(cfg, "data")
    # rollout groups: G_on + G_ext (= G where configured)
    dparams = _params(dcls)[0] if dcls is not None else {}
    if "g_on" in dparams or "g_on" in dargs or "g_ext" in dargs:
        g_on = dargs.get("g_on", _default(dcls, "g_on", 0))
        g_ext = dargs.get("g_ext", _default(dcls, "g_ext", 0))
        if _is_int(g_on) and _is_int(g_ext):
            for name, v in (("g_on", g_on), ("g_ext", g_ext)):
                if v < 0:
                    raise _fail(cfg, dpath + (name,), f"must be >= 0, got {v}")
            if g_on + g_ext == 0:
                raise _fail(cfg, dpath + ("g_on",), "g_on + g_ext = 0: a rollout group needs at least one completion")
            for gkey in ("group_size", "G", "num_generations"):
                for ppath, pargs in ((dpath, dargs), (mpath, margs)):
                    G = pargs.get(gkey)
                    if _is_int(G) and G != g_on + g_ext:
                        raise _fail(
                            cfg, ppath + (gkey,),
                            f"G = {G} but g_on + g_ext = {g_on} + {g_ext} = {g_on + g_ext} "
                            f"(g_on at {cfg.loc(dpath + ('g_on',))}, g_ext at {cfg.loc(dpath + ('g_ext',))})",
                        )
            if g_ext > 0 and not dargs.get("pool_path", _default(dcls, "pool_path")):
                raise _fail(cfg, dpath + ("pool_path",), f"required when g_ext > 0 (g_ext = {g_ext} at {cfg.loc(dpath + ('g_ext',))})")
        ppb = dargs.get("prompts_per_batch")
        if _is_int(ppb) and ppb < 1:
            raise _fail(cfg, dpath + ("prompts_per_batch",), f"must be >= 1, got {ppb}")
        es = dargs.get("eval_size", "unset")
        if _is_int(es) and es < 1:
            raise _fail(cfg, dpath + ("eval_size",), f"must be >= 1 or null (all), got {es}: the evaluation set would be empty")
        ntp = dargs.get("num_train_prompts")
        if _is_int(ntp) and ntp < 1:
            raise _fail(cfg, dpath + ("num_train_prompts",), f"must be >= 1 or null (all), got {ntp}: the training set would be empty")
        for key in ("eval_batch_size", "max_prompt_len"):
            v = dargs.get(key)
            if _is_int(v) and v < 1:
                raise _fail(cfg, dpath + (key,), f"must be >= 1, got {v}")
    # optimizer updates per rollout batch vs max_steps
    mu = margs.get("updates_per_batch", _default(mcls, "updates_per_batch", 1))
    if _is_int(mu):
        if mu < 1:
            raise _fail(cfg, mpath + ("updates_per_batch",), f"must be >= 1, got {mu}")
        max_steps = cfg.get(("trainer", "max_steps"))
        if _is_int(max_steps) and max_steps != -1:
            if max_steps < 1:
                raise _fail(cfg, ("trainer", "max_steps"), f"must be >= 1 (or -1 with max_epochs), got {max_steps}")
            if max_steps % mu:
                raise _fail(
                    cfg, ("trainer", "max_steps"),
                    f"{max_steps} optimizer updates is not a multiple of model.updates_per_batch = {mu} "
                    f"({cfg.loc(mpath + ('updates_per_batch',))}): the last rollout batch would overshoot to {-(-max_steps // mu) * mu}",
                )
    mcs = margs.get("max_consecutive_skips")
    if _is_int(mcs) and mcs < 1:
        raise _fail(cfg, mpath + ("max_consecutive_skips",), f"must be >= 1, got {mcs}")
    # prompt + completion must fit the tiny model's positions
    policy = margs.get("policy")
    if isinstance(policy, dict) and isinstance(policy.get("class_path"), str):
        try:
            pcls = _import(policy["class_path"])
        except Exception:  # noqa: BLE001
            pcls = None
        pargs = policy.get("init_args") or {}
        max_pos = pargs.get("max_positions", _default(pcls, "max_positions"))
        max_prompt = dargs.get("max_prompt_len", _default(dcls, "max_prompt_len"))
        if _is_int(max_pos) and _is_int(max_prompt):
            for gkey in ("generation", "eval_generation"):
                gen = dargs.get(gkey)
                L = gen.get("gen_length") if isinstance(gen, dict) else None
                if _is_int(L) and max_prompt + L > max_pos:
                    raise _fail(
                        cfg, dpath + (gkey, "gen_length"),
                        f"max_prompt_len + L_gen = {max_prompt} + {L} = {max_prompt + L} exceeds the policy's max_positions = "
                        f"{max_pos} ({cfg.loc(mpath + ('policy', 'init_args', 'max_positions'))})",
                    )
    threads = cfg.data.get("threads")
    if _is_int(threads) and threads < 1:
        raise _fail(cfg, ("threads",), f"must be >= 1 or null, got {threads}")


def _check_task_and_pool(cfg: _Config) -> None:
    dpath, dargs = _init_args(cfg, "data")
    task_node = dargs.get("task")
    # input files anywhere in the data block
    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _INPUT_PATHS and isinstance(v, str) and v and not Path(v).exists():
                    what = "external rollout pool" if k == "pool_path" else "data file"
                    raise _fail(cfg, path + (k,), f"{what} not found: {v}")
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))

    walk(cfg.data.get("data"), ("data",))
    if not (isinstance(task_node, dict) and isinstance(task_node.get("class_path"), str)):
        return
    tpath = dpath + ("task",)
    try:
        tcls = _import(task_node["class_path"])
        task = tcls(**(task_node.get("init_args") or {}))
    except Exception as e:  # noqa: BLE001 - a task that cannot be built is a config error
        raise _fail(cfg, tpath, f"cannot build the task: {type(e).__name__}: {e}") from None
    try:
        train = task.train_examples()
        evals = task.eval_examples()
    except Exception as e:  # noqa: BLE001
        raise _fail(cfg, tpath, f"cannot read the task's data: {type(e).__name__}: {e}") from None
    ntp = dargs.get("num_train_prompts")
    use = train[:ntp] if _is_int(ntp) else train
    if not use:
        key = tpath + ("init_args", "num_train") if "num_train" in (task_node.get("init_args") or {}) else tpath
        raise _fail(cfg, key, f"the training set of task {getattr(task, 'name', tcls.__name__)!r} is empty")
    if not evals:
        raise _fail(cfg, tpath, f"the evaluation set of task {getattr(task, 'name', tcls.__name__)!r} is empty")
    dcls = _class_of(cfg, "data")
    g_ext = dargs.get("g_ext", _default(dcls, "g_ext", 0))
    pool = dargs.get("pool_path")
    if _is_int(g_ext) and g_ext > 0 and isinstance(pool, str):
        from lit_rl.rollouts.pool import PoolFormatError, load_pool

        try:
            by_prompt = load_pool(pool, g_ext, valid_ids=[e.id for e in train], task=getattr(task, "name", None))
        except (PoolFormatError, FileNotFoundError, OSError, UnicodeDecodeError, EOFError) as e:
            raise _fail(cfg, dpath + ("pool_path",), str(e)) from None
        if not any(e.id in by_prompt for e in use):
            raise _fail(cfg, dpath + ("pool_path",), f"{pool}: no training prompt has g_ext = {g_ext} usable external rollouts: the training set would be empty")


def _check_mlflow(cfg: _Config) -> None:
    loggers = cfg.get(("trainer", "logger"))
    items = loggers if isinstance(loggers, list) else [loggers]
    for i, lg in enumerate(items):
        if not (isinstance(lg, dict) and str(lg.get("class_path", "")).endswith("MLFlowLogger")):
            continue
        path = ("trainer", "logger") + ((i,) if isinstance(loggers, list) else ()) + ("init_args", "tracking_uri")
        uri = (lg.get("init_args") or {}).get("tracking_uri")
        if not isinstance(uri, str) or not uri:
            continue
        problem = tracking_uri_problem(uri)
        if problem:
            raise _fail(cfg, path, problem)


def tracking_uri_problem(uri: str, timeout: float = 3.0) -> str | None:
    """Why MLflow could not use ``uri`` (``None`` if it looks usable): sqlite files whose folder cannot be
    created, servers that do not accept a connection within ``timeout`` seconds."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        folder = db.parent
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            return f"MLflow store {uri!r} unreachable: cannot create or write {folder}"
        if db.exists() and not os.access(db, os.R_OK | os.W_OK):
            return f"MLflow store {uri!r} unreachable: {db} is not readable and writable"
        return None
    if uri.startswith(("http://", "https://")):
        u = urlparse(uri)
        port = u.port or (443 if u.scheme == "https" else 80)
        try:
            with socket.create_connection((u.hostname or "localhost", port), timeout=timeout):
                return None
        except OSError as e:
            return f"MLflow tracking server {uri!r} unreachable ({e.strerror or e})"
    if uri.startswith("file:") or "://" not in uri:
        return f"MLflow tracking URI {uri!r}: MLflow 3's file store is not supported; use sqlite:///runs/mlflow.db or a server"
    return None


def _check_ckpt(cfg: _Config) -> None:
    ck = cfg.data.get("ckpt_path")
    if isinstance(ck, str) and ck not in ("last", "best", "hpc", "registry") and "://" not in ck and not Path(ck).is_file():
        raise _fail(cfg, ("ckpt_path",), f"checkpoint file not found: {ck}")


def preflight(argv: Sequence[str]) -> None:
    """Check a ``fit``/``validate``/``test`` command line; raise :class:`ConfigError` on the first problem.

    Runs in seconds, before any model, logger or trainer is built (the pool file and the task's dataset
    are read once). Command lines it does not understand are left to LightningCLI.
    """
    parsed = parse_command_line(argv)
    if parsed is None:
        return
    _sub, cfg = parsed
    _check_semantics(cfg)
    _check_keys(cfg)
    _check_ckpt(cfg)
    _check_mlflow(cfg)
    _check_task_and_pool(cfg)


def checked_main(argv: list[str] | None = None) -> int:
    """``python -m lit_rl`` with :func:`preflight` in front of ``fit``/``validate``/``test``."""
    from lit_rl import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("fit", "validate", "test"):
        try:
            preflight(argv)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return cli.main(argv)


if __name__ == "__main__":
    raise SystemExit(checked_main())
