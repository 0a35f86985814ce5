"""scripts/rollout_path.py: the path of one ERILS batch's rollouts through the code. Its point is the rollout
refactor's: the module is not consulted per batch (its stages were handed over at setup) and the sources do not
call back into the DataModule (they get a context), so the path enters the sources once."""

from __future__ import annotations

import json

from support.scripts import load_script  # noqa: E402


def test_an_erils_batch_enters_the_sources_once_and_never_the_module(capsys):
    out = load_script("scripts", "rollout_path").main(["--config", "conf/erils.yaml"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == out
    plumbing = out["plumbing"]
    assert plumbing[0] == "datamodules/stream.py" and "datamodules/sources.py" in plumbing
    assert "lit_rl/algorithms/rl_module.py" not in plumbing  # no trainer.lightning_module.rollout_stages() per batch
    # stream -> sources (every source's rows) -> stream: no sources -> stream call back (generation_seed, generator)
    assert out["crossings"] == 2 and plumbing.count("datamodules/sources.py") == 2, plumbing
    assert out["hops"] > out["plumbing_hops"] > 0 and out["files"] >= out["plumbing_files"]
