"""The ``python -m lit_rl`` command line.

``fit`` / ``validate`` / ``test`` are a LightningCLI (model and data classes chosen with ``class_path`` in
YAML, ``--help`` from docstrings); the other subcommands are plain programs dispatched before it:

* ``score``     score existing generation files with a task's evaluation or reward rules;
* ``rollouts``  external rollout pools (``build``, ``stats``, ``scripted``);
* ``sweep``     Optuna studies over config keys, linked to MLflow;
* ``report``    comparison plots and tables from the MLflow store;
* ``export``    LoRA adapters in PEFT format and merged models from a checkpoint.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "score": ("lit_rl.score", "Score generation files (d1 JSON or lit_rl JSONL) with a task's eval/reward rules."),
    "rollouts": ("lit_rl.rollouts.cli", "Build or inspect external rollout pools."),
    "sweep": ("lit_rl.sweep", "Optuna sweep over any config key (TPE or grid), one MLflow parent run per study."),
    "report": ("lit_rl.report", "Compare MLflow runs: learning curves, per-source curves, Pareto points, sweep plots."),
    "export": ("lit_rl.models.cli", "Export LoRA adapters (PEFT format) and a merged model from a training checkpoint."),
}


def _set_threads() -> None:
    """Sensible CPU threading: with 2 cores, busy-waiting OpenMP threads next to another busy process
    ran ~40x slower (measured), so make idle threads sleep unless the user chose otherwise."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_lightning_cli(args: list[str] | None = None, run: bool = True):
    """Build the LightningCLI (``fit``, ``validate``, ``test``)."""
    import torch
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
    from lightning.pytorch.loggers import MLFlowLogger

    from lit_rl.runs import run_dir

    if "LIT_RL_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["LIT_RL_THREADS"]))

    class LitRLCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:  # noqa: D401
            parser.add_argument("--threads", type=int | None, default=None, help="torch CPU threads (default: torch's choice)")

        def before_instantiate_classes(self) -> None:
            sub = self.config.get(self.subcommand) if self.subcommand else self.config
            threads = sub.get("threads") if sub else None
            if threads:
                torch.set_num_threads(int(threads))

    class SaveConfigToRun(SaveConfigCallback):
        """Save the resolved config next to the run (MLflow runs have no local log_dir) and log it to MLflow."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs["save_to_log_dir"] = False
            super().__init__(*args, **kwargs)

        def setup(self, trainer, pl_module, stage) -> None:
            self._run_dir = str(run_dir(trainer))
            super().setup(trainer, pl_module, stage)

        def save_config(self, trainer, pl_module, stage) -> None:
            run_dir = self._run_dir
            os.makedirs(run_dir, exist_ok=True)
            path = os.path.join(run_dir, self.config_filename)
            self.parser.save(self.config, path, skip_none=False, overwrite=True, multifile=self.multifile)
            for logger in trainer.loggers:
                if isinstance(logger, MLFlowLogger):
                    logger.experiment.log_artifact(logger.run_id, path)

    extra = "\n".join(f"  {name:<10} {desc}" for name, (_, desc) in EXTRA_COMMANDS.items())
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
        parser_kwargs={
            "description": "lit_rl: RL for language models with verifiable rewards (dLLM-ERILS, double-rollout GRPO).\n"
            "Other subcommands (python -m lit_rl <cmd> --help):\n" + extra,
        },
    )


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    _set_threads()
    if argv and argv[0] in EXTRA_COMMANDS:
        import importlib

        module = importlib.import_module(EXTRA_COMMANDS[argv[0]][0])
        entry: Callable[[list[str]], int] = module.main
        return int(entry(argv[1:]) or 0)
    if argv and argv[0] in ("fit", "validate", "test"):
        # fail fast, before anything is built, with one line naming the field, file and line
        from lit_rl.reliability import ConfigError, preflight

        try:
            preflight(argv)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    run_lightning_cli(None if from_command_line else argv)
    return 0
