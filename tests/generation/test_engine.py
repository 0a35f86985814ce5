"""lit_rl/generation/engine.py: the one interface for what samples. The dLLM's engine decodes exactly as the
policy's own ``generate`` (``n`` copies prompt-major); the AR backends' ``sample`` is their ``generate`` with a
``SamplingSettings``; all three engines satisfy the protocol."""

from __future__ import annotations

import torch

from lit_rl.generation.ar import HFBackend, VLLMBackend
from lit_rl.generation.engine import DiffusionEngine, Engine
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import SamplingSettings, TinyCausalLM


def _prompts(policy, texts=("ab", "abc")):
    return policy.encode_prompts([[{"role": "user", "content": t}] for t in texts], 16)


def test_the_diffusion_engine_samples_as_the_policy_decodes_n_copies_prompt_major():
    torch.manual_seed(0)
    policy = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    ids, mask = _prompts(policy)
    gen = DecodeSettings(16, 8, 4, 1.0)
    engine = DiffusionEngine(policy, gen)
    assert isinstance(engine, Engine)
    got = engine.sample(ids, mask, gen, n=3, seed=11)  # (2*3, 16)
    want = policy.generate(ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), gen, 11)
    assert got.shape == (6, 16) and torch.equal(got, want)
    assert not torch.equal(got[0], got[1])  # three different draws of prompt 0 (temperature 1), then prompt 1's
    other = TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128)
    engine.sync(other)  # the engine runs the policy it is synced to
    assert engine.policy is other


def test_the_ar_backends_sample_is_their_generate_with_the_settings():
    policy = TinyCausalLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=128, seed=0)
    ids, mask = _prompts(policy)
    backend = HFBackend(policy)
    assert isinstance(backend, Engine)
    s = SamplingSettings(max_new_tokens=7, temperature=0.8, top_p=0.9)
    got = backend.sample(ids, mask, s, n=2, seed=5)
    want = backend.generate(ids, mask, max_new_tokens=7, temperature=0.8, top_p=0.9, n=2, seed=5)
    assert got.shape == (4, 7) and torch.equal(got, want)
    backend.sync(policy)  # HF shares the policy's modules: nothing changes
    assert torch.equal(backend.sample(ids, mask, s, n=2, seed=5), want)
    # vLLM's backend has the same three methods (the engine itself is met in tests/vllm_real)
    assert all(callable(getattr(VLLMBackend, m, None)) for m in ("sample", "continue_from", "sync"))
