"""The checks of :func:`preflight` (package docstring :mod:`lit_rl.config`).

Validates a ``fit``/``validate``/``test``/``predict`` command line (its ``--config`` YAML files and
``--key=value`` overrides) before anything is built: unknown keys, wrong scalar types, classes that do not
import, every settings dataclass of the config built from its YAML (their own ``__post_init__`` rules,
reported at the argument's file:line through :class:`~lit_rl.errors.FieldError`), rollout group sizes,
``max_steps`` vs ``updates_per_batch``, sequence length vs the tiny model's ``max_positions``, data files,
the external pool (every line, every prompt id), empty datasets, the MLflow tracking URI and ``ckpt_path``.
A problem raises :class:`~lit_rl.errors.ConfigError` whose one-line message names the config file and line,
the field, and for data files the data file and line.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from pathlib import Path
from typing import Any, Sequence

from lit_rl.config.lines import ConfigView, fail, parse_command_line
import lit_rl.config.signatures as sig
from lit_rl.errors import ConfigError, FieldError
from lit_rl.tracking import tracking_uri_problem

__all__ = ["ConfigError", "preflight"]


# -- the checks ---------------------------------------------------------------------------------------
_TOP_KEYS = {"seed_everything", "trainer", "model", "data", "threads", "ckpt_path", "optimizer", "lr_scheduler",
             "config",
             # the Trainer.fit/validate/test/predict arguments LightningCLI exposes (a saved fit config has them)
             "weights_only", "verbose", "return_predictions"}
#: init args that name an input file that must exist
_INPUT_PATHS = {"pool_path", "train_path", "eval_path", "test_csv", "data_path"}


def _check_class(cfg: ConfigView, path: tuple, node: dict) -> None:
    cp = node.get("class_path")
    if not isinstance(cp, str):
        raise fail(cfg, path + ("class_path",), f"expected a dotted class path, got {cp!r}")
    if "." not in cp:
        return  # a short name that jsonargparse resolves among the subclasses
    try:
        cls = sig.import_class(cp)
    except (ImportError, AttributeError, ValueError) as e:
        what = "unknown task" if "task" in path else "cannot import"
        raise fail(cfg, path + ("class_path",), f"{what} {cp!r} ({type(e).__name__}: {e})") from None
    args = node.get("init_args") or {}
    if not isinstance(args, dict):
        raise fail(cfg, path + ("init_args",), f"expected a mapping, got {type(args).__name__}")
    params, hints, open_kwargs = sig.params(cls)
    for k, v in args.items():
        if k not in params:
            if open_kwargs:
                continue
            close = [p for p in params if p.lower().startswith(str(k).lower()[:4])] or sorted(params)
            raise fail(cfg, path + ("init_args", k), f"unknown key for {cp} (accepted: {', '.join(close)})")
        if k in hints:
            problem = sig.type_problem(hints[k], v)
            if problem:
                raise fail(cfg, path + ("init_args", k), problem)


def _walk_classes(cfg: ConfigView, node: Any, path: tuple) -> None:
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


def _check_keys(cfg: ConfigView) -> None:
    for k in cfg.data:
        if k not in _TOP_KEYS:
            raise fail(cfg, (k,), f"unknown top-level key (accepted: {', '.join(sorted(_TOP_KEYS))})")
    trainer = cfg.data.get("trainer")
    if isinstance(trainer, dict):
        import lightning

        params, hints, _ = sig.params(lightning.Trainer)
        for k, v in trainer.items():
            if k not in params:
                raise fail(cfg, ("trainer", k), "unknown Trainer option")
            if k in hints and not isinstance(v, (dict, list)):
                problem = sig.type_problem(hints[k], v)
                if problem:
                    raise fail(cfg, ("trainer", k), problem)
    _walk_classes(cfg, cfg.data, ())


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _unwrap_optional(hint: Any) -> Any:
    """``X | None`` / ``Optional[X]`` -> ``X``; other hints unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a type hint names (``X``, ``X | None``, ``Optional[X]``), else ``None``."""
    hint = _unwrap_optional(hint)
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _build_settings(cfg: ConfigView, path: tuple, hint: Any, value: Any) -> Any:
    """Build a settings dataclass (and the ones nested in it, and in lists of them) from its YAML mapping, so
    its own ``__post_init__`` rules run here; a :class:`~lit_rl.errors.FieldError` is reported at the
    argument's file:line. Anything that is not such a mapping is returned unchanged (the key checks, which
    run next, report unknown keys and wrong types)."""
    hint = _unwrap_optional(hint)
    if typing.get_origin(hint) is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [_build_settings(cfg, path + (i,), item, v) for i, v in enumerate(value)]
    dc = _dataclass_in(hint)
    if dc is None or not isinstance(value, dict):
        return value
    try:
        hints = typing.get_type_hints(dc)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: leave the check to the run
        return value
    if any(k not in hints for k in value):
        return value
    kwargs = {k: _build_settings(cfg, path + (k,), hints[k], v) for k, v in value.items()}
    try:
        return dc(**kwargs)
    except FieldError as e:
        raise fail(cfg, path + tuple(e.field.split(".")), e.problem) from None
    except (TypeError, ValueError) as e:
        raise fail(cfg, path, str(e)) from None


def _walk_settings(cfg: ConfigView, node: Any, path: tuple) -> None:
    """Every ``class_path`` node's settings arguments through :func:`_build_settings`."""
    if isinstance(node, dict):
        if isinstance(node.get("class_path"), str) and "." in node["class_path"]:
            try:
                _, hints, _ = sig.params(sig.import_class(node["class_path"]))
            except Exception:  # noqa: BLE001 - reported by the key checks
                hints = {}
            args = node.get("init_args") if isinstance(node.get("init_args"), dict) else {}
            for k, v in args.items():
                if k in hints:
                    _build_settings(cfg, path + ("init_args", k), hints[k], v)
        for k, v in node.items():
            _walk_settings(cfg, v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_settings(cfg, v, path + (i,))


def _init_args(cfg: ConfigView, key: str) -> tuple[tuple, dict]:
    node = cfg.data.get(key)
    if isinstance(node, dict) and isinstance(node.get("init_args"), dict):
        return (key, "init_args"), node["init_args"]
    return (key, "init_args"), {}


def _class_of(cfg: ConfigView, key: str) -> Any:
    node = cfg.data.get(key)
    cp = node.get("class_path") if isinstance(node, dict) else None
    if not isinstance(cp, str) or "." not in cp:
        return None
    try:
        return sig.import_class(cp)
    except Exception:  # noqa: BLE001 - reported by the key checks
        return None


def _default(cls: Any, name: str, fallback: Any = None) -> Any:
    if cls is None:
        return fallback
    params, _, _ = sig.params(cls)
    p = params.get(name)
    return fallback if p is None or p.default is inspect.Parameter.empty else p.default


def _check_semantics(cfg: ConfigView) -> None:
    _walk_settings(cfg, cfg.data, ())
    mpath, margs = _init_args(cfg, "model")
    dpath, dargs = _init_args(cfg, "data")
    mcls, dcls = _class_of(cfg, "model"), _class_of(cfg, "data")
    # rollout groups: G_on + G_ext (= G where configured)
    dparams = sig.params(dcls)[0] if dcls is not None else {}
    if "g_on" in dparams or "g_on" in dargs or "g_ext" in dargs:
        # a sources list (datamodules.sources) says the group itself: the legacy G_on / G_ext rules do not apply
        legacy = not dargs.get("sources")
        g_on = dargs.get("g_on", _default(dcls, "g_on", 0)) if legacy else None
        g_ext = dargs.get("g_ext", _default(dcls, "g_ext", 0)) if legacy else None
        if _is_int(g_on) and _is_int(g_ext):
            for name, v in (("g_on", g_on), ("g_ext", g_ext)):
                if v < 0:
                    raise fail(cfg, dpath + (name,), f"must be >= 0, got {v}")
            if g_on + g_ext == 0:
                raise fail(cfg, dpath + ("g_on",), "g_on + g_ext = 0: a rollout group needs at least one completion")
            for gkey in ("group_size", "G", "num_generations"):
                for ppath, pargs in ((dpath, dargs), (mpath, margs)):
                    G = pargs.get(gkey)
                    if _is_int(G) and G != g_on + g_ext:
                        raise fail(
                            cfg, ppath + (gkey,),
                            f"G = {G} but g_on + g_ext = {g_on} + {g_ext} = {g_on + g_ext} "
                            f"(g_on at {cfg.loc(dpath + ('g_on',))}, g_ext at {cfg.loc(dpath + ('g_ext',))})",
                        )
            if g_ext > 0 and not dargs.get("pool_path", _default(dcls, "pool_path")):
                raise fail(cfg, dpath + ("pool_path",),
                           f"required when g_ext > 0 (g_ext = {g_ext} at {cfg.loc(dpath + ('g_ext',))})")
        ppb = dargs.get("prompts_per_batch")
        if _is_int(ppb) and ppb < 1:
            raise fail(cfg, dpath + ("prompts_per_batch",), f"must be >= 1, got {ppb}")
        es = dargs.get("eval_size", "unset")
        if _is_int(es) and es < 1:
            raise fail(cfg, dpath + ("eval_size",),
                       f"must be >= 1 or null (all), got {es}: the evaluation set would be empty")
        ntp = dargs.get("num_train_prompts")
        if _is_int(ntp) and ntp < 1:
            raise fail(cfg, dpath + ("num_train_prompts",),
                       f"must be >= 1 or null (all), got {ntp}: the training set would be empty")
        for key in ("eval_batch_size", "max_prompt_len"):
            v = dargs.get(key)
            if _is_int(v) and v < 1:
                raise fail(cfg, dpath + (key,), f"must be >= 1, got {v}")
    # optimizer updates per rollout batch vs max_steps
    mu = margs.get("updates_per_batch", _default(mcls, "updates_per_batch", 1))
    if _is_int(mu):
        if mu < 1:
            raise fail(cfg, mpath + ("updates_per_batch",), f"must be >= 1, got {mu}")
        max_steps = cfg.get(("trainer", "max_steps"))
        if _is_int(max_steps) and max_steps != -1:
            if max_steps < 1:
                raise fail(cfg, ("trainer", "max_steps"), f"must be >= 1 (or -1 with max_epochs), got {max_steps}")
            if max_steps % mu:
                raise fail(
                    cfg, ("trainer", "max_steps"),
                    f"{max_steps} optimizer updates is not a multiple of model.updates_per_batch = {mu} "
                    f"({cfg.loc(mpath + ('updates_per_batch',))}): the last rollout batch would overshoot to "
                    f"{-(-max_steps // mu) * mu}",
                )
    mcs = margs.get("max_consecutive_skips")
    if _is_int(mcs) and mcs < 1:
        raise fail(cfg, mpath + ("max_consecutive_skips",), f"must be >= 1, got {mcs}")
    # prompt + completion must fit the tiny model's positions
    policy = margs.get("policy")
    if isinstance(policy, dict) and isinstance(policy.get("class_path"), str):
        try:
            pcls = sig.import_class(policy["class_path"])
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
                    raise fail(
                        cfg, dpath + (gkey, "gen_length"),
                        f"max_prompt_len + L_gen = {max_prompt} + {L} = {max_prompt + L} exceeds the policy's "
                        f"max_positions = {max_pos} ({cfg.loc(mpath + ('policy', 'init_args', 'max_positions'))})",
                    )
    threads = cfg.data.get("threads")
    if _is_int(threads) and threads < 1:
        raise fail(cfg, ("threads",), f"must be >= 1 or null, got {threads}")


def _check_task_and_pool(cfg: ConfigView) -> None:
    dpath, dargs = _init_args(cfg, "data")
    task_node = dargs.get("task")
    # input files anywhere in the data block
    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _INPUT_PATHS and isinstance(v, str) and v and not Path(v).exists():
                    what = "external rollout pool" if k == "pool_path" else "data file"
                    raise fail(cfg, path + (k,), f"{what} not found: {v}")
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (i,))

    walk(cfg.data.get("data"), ("data",))
    if not (isinstance(task_node, dict) and isinstance(task_node.get("class_path"), str)):
        return
    tpath = dpath + ("task",)
    try:
        tcls = sig.import_class(task_node["class_path"])
        task = tcls(**(task_node.get("init_args") or {}))
    except Exception as e:  # noqa: BLE001 - a task that cannot be built is a config error
        raise fail(cfg, tpath, f"cannot build the task: {type(e).__name__}: {e}") from None
    try:
        train = task.train_examples()
        evals = task.eval_examples()
    except Exception as e:  # noqa: BLE001
        raise fail(cfg, tpath, f"cannot read the task's data: {type(e).__name__}: {e}") from None
    ntp = dargs.get("num_train_prompts")
    use = train[:ntp] if _is_int(ntp) else train
    if not use:
        key = tpath + ("init_args", "num_train") if "num_train" in (task_node.get("init_args") or {}) else tpath
        raise fail(cfg, key, f"the training set of task {getattr(task, 'name', tcls.__name__)!r} is empty")
    if not evals:
        raise fail(cfg, tpath, f"the evaluation set of task {getattr(task, 'name', tcls.__name__)!r} is empty")
    dcls = _class_of(cfg, "data")
    g_ext = dargs.get("g_ext", _default(dcls, "g_ext", 0))
    pool = dargs.get("pool_path")
    if _is_int(g_ext) and g_ext > 0 and isinstance(pool, str) and not dargs.get("sources"):
        from lit_rl.rollouts.pool import PoolFormatError, load_pool

        try:
            by_prompt = load_pool(pool, g_ext, valid_ids=[e.id for e in train], task=getattr(task, "name", None))
        except (PoolFormatError, FileNotFoundError, OSError, UnicodeDecodeError, EOFError) as e:
            raise fail(cfg, dpath + ("pool_path",), str(e)) from None
        if not any(e.id in by_prompt for e in use):
            raise fail(cfg, dpath + ("pool_path",), f"{pool}: no training prompt has g_ext = {g_ext} usable external "
                       "rollouts: the training set would be empty")


def _check_mlflow(cfg: ConfigView) -> None:
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
            raise fail(cfg, path, problem)


def _check_ckpt(cfg: ConfigView) -> None:
    ck = cfg.data.get("ckpt_path")
    if (isinstance(ck, str) and ck not in ("last", "best", "hpc", "registry") and "://" not in ck
            and not Path(ck).is_file()):
        raise fail(cfg, ("ckpt_path",), f"checkpoint file not found: {ck}")


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
