"""scripts/real_premise.py on the real model (skipped where it is not prepared): a few short samples, every count
consistent with the samples written out, and the lucky / slip / cut rules re-derived from them."""

from __future__ import annotations

import json

from support.real_model import prepared_or_skip
from support.scripts import load_script


def test_counts_agree_with_the_samples_it_writes(tmp_path, monkeypatch, capsys):
    import torch

    folder = prepared_or_skip()
    monkeypatch.setenv("LIT_RL_MODELS", str(folder.parent))
    out = tmp_path / "samples.jsonl"
    threads = torch.get_num_threads()  # the script sets its own; the rest of the suite keeps the suite's
    try:
        rc = load_script("scripts", "real_premise").main(["--problems", "3", "--samples", "2", "--max_new_tokens",
                                                          "24", "--threads", "1", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["samples"] == len(rows) == 6 and [r["id"] for r in rows[:2]] == ["word-eval-0"] * 2
    rewarded = [r for r in rows if r["reward"] == 1.0]
    assert summary["accuracy"] == round(len(rewarded) / 6, 4)
    assert summary["lucky"] == sum(r["verdict"] != "supported" for r in rewarded)
    assert summary["slips"] == sum(r["reward"] == 0.0 and r["verdict"] == "supported" for r in rows)
    assert sum(summary["cells"].values()) == 6
    for r in rows:
        assert 1 <= r["tokens"] <= 24 and r["cut"] == r["tokens"] // 2  # floor(rho T) at rho 0.5
        assert r["error_token"] is None or (r["verdict"] == "wrong" and 0 <= r["error_token"] <= r["tokens"])
