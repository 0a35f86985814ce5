"""TRL-style reward callables, the registry and the shared Task API."""

import pytest

from lit_rl.tasks import CountdownTask, MathTask, SudokuTask, get_task, resolve_reward_funcs
from lit_rl.tasks.rewards import completion_text, zero_reward

CALLS = []


def length_penalty(prompts, completions, **kwargs):
    """A user reward in TRL's signature (used via its "module.attr" path below)."""
    CALLS.append(sorted(kwargs))
    return [-0.01 * len(completion_text(c)) for c in completions]


class Holder:
    @staticmethod
    def bonus(prompts, completions, **kwargs):
        return [0.5 for _ in completions]


def test_resolve_callables_and_strings():
    funcs = resolve_reward_funcs([length_penalty, f"{__name__}.length_penalty", f"{__name__}:Holder.bonus",
                                  "lit_rl.tasks.rewards.zero_reward"])
    assert funcs[0] is length_penalty and funcs[1] is length_penalty
    assert funcs[2]([None], ["x"]) == [0.5] and funcs[3] is zero_reward
    assert resolve_reward_funcs(None) == [] and resolve_reward_funcs(length_penalty) == [length_penalty]


@pytest.mark.parametrize(
    "spec, match",
    [("no_such_module_xyz.f", "cannot import"), ("lit_rl.tasks.rewards.nope", "no attribute"), ("nodots", "expected"),
     (42, "not callable")],
)
def test_resolve_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        resolve_reward_funcs([spec])


def test_total_reward_adds_extra_funcs():
    CALLS.clear()
    task = SudokuTask(num_train=0, reward_funcs=[f"{__name__}.length_penalty"])
    ex = task.eval_examples()[0]
    text = f"<answer>{ex.answer}</answer>"
    assert task.total_reward(text, ex) == pytest.approx(1.0 - 0.01 * len(text))
    assert CALLS == [["answer", "prompt_id", "puzzle", "solution"]]  # dataset columns as kwargs


def test_registry():
    assert isinstance(get_task("sudoku", num_train=0), SudokuTask)
    assert isinstance(get_task("countdown", num_train=0), CountdownTask)
    assert isinstance(get_task("math500"), MathTask) and isinstance(get_task("math"), MathTask)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("chess")
    assert [SudokuTask.max_reward, CountdownTask.max_reward, MathTask.max_reward] == [1.0, 1.0, 3.0]
    assert [SudokuTask.correct_reward, CountdownTask.correct_reward, MathTask.correct_reward] == [1.0, 1.0, 2.0]


def test_an_optional_package_missing_names_how_to_install_it(monkeypatch):
    import sys

    from lit_rl.tasks.rewards import import_object

    monkeypatch.setitem(sys.modules, "trl", None)  # as without trl installed (also when another test imported it)
    monkeypatch.setitem(sys.modules, "trl.rewards", None)
    with pytest.raises(ValueError, match=r"cannot import module 'trl.rewards' .*pip install trl \(lit_rl's dev extra"):
        import_object("trl.rewards.think_format_reward")
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ValueError, match=r"pip install 'lit-rl\[math\]'"):
        import_object("math_verify.verify")


@pytest.mark.parametrize("spec", ["examples.own_rewards:final_number", "examples.own_rewards.final_number"])
def test_a_reward_function_named_either_way_round_trips_through_a_saved_config(tmp_path, capsys, monkeypatch, spec):
    """docs/rewards.md's ``module:function`` form used to be saved as ``Unable to serialize instance ...``, and
    ``predict`` / ``validate`` / resume from that saved config failed; both forms are saved as written."""
    from pathlib import Path

    import yaml

    from lit_rl.cli import main

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    argv = ["fit", "--config", "conf/prompts.yaml", f"--data.init_args.task.init_args.reward_funcs=[{spec}]",
            "--data.init_args.task.init_args.reward_weights=[1.0]"]
    with pytest.raises(SystemExit):
        main([*argv, "--print_config"])
    saved = tmp_path / "config.yaml"
    saved.write_text(capsys.readouterr().out)
    assert yaml.safe_load(saved.read_text())["data"]["init_args"]["task"]["init_args"]["reward_funcs"] == [spec]
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(saved), "--print_config"])  # the saved config parses again, the same
    again = yaml.safe_load(capsys.readouterr().out)
    assert again["data"]["init_args"]["task"]["init_args"]["reward_funcs"] == [spec]
    from lit_rl.tasks import PromptTask

    task = PromptTask(train_path="data/prompts/sums_train.jsonl", reward_funcs=[spec])
    assert task.extra_reward_funcs[0].__name__ == "final_number"
