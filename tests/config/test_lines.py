"""lit_rl/config/lines.py: the preflight's merged view of a command line, with each value's file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.config.lines import compose_files, parse_command_line
from lit_rl.errors import ConfigError

BASE = b"""trainer:
  max_steps: 8
  callbacks:
    - class_path: callbacks.RolloutTracker
    - class_path: callbacks.ExactResume
"""


def _write(path: Path, text: bytes) -> str:
    path.write_bytes(text)
    return str(path)


def test_an_overlay_appends_to_a_list_with_key_plus_and_each_item_keeps_its_line(tmp_path):
    base = _write(tmp_path / "base.yaml", BASE)
    over = _write(tmp_path / "over.yaml", b"""trainer:
  max_steps: 4
  callbacks+:
    - class_path: callbacks.PromptLedger
    - class_path: callbacks.passk.PassAtKEvaluation
      init_args:
        start_step: 3
""")
    sub, cfg = parse_command_line(["fit", "--config", base, "--config", over])
    cbs = cfg.data["trainer"]["callbacks"]
    assert sub == "fit" and cfg.data["trainer"]["max_steps"] == 4
    assert [c["class_path"] for c in cbs] == ["callbacks.RolloutTracker", "callbacks.ExactResume",
                                              "callbacks.PromptLedger", "callbacks.passk.PassAtKEvaluation"]
    assert "callbacks+" not in cfg.data["trainer"]
    assert cfg.loc(("trainer", "callbacks", 1)) == f"{base}:5"  # the base's items keep the base's lines
    assert cfg.loc(("trainer", "callbacks", 3, "init_args", "start_step")) == f"{over}:7"


def test_a_single_item_without_a_list_is_appended_and_a_missing_list_starts_empty(tmp_path):
    over = _write(tmp_path / "over.yaml", b"trainer:\n  callbacks+:\n    class_path: callbacks.PromptLedger\n")
    _, cfg = parse_command_line(["fit", "--config", _write(tmp_path / "base.yaml", BASE), "--config", over])
    assert [c["class_path"] for c in cfg.data["trainer"]["callbacks"]][-1] == "callbacks.PromptLedger"
    assert len(cfg.data["trainer"]["callbacks"]) == 3
    _, alone = parse_command_line(["fit", "--config", over])
    assert alone.data["trainer"]["callbacks"] == [{"class_path": "callbacks.PromptLedger"}]
    assert alone.loc(("trainer", "callbacks", 0, "class_path")) == f"{over}:3"


def test_an_appended_callbacks_bad_argument_is_reported_at_its_own_line(tmp_path):
    from lit_rl.config.preflight import preflight

    root = Path(__file__).resolve().parents[2]
    over = _write(tmp_path / "eval.yaml", b"""trainer:
  callbacks+:
    - class_path: callbacks.passk.PassAtKEvaluation
      init_args:
        every_n_steps: 4
        start_step: -3
""")
    where = rf"^{over}:6: trainer\.callbacks\[\d+\]\.init_args\.start_step: must be >= 0"
    with pytest.raises(ConfigError, match=where):
        preflight(["fit", "--config", str(root / "conf/erils.yaml"), "--config", over], data=False)


def test_one_file_that_sets_a_list_and_appends_to_it_is_refused(tmp_path):
    both = _write(tmp_path / "both.yaml", b"""trainer:
  callbacks:
    - class_path: callbacks.RolloutTracker
  callbacks+:
    - class_path: callbacks.PromptLedger
""")
    with pytest.raises(ConfigError, match=rf"^{both}:4: trainer\.callbacks\+: the same file also sets callbacks"):
        parse_command_line(["fit", "--config", _write(tmp_path / "base.yaml", BASE), "--config", both])


def test_an_overlay_edits_one_entry_by_class_with_key_tilde_and_keeps_the_rest_of_the_list(tmp_path):
    base = _write(tmp_path / "base.yaml", BASE + b"""    - class_path: callbacks.passk.PassAtKEvaluation
      init_args:
        every_n_steps: 20
        start_step: 20
        configs: [{name: a, num_samples: 4}]
""")
    over = _write(tmp_path / "over.yaml", b"""trainer:
  callbacks~:
    - class_path: PassAtKEvaluation
      init_args:
        start_step: 4
        configs: [{name: b, num_samples: 2}]
