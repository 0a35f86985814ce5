"""lit_rl/lightning_cli.py: the known-benign warnings and log records that the CLI process hides, and only those."""


def test_benign_warnings_are_hidden_and_others_kept():
    import warnings

    from lit_rl.lightning_cli import BENIGN_WARNINGS, silence_benign_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence_benign_warnings()
        warnings.warn("Using ModelCheckpoint with manual optimization and every_n_train_steps, but no ...", UserWarning)
        warnings.warn("Your `IterableDataset` has `__len__` defined. In combination with ...", UserWarning)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("Couldn't infer the batch indices fetched from your dataloader: `DataLoader`", UserWarning)
        warnings.warn("a real problem", UserWarning)
    assert [str(w.message) for w in seen] == ["a real problem"]
    assert len(BENIGN_WARNINGS) == 4


def test_benign_log_records_are_dropped_and_others_kept(caplog):
    import logging

    from lit_rl.lightning_cli import BENIGN_LOG_RECORDS, silence_benign_warnings

    silence_benign_warnings()
    silence_benign_warnings()  # idempotent: one filter per logger
    with caplog.at_level(logging.INFO):
        for name, prefix, _ in BENIGN_LOG_RECORDS:
            logging.getLogger(name).warning(prefix + " ... the rest of the message")
            logging.getLogger(name).warning("something else from the same logger")
    assert [r.getMessage() for r in caplog.records] == ["something else from the same logger"] * len(BENIGN_LOG_RECORDS)
    assert all(len(logging.getLogger(n).filters) == 1 for n, _, _ in BENIGN_LOG_RECORDS)


def test_help_shows_docstrings_as_plain_text_and_names_the_algorithm_classes(capsys):
    import pytest

    from lit_rl.cli import main
    from lit_rl.lightning_cli import plain_text

    assert plain_text("see :class:`~lit_rl.loggers.MLFlowLogger` and :func:`lit_rl.resume.prepare_resume`, "
                      "``last.ckpt``") == "see MLFlowLogger and lit_rl.resume.prepare_resume, last.ckpt"
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:`" not in out and ":func:`" not in out  # 93 such marks before
    assert "lit_rl.algorithms.erils.ERILSModule" in out and "datamodules.ar_rollouts.ARRolloutDataModule" in out
