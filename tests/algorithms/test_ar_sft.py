"""lit_rl/algorithms/ar_sft.py: the causal LM's supervised warm start (completion-only next-token loss)."""

from __future__ import annotations

import random

import torch

from lit_rl.algorithms.ar_sft import completion_nll, scripted_sft, sft_batch
from lit_rl.models.ar import TinyCausalLM
from lit_rl.tasks import ChainSumTask


def _policy(seed: int = 0) -> TinyCausalLM:
    return TinyCausalLM(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=128,
                        seed=seed)


def _task() -> ChainSumTask:
    return ChainSumTask(num_train=20, num_eval=4, min_terms=3, max_terms=3, max_digit=5, seed=1)


def test_completion_nll_averages_the_masked_tokens_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.isclose(completion_nll(logp, mask), torch.tensor(7.0 / 3.0))  # (1 + 2 + 4) / 3
    assert completion_nll(logp, torch.zeros_like(mask)) == 0  # no valid token: 0, not nan


def test_sft_batch_lays_prompt_and_completion_out_as_rollouts_and_masks_up_to_the_eos():
    policy, task = _policy(), _task()
    examples = task.train_examples()[:3]
    texts = ["12", "1234567", ""]
    ids, attn, P, cmask = sft_batch(policy, task, examples, texts, None, 5)
    prompt_ids, prompt_mask = policy.encode_prompts([task.messages(e) for e in examples])
    assert P == prompt_ids.shape[1] and ids.shape == (3, P + 5) and cmask.shape == (3, 5)
    assert torch.equal(ids[:, :P], prompt_ids) and torch.equal(attn[:, :P], prompt_mask)
    assert bool(attn[:, P:].all())  # every completion position is attended
    # the completion's tokens up to and including its EOS; one cut at 5 keeps 4 tokens + EOS; "" is the EOS alone
    lengths = [len(policy.tokenizer("12", add_special_tokens=False)["input_ids"]) + 1, 5, 1]
    assert cmask.sum(1).tolist() == lengths
    assert [int(ids[i, P + n - 1]) for i, n in enumerate(lengths)] == [policy.eos_id] * 3


def test_scripted_sft_repeats_from_its_seed_and_learns_a_fixed_target():
    task = _task()
    examples = task.train_examples()

    def text(example, rng: random.Random) -> str:
        return "7"  # one fixed completion: a learnable target

    runs = []
    for _ in range(2):
        policy = _policy()
        first = scripted_sft(policy, task, examples, text, steps=1, lr=0.0, batch_size=4, max_completion_len=4)
        last = scripted_sft(policy, task, examples, text, steps=40, lr=0.01, batch_size=4, max_completion_len=4)
        runs.append((first, last, [p.detach().clone() for p in policy.parameters()]))
    (first, last, weights), (_, last2, weights2) = runs
    assert last < 0.2 * first  # the loss of the fixed target falls by more than 5x
    assert last == last2 and all(torch.equal(a, b) for a, b in zip(weights, weights2))  # same seed, same weights
