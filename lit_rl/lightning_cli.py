"""The LightningCLI behind ``python -m lit_rl fit|validate|test``.

Module-level classes (not closures), so a trainer that holds them can be pickled (``ddp_spawn``, sweeps).
Imported lazily by :mod:`lit_rl.cli` so ``score``/``rollouts`` do not pay for Lightning's import.
"""

from __future__ import annotations

import argparse
import re
import os
import sys
from pathlib import Path

import torch
from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info

from lit_rl.runs import run_dir


def user_facing_cause(err: BaseException) -> BaseException | None:
    """The first error in ``err``'s cause/context chain that lit_rl raised for the user to read
    (jsonargparse wraps a class's constructor error in "Does not validate against any of the Union subtypes")."""
    from lit_rl.models.remote_compat import RemoteCodeError
    from lit_rl.errors import ConfigError, FieldError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (RemoteCodeError, ConfigError, FieldError)):
            return err
        err = err.__cause__ or err.__context__
    return None


_RST_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|obj|exc):`(~?)([^`]+)`")


def plain_text(text: str) -> str:
    """Docstring reST as a terminal shows it: ``:class:`~a.b.C``` -> ``C``, ``:func:`a.b``` -> ``a.b``, double
    backquotes dropped (Lightning's and lit_rl's docstrings reach ``--help`` as they are written)."""
    text = _RST_ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return text.replace("``", "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's formatter that keeps the description's lines (one subcommand per line) and shows docstring
    reST as plain text (:func:`plain_text`). At module level: a ``ddp_spawn`` run pickles the parser, and a class
    local to a function cannot be pickled."""

    def _expand_help(self, action) -> str:
        return plain_text(super()._expand_help(action))


class LitRLCLI(LightningCLI):
    """LightningCLI with a ``--threads`` option (torch CPU threads); a model that cannot be built raises
    lit_rl's own error (e.g. :class:`~lit_rl.models.remote_compat.RemoteCodeError`), not jsonargparse's wrapper.
    ``fit`` resumes through :mod:`lit_rl.resume` (which checkpoint, whether it fits, the same MLflow run) and
    records the run in its checkpoints (:class:`callbacks.run_record.RunRecord`). Its usage line names
    ``python -m lit_rl`` and every subcommand, the plain programs (``extra_commands``) included."""

    def __init__(self, *args, extra_commands: tuple[str, ...] = (), **kwargs) -> None:
        self.extra_commands = tuple(extra_commands)  # read while the parser is built, inside LightningCLI's __init__
        super().__init__(*args, **kwargs)

    def _add_subcommands(self, parser, **kwargs) -> None:
        """Lightning's subcommands, then the usage line (set after them: argparse builds each subcommand's
        ``prog`` from the main usage, which would otherwise be repeated in ``fit --help``)."""
        super()._add_subcommands(parser, **kwargs)
        action = getattr(parser, "_subcommands_action", None)
        for sub in getattr(action, "_name_parser_map", {}).values():  # fit/validate/...: the classes a config names
            sub.description = f"{sub.description or ''}\n\n{MODEL_CLASSES_HELP}".strip()
        names = ",".join((*self.subcommands(), *self.extra_commands))
        parser.usage = f"python -m lit_rl [-h] [-c CONFIG] {{{names}}} ..."

    def _fit_components(self) -> dict[str, str]:
        """Every class the fit config chose under ``model`` and ``data`` (:func:`lit_rl.resume.components`)."""
        from lit_rl.resume import components

        return components(self.config["fit"])

    def _parse_ckpt_path(self) -> None:
        """LightningCLI loads an explicit ``ckpt_path`` here (for its hyper_parameters), before anything is
        built: a file that cannot be read is one :class:`~lit_rl.errors.CheckpointError` line naming it, not
        torch's ``PytorchStreamReader`` / ``EOFError`` traceback."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if ckpt_path and Path(ckpt_path).is_file():
            from lit_rl.resume import resolve_checkpoint

            resolve_checkpoint(ckpt_path, None)
        super()._parse_ckpt_path()

    def fit(self, model: LightningModule, datamodule: LightningDataModule | None = None, ckpt_path=None,
            **kwargs) -> None:
        """``trainer.fit`` after :func:`lit_rl.resume.prepare_resume`, with the run folder's MLflow runs recorded
        (:mod:`lit_rl.run_owner`); a stop by SIGTERM or Ctrl-C marks the MLflow run KILLED
        (:func:`lit_rl.resume.mark_stopped`). LightningCLI calls a method named after the subcommand in place of
        the trainer's."""
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from callbacks.resume import CheckpointOnSigterm
        from lit_rl.errors import ConfigError, FieldError
        from lit_rl.resume import mark_stopped, prepare_resume
        from lit_rl.run_owner import discard_empty, mark_orphans, record
        from lit_rl.runs import run_dir

        if ckpt_path is None and (self.config.get("fit") or {}).get("overwrite"):
            from lit_rl.config.rerun import clear_run
            from lit_rl.resume import checkpoint_dirs

            mark_orphans(self.trainer, run_dir(self.trainer))  # before its record goes: a killed run ends KILLED
            gone = clear_run(checkpoint_dirs(self.trainer), run_dir(self.trainer)) if self.trainer.is_global_zero \
                else []
            if gone:
                rank_zero_info(f"--overwrite: removed the earlier run's {', '.join(gone)}")
        ckpt_path = prepare_resume(self.trainer, model, datamodule, ckpt_path, kwargs.get("weights_only"),
                                   self._fit_components())
        new_run = not any(getattr(lg, "_run_id", None) for lg in self.trainer.loggers)  # not a continued one
        record(self.trainer, run_dir(self.trainer))
        stoppers = [cb for cb in self.trainer.callbacks if isinstance(cb, CheckpointOnSigterm)]
        try:
            self.trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)
        except (ConfigError, FieldError):  # refused while setting up (a data file): no empty FAILED run left
            if new_run and self.trainer.global_step == 0:
                discard_empty(self.trainer, run_dir(self.trainer))
            raise
        except SIGTERMException:
            label = next((cb.label for cb in stoppers if cb.requested), "SIGTERM")
            mark_stopped(self.trainer, f"{label} at step {self.trainer.global_step}; resume with --ckpt_path last")
            raise
        except SystemExit:  # Lightning's exit(1) after a KeyboardInterrupt
            if any(cb.forced for cb in stoppers):
                saved = any(cb.saved_path for cb in stoppers)
                mark_stopped(self.trainer, f"a second Ctrl-C at step {self.trainer.global_step}, "
                             + ("after last.ckpt was saved" if saved else "stopped without saving")
                             + "; resume with --ckpt_path last (from the last checkpoint)")
            raise
        summary = fit_summary(self.trainer)
        if summary:
            rank_zero_info(summary)

    def validate(self, model: LightningModule, datamodule: LightningDataModule | None = None, ckpt_path=None,
                 **kwargs):
        """``trainer.validate`` in an MLflow run marked as the checkpoint's evaluation, at its step
        (:mod:`lit_rl.eval_runs`)."""
        from lit_rl.eval_runs import mark_evaluation

        ckpt_path = mark_evaluation(self.trainer, "validate", ckpt_path)
        return self.trainer.validate(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)

    def test(self, model: LightningModule, datamodule: LightningDataModule | None = None, ckpt_path=None, **kwargs):
        """``trainer.test``, its MLflow run marked as :meth:`validate`'s."""
        from lit_rl.eval_runs import mark_evaluation

        ckpt_path = mark_evaluation(self.trainer, "test", ckpt_path)
        return self.trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:
            cause = user_facing_cause(err)
            if cause is None:
                raise
            raise cause from None

    def add_arguments_to_parser(self, parser) -> None:
        from lit_rl.config.rerun import OVERWRITE_HELP

        parser.add_argument("--threads", type=int | None, default=None,
                            help="torch CPU threads (default: torch's choice)")
        parser.add_argument("--overwrite", type=bool, default=False, help=OVERWRITE_HELP)

    def before_instantiate_classes(self) -> None:
        sub = self.config.get(self.subcommand) if self.subcommand else self.config
        threads = sub.get("threads") if sub else None
        if threads:
            torch.set_num_threads(int(threads))
        if self.subcommand == "predict" and sub is not None:
            sub.trainer.logger = False  # predict reads a run (its config, a checkpoint): no new tracking run

    def instantiate_trainer(self, **kwargs):
        """``predict`` writes the completions (:class:`callbacks.predictions.PredictionWriter`) unless the
        config already has a prediction writer; ``fit`` records the run in its checkpoints
        (:class:`callbacks.run_record.RunRecord`), saves and stops cleanly on SIGTERM and Ctrl-C
        (:class:`callbacks.resume.CheckpointOnSigterm`) and ends with a validation
        (:class:`callbacks.final_validation.FinalValidation`) unless the config already has them."""
        from lit_rl.config.trainer_rules import check_trainer_args
        from lit_rl.errors import ConfigError, FieldError

        trainer = super().instantiate_trainer(**kwargs)
        try:
            check_trainer_args(val_check_interval=trainer.val_check_interval)
        except FieldError as e:
            raise ConfigError(f"trainer.{e.field}: {e.problem}") from None
        resolve_checkpoint_dirs(trainer)
        if self.subcommand == "fit":
            from callbacks.run_record import RunRecord

            records = [cb for cb in trainer.callbacks if isinstance(cb, RunRecord)]
            if not records:
                trainer.callbacks.append(RunRecord())
                records = trainer.callbacks[-1:]
            for cb in records:
                cb.components = self._fit_components()
            from callbacks.resume import CheckpointOnSigterm

            if not any(isinstance(cb, CheckpointOnSigterm) for cb in trainer.callbacks):
                trainer.callbacks.append(CheckpointOnSigterm())  # Ctrl-C and SIGTERM save and exit cleanly
            from callbacks.final_validation import FinalValidation

            if not any(isinstance(cb, FinalValidation) for cb in trainer.callbacks):
                trainer.callbacks.append(FinalValidation())
        if self.subcommand == "predict":
            from lightning.pytorch.callbacks import BasePredictionWriter

            from callbacks.predictions import PredictionWriter

            if not any(isinstance(cb, BasePredictionWriter) for cb in trainer.callbacks):
                trainer.callbacks.append(PredictionWriter())
        return trainer


def fit_summary(trainer) -> str | None:
    """The line a fit ends with: its last step, the final evaluation's numbers (``val/*``, fractions) and where
    the run went; the progress bar cuts metric names short."""
    vals = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
    if not vals:
        return None
    shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(vals.items()))
    where = [f"run folder {trainer.default_root_dir}"]
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger) and logger._run_id:
            where.append(f"MLflow run {logger._run_id} ({logger._tracking_uri})")
    return f"fit ended at step {trainer.global_step}: {shown}; {'; '.join(where)}"


def resolve_checkpoint_dirs(trainer) -> None:
    """A ``ModelCheckpoint`` without ``dirpath`` saves to ``<trainer.default_root_dir>/checkpoints``, decided
    when the trainer is built so that ``--ckpt_path last`` finds the same folder (whatever the logger).
    Lightning's own default would be ``<default_root_dir>/<experiment id>/<run id>/checkpoints`` with MLflow,
    a new folder per run. So a sibling config that changes only ``trainer.default_root_dir`` needs no copy
    of the callback list."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
            cb.dirpath = os.path.realpath(os.path.join(str(trainer.default_root_dir), "checkpoints"))


class SaveConfigToRun(SaveConfigCallback):
    """Save the resolved config next to the run (MLflow runs have no local log_dir) and log it to MLflow."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["save_to_log_dir"] = False
        super().__init__(*args, **kwargs)

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit":  # validate / test / predict read a run's config: never overwrite it
            return
        # every rank computes the folder (trainer.log_dir would broadcast from rank-0-only code)
        self._run_dir = str(run_dir(trainer))
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer, pl_module, stage) -> None:
        os.makedirs(self._run_dir, exist_ok=True)
        path = os.path.join(self._run_dir, self.config_filename)
        self.parser.save(self.config, path, skip_none=False, overwrite=True, multifile=self.multifile)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_artifact(logger.run_id, path)
                log_run_params(logger, self.config)


def log_run_params(logger: MLFlowLogger, config) -> None:
    """The resolved config as flat MLflow params (:func:`lit_rl.run_params.flatten_config`); the config files,
    the git commit and the params that only name the run (its folder, run name: :func:`split_identity`) as
    tags. A resumed run (the same MLflow run, :mod:`lit_rl.resume`) whose config changed keeps its first values
    (MLflow refuses to change a param) and says which; ``ckpt_path``, which only says how this process started,
    is left as it was without a word."""
    from lightning.pytorch.utilities import rank_zero_warn
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    from lit_rl.run_params import flatten_config, git_state, split_identity

    raw = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    files = raw.pop("config", None) or []
    client, run_id = logger.experiment, logger.run_id
    try:
        logged = dict(client.get_run(run_id).data.params)  # empty for a new run
    except MlflowException:
        logged = {}
    flat, identity = split_identity(flatten_config(raw))
    flat = {k: v for k, v in sorted(flat.items()) if logged.get(k) != v}
    kept = [f"{k} ({logged[k]} -> {v})" for k, v in flat.items() if k in logged and k != "ckpt_path"]
    if kept:
        rank_zero_warn(f"MLflow run {run_id} continues with its first values of {len(kept)} changed param(s): "
                       + ", ".join(kept[:5]) + (" ..." if len(kept) > 5 else ""))
    params = [Param(k, v) for k, v in flat.items() if k not in logged]
    try:
        for i in range(0, len(params), 100):  # MLflow's batch limit
            client.log_batch(run_id, params=params[i : i + 100])
    except MlflowException as err:
        rank_zero_warn(f"MLflow params not (all) logged for run {run_id}: {str(err).splitlines()[0]}")
    tags = {"lit_rl.config_files": ", ".join(str(f) for f in files)[:5000], **git_state(Path(__file__).parent),
            **identity}
    for k, v in tags.items():
        client.set_tag(run_id, k, v)


#: (message regex, category, why it is benign for lit_rl): filtered in lit_rl's CLI process only
BENIGN_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    ("Using ModelCheckpoint with manual optimization and every_n_train_steps", UserWarning,
     "lit_rl's modules optimise manually and checkpoint the state after the update on purpose"),
    ("Your `IterableDataset` has `__len__` defined", UserWarning,
     "the prompt streams define __len__ for the progress bar and load in the main process (num_workers 0)"),
    ("Couldn't infer the batch indices fetched from your dataloader", UserWarning,
     "predict's writer (callbacks.predictions) writes the returned records in order and needs no batch indices"),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning,
     "raised inside Lightning's own pytree helper against newer torch, nothing a user can change"),
)


#: (logger name, message start, why it is benign for lit_rl): log records dropped in lit_rl's CLI process only
BENIGN_LOG_RECORDS: tuple[tuple[str, str, str], ...] = (
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging",
     "an advertisement for another logger, printed at every start whatever the logger configured"),
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community",
     "bitsandbytes falls back to its own CPU 4-bit kernel (the one the 4-bit tests run); printed on import "
     "even by runs that use no 4-bit layer"),
)


class _DropRecords:
    """A ``logging`` filter that drops the records of one logger whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not str(record.getMessage()).startswith(self.prefix)


def silence_benign_warnings() -> None:
    """Hide the known-benign warnings of :data:`BENIGN_WARNINGS` and log records of :data:`BENIGN_LOG_RECORDS`
    (exact messages; every other warning and record stays)."""
    import logging
    import warnings

    for message, category, _why in BENIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, prefix, _why in BENIGN_LOG_RECORDS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) and f.prefix == prefix for f in log.filters):
            log.addFilter(_DropRecords(prefix))


#: the shipped classes a config names under ``model`` / ``data`` (listed in --help without importing them: that
#: import alone takes ~3 s; ``--model.help CLASS`` shows one's arguments)
MODEL_CLASSES_HELP = (
    "Algorithms (model.class_path): lit_rl.algorithms.erils.ERILSModule, lit_rl.algorithms.double_rollout."
    "DoubleRolloutGRPO,\n  lit_rl.algorithms.denoising_sft.DenoisingSFT; data (data.class_path): "
    "datamodules.RolloutDataModule, datamodules.ar_rollouts.ARRolloutDataModule.\n  Their arguments: "
    "fit --model.help CLASS, fit --data.help CLASS."
)


def build_cli(args: list[str] | None, run: bool, extra_commands_help: str,
              extra_commands: tuple[str, ...] = ()) -> LitRLCLI:
    silence_benign_warnings()
    if "LIT_RL_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["LIT_RL_THREADS"]))
    from lit_rl.config.edits import expand_list_edits

    if args is None:  # LightningCLI reads sys.argv itself
        sys.argv[1:] = expand_list_edits(sys.argv[1:])
    elif isinstance(args, (list, tuple)):
        args = expand_list_edits(args)
    return LitRLCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=run,
        auto_configure_optimizers=False,
        save_config_callback=SaveConfigToRun,
        save_config_kwargs={"overwrite": True},
        extra_commands=extra_commands,
        parser_kwargs={
            "prog": "python -m lit_rl",
            "formatter_class": HelpFormatter,
            "description": "lit_rl: RL for language models with verifiable rewards (dLLM-ERILS, double-rollout GRPO).\n"
            "Other subcommands (python -m lit_rl <cmd> --help):\n" + extra_commands_help + "\n" + MODEL_CLASSES_HELP,
        },
    )
