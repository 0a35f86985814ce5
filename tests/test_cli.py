"""``python -m lit_rl``: the top-level usage names the command and every subcommand; a missing or unknown
subcommand is one error line listing them."""

from __future__ import annotations

import pytest

from lit_rl.cli import EXTRA_COMMANDS


def test_top_level_help_lists_predict_and_the_other_subcommands(capsys):
    from lit_rl.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "predict" in text and all(name in text for name in EXTRA_COMMANDS)
    # the usage line names the command users type and every subcommand; the description keeps one per line
    usage = text.splitlines()[0]
    assert usage.startswith("usage: python -m lit_rl ") and "__main__" not in usage
    assert all(name in usage for name in ("fit", "validate", "test", "predict", *EXTRA_COMMANDS))
    assert all(f"\n  {name}" in text for name in EXTRA_COMMANDS)
    with pytest.raises(SystemExit):  # a subcommand's own usage: the command and the subcommand, not the list
        main(["fit", "--help"])
    fit_usage = capsys.readouterr().out.splitlines()[0]
    assert fit_usage.startswith("usage: python -m lit_rl ") and " fit " in fit_usage and "reproduce" not in fit_usage


@pytest.mark.parametrize("argv, said", [([], "a subcommand is required"), (["fitt", "--config", "x.yaml"],
                                                                             "unknown subcommand 'fitt'")])
def test_a_missing_or_unknown_subcommand_lists_every_subcommand(argv, said, capsys):
    from lit_rl.cli import main

    assert main(argv) == 2
    usage, error = capsys.readouterr().err.splitlines()
    every = ("fit", "validate", "test", "predict", "score", "rollouts", "sweep", "report", "models", "export",
             "reproduce")
    assert usage == f"usage: python -m lit_rl {{{','.join(every)}}} ..."
    assert error.startswith(f"error: {said}: choose from {', '.join(every)}") and "reproduce" in error
