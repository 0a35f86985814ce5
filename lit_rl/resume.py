"""Resuming a fit: which checkpoint, whether it belongs to this run, and which MLflow run it continues.

Lightning's ``--ckpt_path last`` takes the newest ``last*.ckpt`` by modification time. It ignores the periodic
checkpoints beside it (a full disk that cost ``last.ckpt`` restarted the run at step 0), never checks that
the file can be read (a torn or foreign file ends in a ``PytorchStreamReader`` traceback), loads the weights
of another architecture into a size-mismatch traceback and those of another task silently, and every resume
opens a new MLflow run. :class:`lit_rl.lightning_cli.LitRLCLI` calls :func:`prepare_resume` before
``trainer.fit``:

1. :func:`resolve_checkpoint`: for ``last``, the newest readable ``*.ckpt`` (modification time, ``last.ckpt``
   first on a tie) of the run's checkpoint folders, with one line saying which and one line per unreadable
   file skipped. An explicit path that cannot be read is one :class:`~lit_rl.errors.CheckpointError`.
2. :func:`check_fits`: the checkpoint's record (:data:`RECORD_KEY`, written by :class:`callbacks.RunRecord`)
   names the task, algorithm, policy and data module it was trained with, and every class the config chose
   under ``model`` and ``data`` (advantages, surrogate, optimizer, ...: :func:`components`). A difference is
   refused in one line naming the config key (``LIT_RL_ALLOW_RESUME_MISMATCH=1`` resumes anyway, into a new
   MLflow run), and so is a parameter whose shape differs or that only one side has (no override: such
   weights cannot be loaded). Values (``lr``, ``max_steps``, ...) may change on resume; MLflow keeps a
   continued run's first values and the fit names the changed ones. Checkpoints written before the record
   existed get the shape check only.
3. :func:`continue_mlflow_run`: each MLflow logger continues the run id recorded in the checkpoint (what
   Lightning's own ``MLFlowLogger(run_id=...)`` does), marked RUNNING again whatever the interruption left
   (FAILED, KILLED, or RUNNING after ``kill -9``).

:func:`mark_stopped` marks a run that SIGTERM stopped as KILLED (its docstring says why).
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from lit_rl.errors import CheckpointError, one_line
from lit_rl.run_owner import mlflow_loggers

__all__ = ["ALLOW_ENV", "RECORD_KEY", "check_fits", "checkpoint_dirs", "components", "continue_mlflow_run",
           "continue_runs", "identity", "mark_stopped", "mlflow_runs", "prepare_resume", "resolve_checkpoint"]

RECORD_KEY = "lit_rl_run"
ALLOW_ENV = "LIT_RL_ALLOW_RESUME_MISMATCH"
#: identity entry -> the config key a user changes to change it (named in the refusal)
CONFIG_KEYS = {"task": "data.init_args.task", "algorithm": "model.class_path",
               "policy": "model.init_args.policy.class_path", "data": "data.class_path"}
_SPECIAL = ("best", "hpc", "registry")  # Lightning's other ckpt_path words: left to it


# ---------------------------------------------------------------------------------------------------------
# 1. which checkpoint
# ---------------------------------------------------------------------------------------------------------
def checkpoint_dirs(trainer: Any) -> list[Path]:
    """The folders of the trainer's ``ModelCheckpoint`` callbacks, else ``<default_root_dir>/checkpoints`` (where
    :class:`callbacks.CheckpointOnSigterm` writes without one)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    dirs = [Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    dirs = dirs or [Path(trainer.default_root_dir) / "checkpoints"]
    return list(dict.fromkeys(dirs))


def _candidates(dirs: list[Path]) -> list[Path]:
    """Every ``*.ckpt`` in ``dirs`` (not the hidden ``.<name>.*.partial`` temp files), newest first."""
    found = []
    for d in dirs:
        for p in d.glob("*.ckpt") if d.is_dir() else ():
            try:
                if not p.name.startswith(".") and p.is_file():
                    found.append((p.stat().st_mtime, p.name != "last.ckpt", p.name, p))
            except OSError:  # removed meanwhile
                continue
    return [p for *_, p in sorted(found, key=lambda t: (-t[0], t[1], t[2]))]


def _why_unreadable(path: Path, weights_only: bool) -> tuple[dict | None, str | None]:
    """``(checkpoint, None)``, loaded as Lightning's fit loads it (``weights_only`` unset means False there), or
    ``(None, why it cannot be read)``."""
    try:
        size = path.stat().st_size
    except OSError as e:
        return None, e.strerror or type(e).__name__
    if size == 0:
        return None, "empty file"
    try:
        # mmap: the tensors stay on disk; this reads the structure, the step and the shapes only
        ckpt = torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path), weights_only=weights_only)
    except Exception as e:  # noqa: BLE001 - whatever the reason, the file cannot be resumed from
        if not zipfile.is_zipfile(path):
            return None, f"not a complete checkpoint: truncated, or not written by torch.save ({size} bytes)"
        return None, one_line(e, 200) or type(e).__name__
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        return None, "not a Lightning checkpoint (no state_dict)"
    return ckpt, None


