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
    from lit_rl.pools.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "\n\n" in text.split("options:")[0].split("\n", 2)[2]  # the description is not one run-on paragraph


def test_lightning_subcommands_take_the_hyphenated_spellings_too(capsys):
    """``fit --trainer.max-steps 7 --print-config`` is ``fit --trainer.max_steps 7 --print_config`` (they were
    refused); values keep their hyphens."""
    import yaml

    from lit_rl.cli import main, snake_case_flags

    assert snake_case_flags(["fit", "--ckpt-path", "a-b.ckpt", "--trainer.max-steps=7", "--x.y=a-b", "-1"]) == [
        "fit", "--ckpt_path", "a-b.ckpt", "--trainer.max_steps=7", "--x.y=a-b", "-1"]
    # a tags mapping's keys are keys, not options
    assert snake_case_flags(["--trainer.logger.init-args.tags.git-sha=a-b"]) == [
        "--trainer.logger.init_args.tags.git-sha=a-b"]
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", "conf/erils.yaml", "--trainer.max-steps", "7",
              "--trainer.default-root-dir", "runs/x-y", "--print-config"])
    assert exit_.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_steps"] == 7 and printed["trainer"]["default_root_dir"] == "runs/x-y"


@pytest.mark.parametrize("overlay, base", [
    ("conf/gpu/erils_llada8b_sudoku.yaml", "conf/paper/erils_sudoku.yaml"),
    ("conf/grpo_chainsum.yaml", "conf/double_rollout.yaml --config conf/double_rollout_chainsum.yaml"),
    ("conf/grpo_external.yaml", "conf/double_rollout.yaml --config conf/grpo.yaml"),  # a chain of bases
])
def test_an_overlay_alone_fails_with_one_line_naming_its_base(overlay, base, capsys):
    from lit_rl.cli import main

    assert main(["fit", "--config", overlay]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err == (
        f"error: {overlay}: no model.class_path in the configs given: it is an overlay; "
        f"put its base first: --config {base} --config {overlay}")
