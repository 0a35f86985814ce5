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
