"""Shared by tests/vllm_real: engine settings for this CPU and a briefly trained chain-sum policy."""

import torch

# CPU: an explicit 128 MiB KV cache each, no compilation, 32-token blocks (the default 128 caches no short prefix)
ENGINE = dict(kv_cache_memory_bytes=128 << 20, enforce_eager=True, block_size=32)


def chainsum_policy(seed: int = 0, lora=None, steps: int = 60):
    """The chain-sum policy shape (head_dim 32: vLLM's CPU attention refuses 16), briefly trained by SFT on
    chain-sum traces so that its greedy completions are a trained model's, not a random one's near-ties."""
    import random

    from lit_rl.models.ar import TinyCausalLM
    from lit_rl.tasks import ChainSumTask
    from lit_rl.tasks.chainsum import chainsum_completion

    policy = TinyCausalLM(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_positions=128,
                          seed=seed, lora=lora)
    task = ChainSumTask(num_train=64, num_eval=16, min_terms=3, max_terms=4, max_digit=5, seed=seed)
    examples = list(task.train_examples())
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    policy.train()
    for step in range(steps):
        batch = examples[(step * 8) % len(examples):][:8]
        texts = [chainsum_completion(e, random.Random(step)) for e in batch]
        ids, mask = policy.encode_prompts([task.messages(e) for e in batch], 64)
        comp = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [policy.eos_id] for t in texts]
        width = max(map(len, comp))
        comp_ids = torch.tensor([c + [policy.eos_id] * (width - len(c)) for c in comp])
        full = torch.cat([ids, comp_ids], 1)
        lp = policy.token_logprobs(full, torch.cat([mask, torch.ones_like(comp_ids)], 1), ids.shape[1])
        valid = torch.arange(width)[None, :] < torch.tensor([len(c) for c in comp])[:, None]
        loss = -(lp * valid).sum() / valid.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return policy.eval(), task


def logprob_gap(engine, policy, ids, mask, n: int = 2, max_new_tokens: int = 40, seed: int = 0):
    """Sampler vs trainer on the engine's own samples at T 1: (max |diff|, mean |diff|, mean pi_trainer/pi_sampler)
    over every token up to and including each row's EOS."""
    comp, lps = engine.generate_with_logprobs(ids, mask, max_new_tokens=max_new_tokens, temperature=1.0, n=n,
                                              seed=seed)
    grp = torch.arange(ids.shape[0]).repeat_interleave(n)
    with torch.no_grad():
        trainer = policy.token_logprobs(torch.cat([ids[grp], comp], 1),
                                        torch.cat([mask[grp], torch.ones_like(comp)], 1), ids.shape[1])
    live = torch.arange(comp.shape[1])[None, :] < policy.completion_lengths(comp)[:, None]
    diff = (lps - trainer)[live].abs()
    return float(diff.max()), float(diff.mean()), float(torch.exp(trainer - lps)[live].mean())
