"""lit_rl.run_params: the resolved config as flat MLflow params, the git state."""

from pathlib import Path

from lit_rl.run_params import MAX_VALUE, flatten_config, git_state


def test_flatten_config_by_hand():
    cfg = {
        "model": {"class_path": "m.M", "init_args": {"lr": 0.001, "betas": [0.9, 0.99], "lora": None}},
        "trainer": {"callbacks": [{"class_path": "a.A"}, {"class_path": "b.B", "init_args": {"k": True}}],
                    "plugins": []},
        "odd key[1]": {},
    }
    assert flatten_config(cfg) == {
        "model.class_path": "m.M",
        "model.init_args.lr": "0.001",
        "model.init_args.betas.0": "0.9",
        "model.init_args.betas.1": "0.99",
        "model.init_args.lora": "null",
        "trainer.callbacks.0.class_path": "a.A",
        "trainer.callbacks.1.class_path": "b.B",
        "trainer.callbacks.1.init_args.k": "True",
        "trainer.plugins": "[]",
        "odd key_1_": "{}",  # brackets are not allowed in MLflow keys
    }


def test_long_values_are_cut_with_an_ellipsis():
    out = flatten_config({"prompt": "x" * 1000})
    assert len(out["prompt"]) == MAX_VALUE and out["prompt"].endswith("...")


def test_git_state_of_this_checkout_and_of_no_repository(tmp_path):
    state = git_state(Path(__file__).parent)
    if state:  # a clone; an sdist has no .git
        assert len(state["git.commit"]) == 40 and state["git.dirty"] in ("true", "false")
    assert git_state(tmp_path) == {}


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