def resolve_checkpoint(ckpt_path: Any, trainer: Any, weights_only: bool | None = None) -> tuple[Any, dict | None]:
    """``(path, loaded checkpoint)`` to resume from; ``(None, None)`` when ``last`` finds no checkpoint at all,
    and ``(ckpt_path, None)`` for paths and words left to Lightning (``best``, remote URLs)."""
    if ckpt_path is None or str(ckpt_path) in _SPECIAL or "://" in str(ckpt_path):
        return ckpt_path, None
    if str(ckpt_path) != "last":
        ckpt, why = _why_unreadable(Path(ckpt_path), bool(weights_only))
        if ckpt is None:
            raise CheckpointError(f"checkpoint {ckpt_path} cannot be read ({why}); --ckpt_path last resumes from the "
                                  "newest readable checkpoint of the run")
        return Path(ckpt_path), ckpt
    dirs = checkpoint_dirs(trainer)
    skipped = []
    for path in _candidates(dirs):
        ckpt, why = _why_unreadable(path, bool(weights_only))
        if ckpt is None:
            rank_zero_info(f"resume: skipped {path}: cannot be read ({why})")
            skipped.append(path.name)
            continue
        rank_zero_info(f"resume: from {path} (step {ckpt.get('global_step', '?')})")
        return path, ckpt
    where = ", ".join(str(d) for d in dirs)
    if skipped:
        raise CheckpointError(f"--ckpt_path last: no readable checkpoint in {where} ({', '.join(skipped)} cannot be "
                              "read); start over with --overwrite true (removes them)")
    rank_zero_info(f"resume: --ckpt_path last found no checkpoint in {where}; starting at step 0")
    return None, None


# ---------------------------------------------------------------------------------------------------------
# 2. does it belong to this run
# ---------------------------------------------------------------------------------------------------------
def _class_path(cls: type) -> str:
    """``lit_rl.tasks.SudokuTask`` rather than ``lit_rl.tasks.sudoku.SudokuTask`` when the package exports it
    (the path a config names)."""
    module = cls.__module__
    parent = module.rsplit(".", 1)[0]
    if parent != module and getattr(sys.modules.get(parent), cls.__qualname__, None) is cls:
        module = parent
    return f"{module}.{cls.__qualname__}"


def identity(module: Any, datamodule: Any) -> dict[str, str]:
    """What a resumed run must share with its checkpoint: task (name and class), algorithm (the
    LightningModule), policy class, data module class. Absent parts are left out."""
    out: dict[str, str] = {}
    task = getattr(datamodule, "task", None)
    if task is not None:
        out["task"] = f"{getattr(task, 'name', '?')} ({_class_path(type(task))})"
    out["algorithm"] = _class_path(type(module))
    policy = getattr(module, "policy", None)
    if policy is not None:
        out["policy"] = _class_path(type(policy))
    if datamodule is not None:
        out["data"] = _class_path(type(datamodule))
    return out


def components(config: Any) -> dict[str, str]:
    """``{"model.init_args.advantages.class_path": "lit_rl.algorithms.advantages.SourceSpecific", ...}``: every
    ``class_path`` under ``model`` and ``data`` of a resolved fit config (a dict or jsonargparse Namespace)."""
    raw = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("class_path"), str):
                out[f"{prefix}.class_path"] = node["class_path"]
            for k, v in node.items():
                walk(v, f"{prefix}.{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}.{i}")

    for top in ("model", "data"):
        walk(raw.get(top), top)
    return out


