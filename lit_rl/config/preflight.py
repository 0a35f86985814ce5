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

import inspect
from pathlib import Path
from typing import Any, Sequence

from lit_rl.config.classes import check_shapes, walk_classes, walk_settings
from lit_rl.config.lines import ConfigView, fail, parse_command_line
import lit_rl.config.signatures as sig
from lit_rl.config.trainer_rules import check_trainer_args
from lit_rl.errors import ConfigError, FieldError
from lit_rl.tasks.base import check_prompt_set
from lit_rl.tracking import tracking_uri_problem

__all__ = ["ConfigError", "preflight"]


# -- the checks ---------------------------------------------------------------------------------------
_TOP_KEYS = {"seed_everything", "trainer", "model", "data", "threads", "overwrite", "ckpt_path", "optimizer",
             "lr_scheduler",
             "config",
             # the Trainer.fit/validate/test/predict arguments LightningCLI exposes (a saved fit config has them)
             "weights_only", "verbose", "return_predictions"}
#: init args that name an input file that must exist
_INPUT_PATHS = {"pool_path", "train_path", "eval_path", "test_csv", "data_path"}


def named_bases(overlay: str | Path) -> list[str]:
    """The configs an overlay's header puts under it, in order, from the first header line that names the overlay
    after another config (``--config A [--config B ...] --config <the overlay>``); ``[]`` if none does."""
    import re

    name = Path(overlay).name
    try:
        lines = Path(overlay).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        if not line.startswith("#"):
            break
        configs = re.findall(r"--config\s+(\S+)", line)
        own = [i for i, c in enumerate(configs) if i and Path(c).name == name]
        if own:
            return configs[: own[0]]
    return []


def _check_base(cfg: ConfigView) -> None:
    """An overlay used alone (it sets no ``model.class_path`` / ``data.class_path``): one line naming the base
    config it needs, instead of LightningCLI's usage text and a Union error."""
    def has_class(v: Any) -> bool:
        return isinstance(v, str) or (isinstance(v, dict) and "class_path" in v)

    missing = [k for k in ("model", "data") if not has_class(cfg.data.get(k))]
    if not missing or not cfg.files:
        return
    last = cfg.files[-1]
    bases = named_bases(last)
    chain = " ".join(f"--config {b}" for b in bases)
    how = (f"put its base first: {chain} --config {last}" if bases
           else "put its base config first: --config BASE --config " + last)
    raise ConfigError(f"{last}: no {missing[0]}.class_path in the configs given: it is an overlay; {how}")


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
        try:
            check_trainer_args(**{k: trainer[k] for k in ("val_check_interval",) if k in trainer})
        except FieldError as e:
            raise fail(cfg, ("trainer", e.field), e.problem) from None
    walk_classes(cfg, cfg.data, ())


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
    walk_settings(cfg, cfg.data, ())
    mpath, margs = _init_args(cfg, "model")
    dpath, dargs = _init_args(cfg, "data")
    mcls, dcls = _class_of(cfg, "model"), _class_of(cfg, "data")
    # the model's G against the data's G_on + G_ext (each class's own rules: RolloutDataModule.check_args)
    dparams = sig.params(dcls)[0] if dcls is not None else {}
    if ("g_on" in dparams or "g_on" in dargs or "g_ext" in dargs) and not dargs.get("sources"):
        g_on = dargs.get("g_on", _default(dcls, "g_on", 0))
        g_ext = dargs.get("g_ext", _default(dcls, "g_ext", 0))
        if _is_int(g_on) and _is_int(g_ext) and g_on >= 0 and g_ext >= 0:
            for gkey in ("group_size", "G", "num_generations"):
                G = margs.get(gkey)
                if _is_int(G) and G != g_on + g_ext:
                    raise fail(
                        cfg, mpath + (gkey,),
                        f"G = {G} but g_on + g_ext = {g_on} + {g_ext} = {g_on + g_ext} "
                        f"(g_on at {cfg.loc(dpath + ('g_on',))}, g_ext at {cfg.loc(dpath + ('g_ext',))})",
                    )
    # optimizer updates per rollout batch vs max_steps
    mu = margs.get("updates_per_batch", _default(mcls, "updates_per_batch", 1))
    if _is_int(mu) and mu >= 1:  # mu < 1: RLModule.check_args
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
    # prompt + completion must fit the tiny model's positions
    policy = margs.get("policy")
    if isinstance(policy, dict) and isinstance(policy.get("class_path"), str):
        try:
            pcls = sig.import_class(policy["class_path"])
        except Exception:  # noqa: BLE001
            pcls = None
        pargs = policy.get("init_args") or {}
        if pcls is not None and getattr(pcls, "supports_kv_cache", True) is False:
            for gkey in ("generation", "eval_generation"):
                gen = dargs.get(gkey)
                cache = gen.get("cache", "none") if isinstance(gen, dict) else "none"
                if cache != "none":
                    where = cfg.loc(mpath + ("policy", "class_path"))
                    raise fail(cfg, dpath + (gkey, "cache"),
                               f"{cache!r}, but the policy {pcls.__name__} ({where}) runs a checkpoint's own forward, "
                               f"which has no KV cache: use cache: none (or NativeLLaDA / NativeDream)")
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
    _check_surrogate_blocks(cfg, mpath, margs, dpath, dargs)
    threads = cfg.data.get("threads")
    if _is_int(threads) and threads < 1:
        raise fail(cfg, ("threads",), f"must be >= 1 or null, got {threads}")