""")
    _, cfg = parse_command_line(["fit", "--config", base, "--config", over])
    cbs = cfg.data["trainer"]["callbacks"]
    assert [c["class_path"] for c in cbs] == ["callbacks.RolloutTracker", "callbacks.ExactResume",
                                              "callbacks.passk.PassAtKEvaluation"]  # the base's path is kept
    # merged key by key; a list inside (configs) is replaced, as everywhere
    assert cbs[2]["init_args"] == {"every_n_steps": 20, "start_step": 4, "configs": [{"name": "b", "num_samples": 2}]}
    assert "callbacks~" not in cfg.data["trainer"]
    assert cfg.loc(("trainer", "callbacks", 2, "init_args", "start_step")) == f"{over}:5"
    assert cfg.loc(("trainer", "callbacks", 2, "init_args", "every_n_steps")) == f"{base}:8"


@pytest.mark.parametrize("edit,problem", [
    (b"    - class_path: callbacks.PromptLedger\n", r"callbacks\.PromptLedger matches no entry of the base's"),
    (b"    - init_args: {steps: 3}\n", r"an edit names the entry it changes by its class_path"),
])
def test_an_edit_that_names_no_entry_is_refused_at_its_line(tmp_path, edit, problem):
    over = _write(tmp_path / "over.yaml", b"trainer:\n  callbacks~:\n" + edit)
    with pytest.raises(ConfigError, match=rf"^{over}:3: trainer\.callbacks~\[0\]: {problem}"):
        parse_command_line(["fit", "--config", _write(tmp_path / "base.yaml", BASE), "--config", over])


def test_an_edit_of_two_entries_of_one_class_needs_their_name(tmp_path):
    base = _write(tmp_path / "base.yaml", b"""trainer:
  callbacks:
    - {class_path: callbacks.PassAtKEvaluation, init_args: {name: first, start_step: 1}}
    - {class_path: callbacks.PassAtKEvaluation, init_args: {name: second, start_step: 2}}
""")
    over = _write(tmp_path / "over.yaml", b"trainer:\n  callbacks~:\n    - class_path: PassAtKEvaluation\n"
                                          b"      init_args: {start_step: 5}\n")
    with pytest.raises(ConfigError, match=r"matches 2 entries \(give init_args\.name to choose one\)"):
        parse_command_line(["fit", "--config", base, "--config", over])
    named = _write(tmp_path / "named.yaml", b"trainer:\n  callbacks~:\n    - class_path: PassAtKEvaluation\n"
                                            b"      init_args: {name: second, start_step: 5}\n")
    _, cfg = parse_command_line(["fit", "--config", base, "--config", named])
    assert [c["init_args"]["start_step"] for c in cfg.data["trainer"]["callbacks"]] == [1, 5]


def test_an_edit_without_a_base_list_or_next_to_a_set_list_is_refused(tmp_path):
    over = _write(tmp_path / "over.yaml", b"trainer:\n  callbacks~:\n    - class_path: callbacks.RolloutTracker\n")
    with pytest.raises(ConfigError, match=r"no earlier config sets trainer\.callbacks"):
        parse_command_line(["fit", "--config", over])
    both = _write(tmp_path / "both.yaml", b"trainer:\n  callbacks:\n    - class_path: callbacks.RolloutTracker\n"
                                         b"  callbacks~:\n    - class_path: callbacks.RolloutTracker\n")
    with pytest.raises(ConfigError, match=r"the same file also sets callbacks"):
        parse_command_line(["fit", "--config", _write(tmp_path / "base.yaml", BASE), "--config", both])


def test_one_file_edits_the_bases_entries_and_appends_to_the_list(tmp_path):
    """``callbacks~`` and ``callbacks+`` in one overlay (either order in the file): the edits change the base's entries,
    the appended items come after them, and a bad appended value is reported at its own line."""
    from lit_rl.config.preflight import preflight

    root = Path(__file__).resolve().parents[2]
    over = _write(tmp_path / "over.yaml", b"""trainer:
  callbacks+:
    - class_path: callbacks.PromptLedger
    - class_path: callbacks.passk.PassAtKEvaluation
      init_args: {name: extra, every_n_steps: 4, start_step: -1, configs: [{name: a}]}
  callbacks~:
    - class_path: callbacks.FormatWarmup
      init_args: {steps: 7}
""")
    base = compose_files([root / "conf/erils.yaml"]).data["trainer"]["callbacks"]
    _, cfg = parse_command_line(["fit", "--config", str(root / "conf/erils.yaml"), "--config", over])
    got = cfg.data["trainer"]["callbacks"]
    assert len(got) == len(base) + 2 and got[:len(base) - 1] == base[:-1]
    warm = got[len(base) - 1]
    assert warm["class_path"] == "callbacks.FormatWarmup" and warm["init_args"]["steps"] == 7
    assert [c["class_path"] for c in got[len(base):]] == ["callbacks.PromptLedger", "callbacks.passk.PassAtKEvaluation"]
    assert cfg.where[("trainer", "callbacks", len(base) + 1, "init_args", "start_step")] == f"{over}:5"
    with pytest.raises(ConfigError, match=rf"^{over}:5: trainer\.callbacks\[{len(base) + 1}\]\.init_args\.start_step"):
        preflight(["fit", "--config", str(root / "conf/erils.yaml"), "--config", over], data=False)


def test_an_edited_callbacks_bad_argument_is_reported_at_the_overlays_line(tmp_path):
    from lit_rl.config.preflight import preflight

    root = Path(__file__).resolve().parents[2]
    over = _write(tmp_path / "edit.yaml", b"""trainer:
  callbacks~:
    - class_path: callbacks.PassAtKEvaluation
      init_args:
        start_step: -3
""")
    where = rf"^{over}:5: trainer\.callbacks\[\d+\]\.init_args\.start_step: must be >= 0"
    with pytest.raises(ConfigError, match=where):
        preflight(["fit", "--config", str(root / "conf/erils.yaml"), "--config", over], data=False)
