"""lit_rl/models/quantization.py: the guard against bitsandbytes' CPU weight packing, on the tiny remote-code LLaDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")

from lit_rl.models.quantization import disable_cpu_weight_packing, packed_layers  # noqa: E402
from support.pretrained import PROMPTS, eval_pass  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # the tiny 4-bit + LoRA policy of test_pretrained
from test_pretrained import BLOCK_TARGETS, build  # noqa: E402


def test_guard_unpacks_weights_that_were_already_packed(monkeypatch):
    monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: True)
    monkeypatch.setattr("lit_rl.models.quantization.disable_cpu_weight_packing", lambda model: 0)
    p = build()
    ids, mask = p.encode_prompts(PROMPTS)
    p.train()
    with torch.no_grad():
        before = p(ids, mask)
    eval_pass(p)
    assert packed_layers(p)
    monkeypatch.undo()
    from lit_rl.models import quantization

    assert quantization.disable_cpu_weight_packing(p) == 2 * len(BLOCK_TARGETS)
    assert packed_layers(p) == []
    with torch.no_grad():
        after = p(ids, mask)
    # absmax went through bfloat16 in the packed layout: equal up to that rounding
    torch.testing.assert_close(after, before, atol=0.05, rtol=0.05)


def test_disable_cpu_weight_packing_on_a_model_without_4bit_layers():
    assert disable_cpu_weight_packing(torch.nn.Linear(4, 4)) == 0

