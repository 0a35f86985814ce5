"""A PretrainedCausalLM (a checkpoint folder with its own HF tokenizer and untied lm_head) with LoRA on vLLM: the
DataModule's factory call starts the engine from the policy's path, tokenizer included, and pushes merged
adapters; checked through the log-probs of the same samples (the tiny chat model's next-token distribution is nearly
uniform by design, so greedy rows would compare near-ties)."""

import torch

from lit_rl.generation.ar import VLLMBackend
from lit_rl.models import LoraSettings
from lit_rl.models.ar import PretrainedCausalLM

from support.tiny_chat_model import write_tiny_chat_model
from support.vllm_policies import ENGINE, logprob_gap


def test_a_pretrained_lora_policy_starts_the_engine_from_its_path_and_pushes_merged_adapters(tmp_path):
    path = write_tiny_chat_model(tmp_path / "chat", mean_tokens=8.0)
    policy = PretrainedCausalLM(str(path), dtype="float32", lora=LoraSettings(r=4, alpha=8, dropout=0.0)).eval()
    engine = VLLMBackend(policy, dtype="float32", **ENGINE)
    try:
        assert engine.model_path == str(path)  # no export: the checkpoint the policy was loaded from
        assert engine.eos_id == policy.eos_id
        assert engine.llm.get_tokenizer() is not None  # started with the folder's tokenizer
        ids, mask = policy.encode_prompts([[{"role": "user", "content": "Sum: 3 4 5"}],
                                           [{"role": "user", "content": "Solve the puzzle"}]], 32)
        gap = logprob_gap(engine, policy, ids, mask, max_new_tokens=12, seed=4)
        assert gap[0] < 1e-3  # lora_B = 0 at init: the base model
        with torch.no_grad():  # train the adapters "a lot": the policy now differs from the checkpoint on disk
            g = torch.Generator().manual_seed(0)
            for n, p in policy.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        stale = logprob_gap(engine, policy, ids, mask, max_new_tokens=12, seed=4)
        engine.push_weights(policy)
        fresh = logprob_gap(engine, policy, ids, mask, max_new_tokens=12, seed=4)
        print(f"log-prob |diff| before the push: max {stale[0]:.3f}; after: max {fresh[0]:.2e} mean {fresh[1]:.2e}")
        assert stale[0] > 0.05 and fresh[0] < 1e-3
    finally:
        engine.close()
