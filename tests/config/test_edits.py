"""lit_rl/config/edits.py: a command line's list edits (``callbacks~``) written out for jsonargparse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rl.config.edits import expand_list_edits, has_list_edit

ROOT = Path(__file__).resolve().parents[2]


def test_files_without_edits_pass_through_and_an_edit_becomes_the_whole_list(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("trainer:\n  callbacks:\n    - class_path: callbacks.RolloutTracker\n"
                    "    - {class_path: callbacks.FormatWarmup, init_args: {steps: 250, lr: 0.001}}\n")
    over = tmp_path / "over.yaml"
    over.write_text("trainer:\n  max_steps: 3\n  callbacks~:\n"
                    "    - {class_path: FormatWarmup, init_args: {steps: 5}}\n")
    argv = ["--config", str(base), f"--config={over}", "--trainer.max_steps=4"]
    out = expand_list_edits(argv)
    assert out[:2] == argv[:2] and out[3] == argv[3]  # the base and the flag, untouched
    expanded = Path(out[2].partition("=")[2])
    assert out[2].startswith("--config=") and expanded != over and expanded.name.endswith("over.yaml")
    assert yaml.safe_load(expanded.read_text()) == {"trainer": {"max_steps": 3, "callbacks": [
        {"class_path": "callbacks.RolloutTracker"},
        {"class_path": "callbacks.FormatWarmup", "init_args": {"steps": 5, "lr": 0.001}}]}}
    assert expand_list_edits(["--config", str(base)]) == ["--config", str(base)]
    assert has_list_edit({"a": [{"b": {"c~": 1}}]}) and not has_list_edit({"a+": [1]})


def test_fit_expands_an_overlays_edits_before_lightningcli_reads_them(capsys):
    """`python -m lit_rl fit` on conf/erils.yaml + conf/erils_countdown.yaml (an overlay that edits two callbacks):
    the resolved callback list is the base's, with the two edited."""
    from lit_rl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(ROOT / "conf/erils.yaml"), "--config", str(ROOT / "conf/erils_countdown.yaml"),
              "--print_config"])
    assert done.value.code in (0, None)
    cbs = yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]
    base = yaml.safe_load((ROOT / "conf/erils.yaml").read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in cbs] == [c["class_path"] for c in base]
    (warmup,) = [c["init_args"] for c in cbs if c["class_path"] == "callbacks.FormatWarmup"]
    assert (warmup["steps"], warmup["trace"], warmup["lr"]) == (1000, "trials", 0.001)
    (passk,) = [c["init_args"] for c in cbs if c["class_path"] == "callbacks.PassAtKEvaluation"]
    assert passk["configs"][0]["generation"]["gen_length"] == 64 and passk["start_step"] == 300


def test_a_changed_class_path_does_not_inherit_the_earlier_init_args(tmp_path, capsys):
    """The overlay the own-data issue found: conf/double_rollout.yaml's task switched to PromptTask kept Sudoku's
    ``question_template: "{puzzle}"`` (jsonargparse keeps arguments the new class accepts), so every prompt was
    the text ``{puzzle}``. Now the earlier init_args are dropped with one note naming them, and the resolved
    task has PromptTask's own defaults plus the overlay's."""
    from lit_rl.cli import main

    over = tmp_path / "own_data.yaml"
    over.write_text("data:\n  init_args:\n    task:\n      class_path: lit_rl.tasks.PromptTask\n      init_args:\n"
                    "        train_path: data/prompts/sums_train.jsonl\n"
                    "        eval_path: data/prompts/sums_eval.jsonl\n")
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(ROOT / "conf/double_rollout.yaml"), "--config", str(over), "--print_config"])
    assert done.value.code in (0, None)
    out = capsys.readouterr()
    task = yaml.safe_load(out.out)["data"]["init_args"]["task"]
    assert task["class_path"] == "lit_rl.tasks.PromptTask"
    assert task["init_args"]["question_template"] != "{puzzle}" and task["init_args"]["system_prompt"] is None
    assert task["init_args"]["train_path"] == "data/prompts/sums_train.jsonl"
    notes = [ln for ln in out.err.splitlines() if ln.startswith("note:")]
    assert notes == [f"note: {over}:4: data.init_args.task: class_path lit_rl.tasks.SudokuTask -> "
                     "lit_rl.tasks.PromptTask; the earlier config's init_args are not carried over: system_prompt, "
                     "question_template (the new class's defaults apply; set them under the new class, or list them "
                     "under inherit, to keep them)"], out.err[-2000:]  # num_train: PromptTask has none (not said)


def test_an_overlay_of_the_same_class_still_merges_its_arguments(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("model:\n  class_path: a.B\n  init_args: {x: 1, y: 2}\n")
    same = tmp_path / "same.yaml"
    same.write_text("model:\n  class_path: B\n  init_args: {y: 3}\n")  # the short name of the same class
    notes: list[str] = []
    assert expand_list_edits(["--config", str(base), "--config", str(same)], notes) == [
        "--config", str(base), "--config", str(same)] and notes == []
    other = tmp_path / "other.yaml"
    other.write_text("model:\n  class_path: a.C\n  init_args: {y: 3}\n")
    out = expand_list_edits(["--config", str(base), "--config", str(other)], notes)
    assert yaml.safe_load(Path(out[1]).read_text()) == {"model": {"class_path": "a.C"}} and out[3] == str(other)
    assert notes == [f"{other}:2: model: class_path a.B -> a.C; the earlier config's init_args are not carried "
                     "over: x (the new class's defaults apply; set them under the new class, or list them under "
                     "inherit, to keep them)"]  # a.C cannot be imported: every dropped argument is named
    keep = tmp_path / "keep.yaml"
    keep.write_text("model:\n  class_path: a.C\n  inherit: [x]\n  init_args: {y: 3}\n")
    notes.clear()
    out = expand_list_edits(["--config", str(base), "--config", str(keep)], notes)
    assert yaml.safe_load(Path(out[1]).read_text()) == {"model": {"class_path": "a.C", "init_args": {"x": 1}}}
    assert yaml.safe_load(Path(out[3]).read_text()) == {"model": {"class_path": "a.C", "init_args": {"y": 3}}}
    assert notes == []  # y given, x inherited: nothing dropped