def _check_surrogate_blocks(cfg: ConfigView, mpath: tuple, margs: dict, dpath: tuple, dargs: dict) -> None:
    """The SPG surrogate's block_length against the training decode's L_gen: the rule of
    :func:`~lit_rl.generation.settings.check_block_multiple` (``ERILSModule.setup`` applies it at run time)."""
    from lit_rl.generation.settings import DecodeSettings, check_block_multiple

    sur = margs.get("surrogate")
    mcls = _class_of(cfg, "model")
    if margs.get("loss_fn") is not None or mcls is None or "surrogate" not in sig.params(mcls)[0]:
        return  # no SPG surrogate scores this run
    sargs = sur.get("init_args") if isinstance(sur, dict) and isinstance(sur.get("init_args"), dict) else {}
    cp = sur.get("class_path") if isinstance(sur, dict) else None
    try:
        surrogate_cls = sig.import_class(cp) if isinstance(cp, str) and "." in cp else None
    except Exception:  # noqa: BLE001 - reported by the key checks
        return
    B = sargs.get("block_length", _default(surrogate_cls, "block_length", 32))  # None: ERILSModule's SPGSurrogate()
    gen = dargs.get("generation")
    L = gen.get("gen_length", DecodeSettings.gen_length) if isinstance(gen, dict) else None
    if not (_is_int(B) and B >= 1 and _is_int(L)):
        return
    try:
        check_block_multiple(L, B, "block_length", "the surrogate's ")
    except FieldError as e:
        raise fail(cfg, mpath + ("surrogate", "init_args", "block_length"),
                   f"{e.problem} (data.init_args.generation.gen_length at "
                   f"{cfg.loc(dpath + ('generation', 'gen_length'))})") from None


