"""One flag style for every ``python -m lit_rl`` subcommand: LightningCLI's ``--snake_case``.

``fit`` / ``validate`` / ``test`` / ``predict`` are LightningCLI (``--ckpt_path``, ``--trainer.max_steps``);
the other subcommands (``score``, ``rollouts``, ``sweep``, ``report``, ``export``, ``reproduce``) parse
with :class:`LitArgumentParser`, which spells every long option with underscores and still accepts the
hyphenated spelling (``--max-trials`` = ``--max_trials``) so older command lines keep working. Help keeps
the description's paragraphs and shows defaults.
"""

from __future__ import annotations

import argparse
from typing import Any


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Paragraphs of the description as written; ``(default: ...)`` after an option's help when it has a
    default worth saying (not ``None`` / ``False``, and not already in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            text and "default" not in text and default not in (None, False, argparse.SUPPRESS)
            and action.option_strings and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


class LitArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``--snake_case`` long options (hyphenated aliases accepted, not shown)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        canonical = [n[:2] + n[2:].replace("-", "_") if n.startswith("--") else n for n in names]
        action = super().add_argument(*canonical, **kwargs)
        aliases = [n[:2] + n[2:].replace("_", "-") for n in canonical if n.startswith("--") and "_" in n]
        for alias in aliases:  # the hyphenated spelling: same destination, hidden from --help
            self._option_string_actions[alias] = action
        return action
