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
