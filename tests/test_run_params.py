"""lit_rl.run_params: the resolved config as flat MLflow params, the git state."""

from pathlib import Path

from lit_rl.run_params import MAX_VALUE, flatten_config, git_state, split_identity


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


def test_params_that_only_name_the_run_become_tags():
    flat = {"trainer.default_root_dir": "runs/sweeps/s/trial_3", "model.init_args.lr": "0.1",
            "trainer.callbacks.1.init_args.dirpath": "runs/sweeps/s/trial_3/checkpoints",
            "data.init_args.pool_path": "runs/sweeps/s/trial_30/pool.jsonl",  # another folder's: a param
            "trainer.logger.init_args.run_name": "s-trial-3", "trainer.logger.init_args.run_id": "abc"}
    params, tags = split_identity(flat)
    assert params == {"model.init_args.lr": "0.1", "data.init_args.pool_path": "runs/sweeps/s/trial_30/pool.jsonl"}
    assert tags == {"lit_rl.run.trainer.default_root_dir": "runs/sweeps/s/trial_3",
                    "lit_rl.run.trainer.callbacks.1.init_args.dirpath": "runs/sweeps/s/trial_3/checkpoints",
                    "lit_rl.run.trainer.logger.init_args.run_name": "s-trial-3",
                    "lit_rl.run.trainer.logger.init_args.run_id": "abc"}
    # no folder (null, or the working directory): nothing is "inside" it
    params, tags = split_identity({"trainer.default_root_dir": "null", "a": "null", "b": "./x"})
    assert params == {"a": "null", "b": "./x"} and list(tags) == ["lit_rl.run.trainer.default_root_dir"]
