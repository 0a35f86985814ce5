"""The pool builder's config (``rollouts build --config YAML``): keys, environment variables, the task
(the YAML layout is in :mod:`lit_rl.pools.build`'s docstring)."""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from lit_rl.pools.backend_types import Sampling
from lit_rl.pools.length_control import LengthControl
from lit_rl.pools.pool import MAX_USABLE_TOKENS
from lit_rl.tasks.base import Task

__all__ = ["BuildConfig", "BuildConfigError", "build_task", "load_build_config", "resolve_env"]


CONFIG_KEYS = (
    "task", "out", "n", "seed", "limit", "g_ext", "max_usable_tokens", "length_tokenizer", "prompts_per_wave",
    "sampling", "length_control", "backend", "mlflow", "external_lm",
)
_ENV = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::-([^}]*))?\}")
#: header keys that must match when a build resumes (everything that changes the generated records)
RESUME_KEYS = ("task", "task_spec", "policy", "backend", "tokenizer", "length_unit", "n", "seed", "max_usable_tokens",
               "sampling", "length_control")


class BuildConfigError(ValueError):
    """An invalid build config (the message names the file and key)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML ``true`` is not a count


@dataclass
class BuildConfig:
    """A parsed build config (see the module docstring for the YAML).

    Attributes:
        task_spec: ``{"class_path": ..., "init_args": {...}}`` of the task.
        backend_spec: the ``backend`` block (``type`` + the backend's arguments).
        out: pool path.
        n: candidates per prompt (paper: 6).
        seed: dataset seed (paper: 42).
        limit: only the first ``limit`` training prompts.
        g_ext: external rollouts per prompt in the default ERILS run (statistics).
        max_usable_tokens: longer completions are unusable (paper: 500).
        length_tokenizer: tokenizer to count lengths (see :func:`resolve_length_counter`).
        prompts_per_wave: prompts whose requests are handed to the backend at once.
        sampling: temperature, max tokens, top-p.
        length_control: length-control mode and texts.
        mlflow: ``{"tracking_uri": "sqlite:///...", "experiment_name": ..., "run_name": ...}`` or ``None``.
        external_lm: how ``rollouts train-lm`` trains the backend's model (``teacher`` and the fields of
            :class:`~lit_rl.pools.external_lm.ExternalLMSettings`); the pool build itself ignores it.
        source: the config file (for messages).
    """

    task_spec: dict[str, Any]
    backend_spec: dict[str, Any]
    out: Path
    n: int = 6
    seed: int = 42
    limit: int | None = None
    g_ext: int = 2
    max_usable_tokens: int = MAX_USABLE_TOKENS
    length_tokenizer: str | None = "auto"
    prompts_per_wave: int = 64
    sampling: Sampling = field(default_factory=Sampling)
    length_control: LengthControl = field(default_factory=LengthControl)
    mlflow: dict[str, Any] | None = None
    external_lm: dict[str, Any] | None = None
    source: str = "<config>"

    def __post_init__(self) -> None:
        for key in ("n", "g_ext", "max_usable_tokens", "prompts_per_wave"):
            if not _is_int(getattr(self, key)) or getattr(self, key) < 1:
                raise BuildConfigError(f"{self.source}: {key}={getattr(self, key)!r}: must be an integer >= 1")
        if not _is_int(self.seed):
            raise BuildConfigError(f"{self.source}: seed={self.seed!r}: must be an integer")
        if self.limit is not None and (not _is_int(self.limit) or self.limit < 0):
            raise BuildConfigError(f"{self.source}: limit={self.limit!r}: must be null or an integer >= 0")
        if self.length_tokenizer is not None and not isinstance(self.length_tokenizer, str):
            raise BuildConfigError(f"{self.source}: length_tokenizer={self.length_tokenizer!r}: "
                                   "must be a tokenizer name, auto, chars or null")
        if Path(self.out).name.endswith(".gz"):  # a gzip name over plain text would fail to load later
            raise BuildConfigError(f"{self.source}: out={str(self.out)!r}: builders write plain JSONL; "
                                   "drop .gz (gzip the finished pool yourself)")
        if self.g_ext > self.n:
            raise BuildConfigError(f"{self.source}: g_ext={self.g_ext} > n={self.n}: a prompt can never be usable")


def resolve_env(value: Any, where: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of ``value`` (upper-case names only, so
    LaTeX such as ``${x}$`` in instruction texts is left alone)."""
    if isinstance(value, dict):
        return {k: resolve_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise BuildConfigError(f"{where} uses ${{{name}}}, but the environment variable {name} is not set: "
                               f"export {name}=... (e.g. the vLLM server's base URL http://HOST:8000/v1)")

    return _ENV.sub(sub, value)


def load_build_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BuildConfig:
    """Read a build config (YAML), resolve environment variables, apply ``overrides`` (top-level keys)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BuildConfigError(f"build config not found: {path}")
    try:
        with path.open(encoding="utf-8") as fh:  # a stream, so that YAML errors name the file
            raw = yaml.safe_load(fh) or {}
    except yaml.YAMLError as e:
        raise BuildConfigError(f"{path}: invalid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise BuildConfigError(f"{path}: not UTF-8 (byte offset {e.start})") from None
    except RecursionError:
        raise BuildConfigError(f"{path}: invalid YAML: nested too deeply") from None
    if not isinstance(raw, dict):
        raise BuildConfigError(f"{path}: expected a mapping at the top level")
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = sorted(set(raw) - set(CONFIG_KEYS))
    if unknown:
        raise BuildConfigError(f"{path}: unknown key(s) {unknown} (accepted: {list(CONFIG_KEYS)})")
    for key in ("task", "backend", "out"):
        if key not in raw:
            raise BuildConfigError(f"{path}: missing required key {key!r}")
    cfg = resolve_env(raw)
    task = cfg["task"]
    if isinstance(task, str):
        task = {"class_path": task}
    if not isinstance(task, dict) or "class_path" not in task:
        raise BuildConfigError(f"{path}: task: expected {{class_path: lit_rl.tasks.SudokuTask, init_args: {{...}}}} "
                               "or a task name")
    if not isinstance(task["class_path"], str):
        raise BuildConfigError(f"{path}: task.class_path={task['class_path']!r}: expected a class path or a task name")
    if not isinstance(task.get("init_args") or {}, dict):
        raise BuildConfigError(f"{path}: task.init_args={task['init_args']!r}: "
                               "expected a mapping of the task's arguments")
    if not isinstance(cfg["out"], (str, os.PathLike)) or not str(cfg["out"]).strip():
        raise BuildConfigError(f"{path}: out={cfg['out']!r}: expected the pool's file path")
    blocks = {}
    for key, cls in (("sampling", Sampling), ("length_control", LengthControl)):
        block = cfg.get(key) or {}
        if not isinstance(block, dict):
            raise BuildConfigError(f"{path}: {key}: expected a mapping, got {type(block).__name__}")
        try:
            blocks[key] = cls(**block)
        except TypeError as e:  # an unknown key
            raise BuildConfigError(f"{path}: {key}: {e}") from None
        except ValueError as e:  # the message names the field (sampling.temperature=...)
            raise BuildConfigError(f"{path}: {e}") from None
    sampling, length_control = blocks["sampling"], blocks["length_control"]
    mlflow_cfg = cfg.get("mlflow")
    if mlflow_cfg is not None and not (isinstance(mlflow_cfg, dict) and mlflow_cfg.get("tracking_uri")):
        raise BuildConfigError(f"{path}: mlflow: expected {{tracking_uri: sqlite:///runs/mlflow.db, "
                               f"experiment_name: ...}} or null")
    if mlflow_cfg is not None:
        from lit_rl.tracking import check_tracking_uri

        try:  # fail before hours of generation, not after
            check_tracking_uri(str(mlflow_cfg["tracking_uri"]))
        except ValueError as e:
            raise BuildConfigError(f"{path}: mlflow.tracking_uri: {e}") from None
    return BuildConfig(
        task_spec={"class_path": task["class_path"], "init_args": dict(task.get("init_args") or {})},
        backend_spec=dict(cfg["backend"]) if isinstance(cfg["backend"], dict) else cfg["backend"],
        out=Path(cfg["out"]),
        n=cfg.get("n", 6),
        seed=cfg.get("seed", 42),
        limit=cfg.get("limit"),
        g_ext=cfg.get("g_ext", 2),
        max_usable_tokens=cfg.get("max_usable_tokens", MAX_USABLE_TOKENS),
        length_tokenizer=cfg.get("length_tokenizer", "auto"),
        prompts_per_wave=cfg.get("prompts_per_wave", 64),
        sampling=sampling,
        length_control=length_control,
        mlflow=mlflow_cfg,
        external_lm=_external_lm_block(cfg.get("external_lm"), path),
        source=str(path),
    )


def _external_lm_block(block: Any, path: Path) -> dict[str, Any] | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise BuildConfigError(f"{path}: external_lm: expected a mapping (teacher, steps, ...), "
                               f"got {type(block).__name__}")
    return dict(block)


def build_task(spec: dict[str, Any], where: str = "task") -> Task:
    """Instantiate ``{"class_path": "lit_rl.tasks.SudokuTask" | "sudoku", "init_args": {...}}``."""
    from lit_rl.tasks import TASKS

    class_path, init_args = spec["class_path"], spec.get("init_args") or {}
    if class_path in TASKS:
        cls = TASKS[class_path]
    else:
        module, _, attr = str(class_path).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as e:
            raise BuildConfigError(f"{where}.class_path={class_path!r}: cannot import ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise BuildConfigError(f"{where}.class_path={class_path!r}: not a lit_rl Task")
    try:
        return cls(**init_args)
    except TypeError as e:
        raise BuildConfigError(f"{where}.init_args: {e}") from None
