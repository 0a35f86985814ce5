"""lit_rl/memory.py's config reader: a training config read into the memory estimate (``python -m lit_rl.memory
--config``); the estimate's own arithmetic is in tests/test_memory.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rl.errors import ConfigError
from lit_rl.memory import MODELS, RECIPES, config_estimate, estimate, main, model_key

ROOT = Path(__file__).resolve().parents[1]


def test_model_names_map_to_their_shapes_and_unknown_ones_are_named():
    assert model_key("GSAI-ML/LLaDA-8B-Instruct") == "llada-8b" and model_key("smollm2-135m-instruct") == "smollm2-135m"
    assert model_key("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") == "qwen3-30b-a3b"
    with pytest.raises(ConfigError, match=r"does not know the model 'my/model' \(it knows .*llada-8b"):
        model_key("my/model")


def test_the_llada_recipe_read_from_its_config_is_the_recipe_table_row():
    """conf/gpu/erils_llada8b_sudoku.yaml on its paper base: the numbers the recipe table states by hand (NF4,
    LoRA r 128, 12 loss rows = 6 per micro-batch x SPG's 2 noisy copies, 456 tokens, 32 rows decoded at once)."""
    row = config_estimate([str(ROOT / "conf/paper/erils_sudoku.yaml"),
                           str(ROOT / "conf/gpu/erils_llada8b_sudoku.yaml")])
    kw = dict(RECIPES["conf/gpu/erils_llada8b_sudoku.yaml"])
    want = estimate(MODELS[kw.pop("model")], **kw).as_gib()
    assert (row["four_bit"], row["lora_r"], row["rows"], row["seq_len"], row["gen_rows"]) == (True, 128, 12, 456, 32)
    assert {k: row[k] for k in want} == want


def test_the_double_rollout_paper_config_fits_an_h200_not_an_80_gb_card_and_says_why():
    """bf16 Qwen3-30B-A3B on every DDP rank (56.8 GiB), one 34,816-token row scored 1,024 positions at a time,
    and a colocated vLLM at 0.45 of the card: on 80 GiB its own bf16 weights do not fit its share at tensor
    parallel 1; on an H200's 141 GiB they do, with a 6.6 GiB KV cache (48 layers x 512 x 2 x 2 bytes a token)."""
    row = config_estimate([str(ROOT / "conf/paper/double_rollout_math.yaml")])
    assert row["strategy"] == "ddp" and row["devices"] == 8 and not row["four_bit"]
    assert row["weights"] == pytest.approx(30.5e9 * 2 / 1024**3, abs=0.01) and row["vllm"] == 36.0
    assert row["total"] > 80 and any("exceed its share" in n for n in row["notes"])
    assert row["lora_mlp"] is False  # LoRA on the attention projections only (the experts stay frozen)
    # the loss's logits: 1 row x 1,024 positions x 151,936 x 4 bytes x 2 (and their gradient), not 34,816 of them
    assert row["logprob_chunk"] == 1024 and row["seq_len"] == 34816
    whole = estimate(MODELS["qwen3-30b-a3b"], lora_r=64, lora_mlp=False, micro_batch_rows=1, seq_len=34816)
    assert whole.activations / 1024**3 - row["activations"] == pytest.approx(
        (34816 - 1024) * 151936 * 8 / 1024**3, abs=0.01)
    h200 = config_estimate([str(ROOT / "conf/paper/double_rollout_math.yaml")], gpu_gib=141)
    assert h200["vllm"] == pytest.approx(0.45 * 141, abs=0.01) and h200["total"] < 141 - 2  # CUDA context
    kv = (0.45 * 141 - 30.5e9 * 2 / 1024**3) * 1024**3 / (48 * 512 * 2 * 2)
    assert any(f"{kv / 1e3:.0f}k tokens (96 KiB a token)" in n for n in h200["notes"]), h200["notes"]


def test_a_sharding_strategy_divides_weights_and_trainable_state(tmp_path):
    over = tmp_path / "fsdp.yaml"
    over.write_text("trainer:\n  strategy: fsdp\n  devices: 8\n")
    base = [str(ROOT / "conf/real/grpo_smollm2.yaml")]
    one, shard = config_estimate(base), config_estimate([*base, str(over)])
    assert shard["weights"] == pytest.approx(one["weights"] / 8, abs=0.01)
    assert shard["activations"] == one["activations"] and any("sharded over 8 GPUs" in n for n in shard["notes"])


def test_the_command_takes_help_and_a_config_and_refuses_a_tiny_model(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "--config FILE" in capsys.readouterr().out
    assert main(["--config", str(ROOT / "conf/real/grpo_smollm2.yaml")]) == 0
    out = capsys.readouterr().out
    assert "HuggingFaceTB/SmolLM2-135M-Instruct on 1 GPU(s)" in out and ": fits" in out
    assert main(["--config", str(ROOT / "conf/erils.yaml")]) == 2
    assert "is a tiny model built from its config" in capsys.readouterr().err