def _shape_problems(module: Any, state: dict) -> list[str]:
    """Parameters whose shape differs, or that only one side has (the frozen 4-bit base, which checkpoints
    leave out, and keys under modules this one builds only on load, such as ``reference.``, excepted)."""
    own = module.state_dict()
    if not own or not state:
        return []
    problems = [f"{k} is {list(state[k].shape)} there, {list(v.shape)} here" for k, v in own.items()
                if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(v.shape)]
    if getattr(module, "strict_loading", True) is False:
        return problems
    try:
        from lit_rl.models.frozen_state import frozen_4bit_prefixes, is_frozen_key

        frozen = frozen_4bit_prefixes(module)
    except Exception:  # noqa: BLE001 - bitsandbytes missing: no 4-bit base to except
        frozen, is_frozen_key = [], None
    tops = {k.split(".", 1)[0] for k in own}
    problems += [f"{k} is in the checkpoint, not in this model" for k in state
                 if k not in own and k.split(".", 1)[0] in tops]
    problems += [f"{k} is in this model, not in the checkpoint" for k in own
                 if k not in state and not (frozen and is_frozen_key(k, frozen))]
    return problems


def check_fits(path: Path, ckpt: dict, module: Any, datamodule: Any, config_classes: dict[str, str] | None = None
               ) -> bool:
    """Refuse (one :class:`CheckpointError`) a checkpoint of another task, algorithm, policy class or data module,
    or whose config chose other classes under ``model`` / ``data`` (``config_classes``, :func:`components`),
    unless ``LIT_RL_ALLOW_RESUME_MISMATCH=1``; and one whose parameters do not fit ``module``. Returns whether
    the checkpoint is this run's (False: allowed by the override)."""
    record = ckpt.get(RECORD_KEY) or {}
    saved, now = record.get("identity") or {}, identity(module, datamodule)
    diffs = [f"{k} is {saved[k]} there, {now[k]} here ({CONFIG_KEYS[k]})" for k in CONFIG_KEYS
             if k in saved and k in now and saved[k] != now[k]]
    was, cur = record.get("components"), config_classes
    if was is not None and cur is not None:
        said = {f"{CONFIG_KEYS[k]}.class_path" if k == "task" else CONFIG_KEYS[k] for k in CONFIG_KEYS
                if k in saved and k in now}  # compared above, by name and class
        diffs += [f"{k} is {was.get(k, 'not set')} there, {cur.get(k, 'not set')} here" for k in sorted({*was, *cur})
                  if k not in said and was.get(k) != cur.get(k)]
    config = path.parent.parent / "config.yaml"
    own_config = f"its config ({config})" if config.is_file() else "the config it was trained with"
    if diffs:
        if os.environ.get(ALLOW_ENV) != "1":
            raise CheckpointError(f"checkpoint {path} is from another run: {'; '.join(diffs)}; resume with "
                                  f"{own_config}, or start over with --overwrite true ({ALLOW_ENV}=1 resumes "
                                  "anyway)")
        rank_zero_info(f"resume: {ALLOW_ENV}=1: resuming from {path} although {'; '.join(diffs)}; logging to a "
                       "new MLflow run")
    problems = _shape_problems(module, ckpt.get("state_dict") or {})
    if problems:
        part = ("this model (model.init_args.policy)" if all(p.startswith("policy.") for p in problems)
                else "this model")
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(f"checkpoint {path} does not fit {part}: {problems[0]}{more}; another architecture's "
                              f"weights cannot be loaded: resume with {own_config}, or start over with --overwrite "
                              "true")
    return not diffs


# ---------------------------------------------------------------------------------------------------------
# 3. the MLflow run
# ---------------------------------------------------------------------------------------------------------
def mlflow_runs(trainer: Any) -> list[dict[str, str]]:
    """``[{"run_id", "tracking_uri"}]`` of the trainer's MLflow loggers, for the checkpoint (rank 0; other ranks
    have no run)."""
    out = []
    for logger in mlflow_loggers(trainer):
        run_id = logger.run_id if rank_zero_only.rank == 0 else None
        if run_id:
            out.append({"run_id": str(run_id), "tracking_uri": str(logger._tracking_uri)})
    return out


