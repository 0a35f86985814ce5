"""TextPolicy: one set of text <-> ids helpers for both policy families."""

from __future__ import annotations

import torch

from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import TinyCausalLM
from lit_rl.models.text import TextPolicy

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64)


def test_both_policy_families_share_the_text_helpers():
    dllm, ar = TinyDiffusionLM(**TINY), TinyCausalLM(**TINY)
    assert isinstance(dllm, TextPolicy) and isinstance(ar, TextPolicy)
    for name in ("encode_prompts", "encode_completions", "completion_lengths", "decode_completions"):
        assert getattr(type(dllm), name) is getattr(type(ar), name) is getattr(TextPolicy, name)
    # same char tokenizer: the same ids; left padding; completions cut at the first EOS (EOS counted)
    msgs = [[{"role": "user", "content": "1234"}], [{"role": "user", "content": "12"}]]
    (ids_d, mask_d), (ids_a, mask_a) = dllm.encode_prompts(msgs), ar.encode_prompts(msgs)
    assert torch.equal(ids_d, ids_a) and torch.equal(mask_d, mask_a)
    assert mask_a[1].tolist()[:2] == [0, 0] and mask_a[0].all()  # the shorter prompt is padded on the left
    comp, lengths = ar.encode_completions(["ab", "abcdef"], 5)
    assert lengths.tolist() == [3, 5]  # "ab" + EOS; "abcdef" cut to 4 tokens + EOS (the EOS always fits)
    assert ar.completion_lengths(comp).tolist() == [3, 5]
    assert ar.decode_completions(comp) == ["ab", "abcd"]
