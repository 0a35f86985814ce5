"""The vLLM benchmark scripts run on the real engine (their quick modes) and print what their docstrings promise."""

import json
from pathlib import Path

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    return load_script("benchmarks", name)


def test_ar_backends_quick_times_both_backends_side_by_side(capsys):
    summary = _load("ar_backends").main(["--quick"])
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == json.loads(json.dumps(summary))
    for side in ("hf", "vllm", "hf_beside_engine"):
        for stage in ("stage1", "stage2"):
            assert summary[f"{side}_{stage}_s"] > 0 and summary[f"{side}_{stage}_tokens"] > 0
    # B 2 x G 4 rows of <= 16 tokens; N 2 continuations of each with a budget of ceil(0.1 * 16) + 16 = 18
    assert summary["hf_stage1_tokens"] <= 2 * 4 * 16 and summary["vllm_stage2_tokens"] <= 2 * 4 * 2 * 18
    assert summary["continuation_budget"] == 18
    assert 0 < summary["vllm_prefix_cache_hit_frac"] < 1 and summary["vllm_push_s"] > 0
    assert any(line.startswith("DR continuations (N 2)") for line in out)


def test_double_rollout_cost_on_vllm_compares_the_prefix_cache_on_and_off(capsys):
    table = _load("double_rollout_cost").main(["--backend", "vllm", "--G", "2", "--T", "32", "--N", "4",
                                               "--repeats", "1"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["backend"] == "vllm" and len(table) == 5
    assert last["same_samples"] is True  # the cache changes the cost, not the samples (fp32, same seeds)
    assert 0 < last["prefix_cache_hit_frac"] < 1