def continue_mlflow_run(trainer: Any, path: Path, ckpt: dict) -> None:
    """Point each MLflow logger (in order) at the run its checkpoint recorded, if that run is in the logger's
    store and the config names no ``run_id`` of its own, and mark it RUNNING; otherwise say why a new run opens.

    Lightning's ``MLFlowLogger`` takes an existing run as ``run_id`` (its constructor argument, stored as
    ``_run_id``); the id is known only once the checkpoint is chosen, after the logger is built, so it is set
    here, before the logger first opens its run."""
    records = (ckpt.get(RECORD_KEY) or {}).get("mlflow") or []
    continue_runs(trainer, records, path.name, f"{path} (step {ckpt.get('global_step', '?')})")


def continue_runs(trainer: Any, records: list[dict], source: str, resumed_from: str) -> None:
    """:func:`continue_mlflow_run` for ``records`` (``[{"run_id", ...}]``) read from ``source`` (a checkpoint, or
    the run folder's :data:`lit_rl.run_owner.FILE` when there is no checkpoint yet)."""
    if rank_zero_only.rank != 0:
        return
    for logger, rec in zip(mlflow_loggers(trainer), records):
        if logger._run_id is not None:  # the config chose a run
            continue
        run_id = rec.get("run_id")
        try:
            run = logger._mlflow_client.get_run(run_id)
            if run.info.lifecycle_stage == "deleted":
                raise LookupError("deleted")
        except Exception as e:  # noqa: BLE001 - a store without it, a deleted run: a new run, said in one line
            why = one_line(e, 200) or type(e).__name__
            rank_zero_info(f"resume: MLflow run {run_id} of {source} is not usable in {logger._tracking_uri} "
                           f"({why}); logging to a new run")
            continue
        was = run.info.status
        logger._mlflow_client.update_run(run_id, status="RUNNING")
        logger._mlflow_client.set_tag(run_id, "lit_rl.resumed_from", resumed_from)
        logger._run_id = run_id
        rank_zero_info(f"resume: MLflow run {run_id} continues (it was {was})")


def mark_stopped(trainer: Any, why: str | None = None) -> None:
    """Mark the MLflow runs of a fit that a signal stopped (SIGTERM or Ctrl-C: with a checkpoint, exit status 0;
    or a second one, at once) KILLED, with a tag ``lit_rl.stopped``: ``why``, by default naming SIGTERM and the
    step.

    Lightning ends every interrupted fit with ``finalize("failed")``. KILLED is MLflow's status for a run ended
    from outside, which this is. FAILED would say it broke, though it stopped as asked and can resume.
    FINISHED would pass it off as complete: ``reproduce``'s reports take the last FINISHED run of a setting
    and skip the others as interrupted attempts (:mod:`lit_rl.reproduce.dr_report`). Sweeps already mark a
    pruned trial's run KILLED. A resume sets the run RUNNING again and its end FINISHED.
    """
    if rank_zero_only.rank != 0:
        return
    for logger in mlflow_loggers(trainer):
        if not getattr(logger, "_initialized", False) or not logger.run_id:
            continue
        try:
            client = logger.experiment
            client.set_terminated(logger.run_id, "KILLED")
            client.set_tag(logger.run_id, "lit_rl.stopped",
                           why or f"SIGTERM at step {trainer.global_step}; resume with --ckpt_path last")
        except Exception as e:  # noqa: BLE001 - the tracking server away: the run keeps Lightning's FAILED
            rank_zero_warn(f"MLflow run {logger.run_id}: could not mark it KILLED after the stop ({e})")


# ---------------------------------------------------------------------------------------------------------
def prepare_resume(trainer: Any, module: Any, datamodule: Any, ckpt_path: Any, weights_only: bool | None = None,
                   config_classes: dict[str, str] | None = None) -> Any:
    """The ``ckpt_path`` to hand to ``trainer.fit`` (a resolved file, or what Lightning resolves itself), after
    the checks and the MLflow link above (a checkpoint of another run let through by the override starts a new
    MLflow run: its curve is not this run's)."""
    from lit_rl.run_owner import FILE, mark_orphans, recorded_runs
    from lit_rl.runs import run_dir

    folder = run_dir(trainer)
    mark_orphans(trainer, folder)
    path, ckpt = resolve_checkpoint(ckpt_path, trainer, weights_only)
    if ckpt is None:
        if path is None and str(ckpt_path) == "last":  # no checkpoint yet: the run the folder's first attempt opened
            continue_runs(trainer, recorded_runs(folder), str(folder / FILE), f"{folder} (no checkpoint: step 0)")
        return path
    if check_fits(path, ckpt, module, datamodule, config_classes):
        continue_mlflow_run(trainer, path, ckpt)
    return str(path)
