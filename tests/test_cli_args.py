"""One flag style: every subcommand spells long options ``--snake_case`` (LightningCLI's style) and still
accepts the hyphenated spelling; help keeps its paragraphs."""

from __future__ import annotations

import importlib

import pytest

from lit_rl.cli import EXTRA_COMMANDS
from lit_rl.cli_args import LitArgumentParser


def test_hyphenated_spellings_are_aliases_of_the_snake_case_option():
    p = LitArgumentParser(prog="x")
    p.add_argument("--max-trials", type=int, default=3)
    p.add_argument("--ckpt_path", "--ckpt")
    sub = p.add_subparsers(dest="cmd").add_parser("build")
    sub.add_argument("--no-progress", action="store_true")
    assert p.parse_args(["--max-trials", "5"]).max_trials == 5 == p.parse_args(["--max_trials", "5"]).max_trials
    assert p.parse_args(["--ckpt", "a"]).ckpt_path == "a" == p.parse_args(["--ckpt_path", "a"]).ckpt_path
    assert p.parse_args(["build", "--no-progress"]).no_progress and p.parse_args(["build", "--no_progress"]).no_progress
    usage = p.format_help()
    assert "--max_trials" in usage and "--max-trials" not in usage  # one spelling shown


@pytest.mark.parametrize("name", sorted(EXTRA_COMMANDS))
def test_every_subcommand_shows_snake_case_options_only(name, capsys):
    module = importlib.import_module(EXTRA_COMMANDS[name][0])
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    options = [w for w in text.replace(",", " ").split() if w.startswith("--") and len(w) > 2]
    assert options and not [o for o in options if "-" in o[2:].split("=")[0]], options


def test_help_keeps_the_descriptions_paragraphs(capsys):
    from lit_rl.rollouts.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "\n\n" in text.split("options:")[0].split("\n", 2)[2]  # the description is not one run-on paragraph


def test_top_level_help_lists_predict_and_the_other_subcommands(capsys):
    from lit_rl.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "predict" in text and all(name in text for name in EXTRA_COMMANDS)
