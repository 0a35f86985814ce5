"""The memory estimate of the one-GPU recipes: its arithmetic by hand, its LoRA count against peft's own
adapters, and the recipes it names exist."""

from pathlib import Path

import pytest

from lit_rl.memory import GB, MODELS, RECIPES, ModelShape, estimate, lora_params, main

ROOT = Path(__file__).resolve().parents[1]


def test_lora_count_by_hand():
    toy = ModelShape("toy", 1000, layers=1, hidden=4, intermediate=8, kv_dim=2, vocab=10, tied=True)
    # q, o: 1 x (4 + 4) each; k, v: 1 x (4 + 2) each; gate, up: 1 x (4 + 8) each; down: 1 x (8 + 4)
    assert lora_params(toy, r=1) == 8 + 8 + 6 + 6 + 12 + 12 + 12
    assert lora_params(toy, r=2, mlp=False) == 2 * 28
    # LLaDA-8B at the paper's r 128: 335,544,320 adapter parameters (the recipe's comment)
    assert lora_params(MODELS["llada-8b"], r=128) == 335_544_320


def test_lora_count_matches_peft_on_a_real_llama():
    from lit_rl.models import LoraSettings
    from lit_rl.models.ar import TinyCausalLM

    policy = TinyCausalLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                          lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    counted = sum(p.numel() for n, p in policy.named_parameters() if "lora_" in n)
    shape = ModelShape("tiny", 0, layers=2, hidden=32, intermediate=64, kv_dim=32, vocab=len(policy.tokenizer),
                       tied=True)
    assert counted == lora_params(shape, r=4)


def test_estimate_by_hand():
    toy = ModelShape("toy", 1000, layers=2, hidden=4, intermediate=8, kv_dim=4, vocab=10, tied=True)
    full = estimate(toy, micro_batch_rows=1, seq_len=3)
    assert full.weights == 2000 and full.trainable_state == 12_000
    # checkpointed: 3 tokens x 4 x 2 bytes x 2 layers + one layer in full 3 x (40 + 16) x 2; logits 3 x 10 x 4 x 2
    assert full.activations == 48 + 336 + 240
    assert full.total == 2000 + 12_000 + 624
    q = estimate(toy, four_bit=True, lora_r=1, seq_len=3, gen_rows=2, gen_block=1, vllm_fraction=0.5, gpu_gib=1.0)
    assert q.weights == pytest.approx((1000 - 40) * (0.5 + 1 / 32) + 40 * 2)  # embeddings (tied: 10 x 4) stay bf16
    assert q.trainable_state == lora_params(toy, 1) * 16
    assert q.generation == 2 * 3 * 10 * 2 + 2 * 1 * 10 * 20 and q.vllm == 0.5 * GB
    # generation and the loss do not overlap: the larger one counts
    assert q.total == pytest.approx(q.weights + q.trainable_state + q.vllm + max(q.activations, q.generation))
    # scored 2 positions at a time: the logits term is 1 row x 2 x 10 x 4 x 2, the rest unchanged
    chunked = estimate(toy, micro_batch_rows=1, seq_len=3, logprob_chunk=2)
    assert full.activations - chunked.activations == (3 - 2) * 10 * 4 * 2
    assert estimate(toy, micro_batch_rows=1, seq_len=3, logprob_chunk=8).activations == full.activations


def test_recipes_exist_and_the_table_prints(capsys):
    for config in RECIPES:
        assert (ROOT / config).exists(), config
        assert "python -m lit_rl.memory" in (ROOT / config).read_text()  # the config cites the estimate
    assert main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| recipe") and out[-1].startswith("[{")