def _check_task_and_pool(cfg: ConfigView) -> None:
    dpath, dargs = _init_args(cfg, "data")
    task_node = dargs.get("task")
    # input files anywhere in the data block
    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _INPUT_PATHS and isinstance(v, str) and v and not Path(v).exists():
                    if k == "pool_path":
                        raise fail(cfg, path + (k,), f"external rollout pool not found: {v}; write one with python -m "
                                   "lit_rl rollouts build (a served model) or rollouts scripted (the built-in "
                                   "teachers): docs/erils.md")
                    raise fail(cfg, path + (k,), f"data file not found: {v}")
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
    except FieldError as e:  # an argument of the task (question_template ...): at its own line
        raise fail(cfg, tpath + ("init_args", e.field), e.problem) from None
    except Exception as e:  # noqa: BLE001
        raise fail(cfg, tpath, f"cannot read the task's data: {type(e).__name__}: {e}") from None
    _check_scripted_warmup(cfg, getattr(task, "name", None))
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
        from lit_rl.pools.pool import PoolFormatError, load_pool

        try:
            by_prompt = load_pool(pool, g_ext, valid_ids=[e.id for e in train], task=getattr(task, "name", None))
        except (PoolFormatError, FileNotFoundError, OSError, UnicodeDecodeError, EOFError) as e:
            raise fail(cfg, dpath + ("pool_path",), str(e)) from None
        if not any(e.id in by_prompt for e in use):
            raise fail(cfg, dpath + ("pool_path",), f"{pool}: no training prompt has g_ext = {g_ext} usable external "
                       "rollouts: the training set would be empty")
        use = [e for e in use if e.id in by_prompt]
    ppb = dargs.get("prompts_per_batch", _default(dcls, "prompts_per_batch", 1))
    devices = cfg.get(("trainer", "devices"))
    try:
        check_prompt_set(use, ppb if _is_int(ppb) and ppb >= 1 else 1, devices if _is_int(devices) else 1)
    except FieldError as e:
        raise fail(cfg, tpath if e.field == "task" else dpath + (e.field,), e.problem) from None


def _check_scripted_warmup(cfg: ConfigView, task_name: str | None) -> None:
    """A ``ScriptedSFTWarmup`` (steps > 0) on a task without scripted traces (a prompt file of your own) is refused
    at the callback's line, before any run folder: it used to fail in ``on_fit_start`` after 20 s with a 50-line
    traceback, a run folder and a FAILED MLflow run."""
    from lit_rl.tasks.registry import known_traces, scripted_tasks

    callbacks = cfg.get(("trainer", "callbacks"))
    if not isinstance(callbacks, list) or task_name is None or known_traces(task_name):
        return
    for i, cb in enumerate(callbacks):
        if not (isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("ScriptedSFTWarmup")):
            continue
        steps = (cb.get("init_args") or {}).get("steps", 300)
        if _is_int(steps) and steps > 0:
            raise fail(cfg, ("trainer", "callbacks", i), f"ScriptedSFTWarmup: task {task_name!r} has no scripted "
                       f"traces (only {', '.join(sorted(scripted_tasks()))} do); a pretrained policy needs no "
                       "warm-up: leave the callback out, or set its steps to 0 (in an overlay: trainer: "
                       "{callbacks~: [{class_path: ScriptedSFTWarmup, init_args: {steps: 0}}]})")


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


def preflight(argv: Sequence[str], data: bool = True) -> ConfigView | None:
    """Check a ``fit``/``validate``/``test`` command line; raise :class:`ConfigError` on the first problem.

    Runs in seconds, before any model, logger or trainer is built (the pool file and the task's dataset
    are read once; ``data=False`` leaves out those reads and the MLflow store, for checking many variants of one
    config, as the sweeps do). Returns the merged config, or ``None`` for a command line it does not understand
    (left to LightningCLI).
    """
    parsed = parse_command_line(argv)
    if parsed is None:
        return None
    sub, cfg = parsed
    _check_base(cfg)
    check_shapes(cfg)
    _check_semantics(cfg)
    _check_keys(cfg)
    _check_ckpt(cfg)
    if data:
        _check_mlflow(cfg)
        _check_task_and_pool(cfg)
        if sub == "fit":
            _check_rerun(cfg)
    return cfg


def _check_rerun(cfg: ConfigView) -> None:
    """A fit into a folder that holds an earlier run's checkpoints (:mod:`lit_rl.config.rerun`)."""
    import os

    from lit_rl.config.rerun import check_rerun

    root = cfg.get(("trainer", "default_root_dir")) or os.getcwd()
    problem = check_rerun(root, cfg.get(("trainer", "callbacks")), cfg.data.get("ckpt_path"),
                          cfg.data.get("overwrite") in (True, "true", "True", 1))
    if problem:
        raise fail(cfg, ("trainer", "default_root_dir"), problem)
