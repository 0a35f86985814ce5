"""Tests lit_rl/generation/kv_stack.py."""

import sys
from pathlib import Path

import pytest
import torch

from lit_rl.generation.diffusion import position_ids_from_attention_mask
from lit_rl.generation.kv_stack import KVCache, kv_stack_for

sys.path.insert(0, str(Path(__file__).parent))  # the tiny models and prompts of test_cached
from test_cached import MODELS, _model_fn, _prompts, _tiny_bert  # noqa: E402


@pytest.mark.parametrize("name", sorted(MODELS))
def test_refresh_and_window_reproduce_the_models_forward(name):
    model = MODELS[name]()
    stack = kv_stack_for(model)
    ids, mask = _prompts()
    ids = torch.cat([ids, torch.randint(5, 40, (3, 9))], 1)  # (3, 16) a partly decoded sequence
    mask = torch.cat([mask, torch.ones(3, 9, dtype=torch.long)], 1)
    pos = position_ids_from_attention_mask(mask)
    expected = _model_fn(model, 0)(ids, mask)  # (3, 16, V) unshifted
    kv = KVCache(batch=3)
    rows = torch.arange(3)
    with torch.no_grad():
        full = stack.head(stack.refresh(ids, pos, mask.bool(), kv, rows))
        # a window over unchanged tokens sees exactly the keys/values of the refresh: the same logits
        index = torch.arange(9, 14).expand(2, -1)  # rows 2 and 0 only, in that order
        sub = torch.tensor([2, 0])
        win = stack.head(stack.window(ids[sub].gather(1, index), pos[sub].gather(1, index), index,
                                      mask[sub].bool(), kv, sub))
    torch.testing.assert_close(full, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(win, expected[sub][:, 9:14], atol=2e-5, rtol=1e-5)
    assert stack.forward_tokens == 3 * 16 + 2 * 5


def test_window_uses_the_cached_keys_not_fresh_ones():
    # change a token outside the window after the refresh: the window's logits must not see it (stale cache),
    # while a full forward does
    model = _tiny_bert()
    stack = kv_stack_for(model)
    ids = torch.randint(5, 40, (1, 12))
    mask = torch.ones(1, 12, dtype=torch.long)
    pos = position_ids_from_attention_mask(mask)
    kv = KVCache(batch=1)
    rows = torch.arange(1)
    with torch.no_grad():
        before = stack.head(stack.refresh(ids, pos, mask.bool(), kv, rows))[:, 4:8]
        changed = ids.clone()
        changed[0, 8:12] = 41
        index = torch.arange(4, 8)[None]
        win = stack.head(stack.window(changed[:, 4:8], pos[:, 4:8], index, mask.bool(), kv, rows))
        fresh = _model_fn(model, 0)(changed, mask)[:, 4:8]
    stale_gap, fresh_gap = (win - before).abs().max(), (fresh - before).abs().max()
    assert stale_gap < 2e-5 and fresh_gap > 50 * stale_gap  # the window kept the refresh's keys


def test_one_layer_window_sees_its_own_fresh_tokens():
    # after a refresh, change tokens INSIDE the window: with one layer the window's logits must equal a full
    # forward of the changed sequence (they would not if the window attended to its stale cached keys)
    model = _tiny_bert(layers=1)
    stack = kv_stack_for(model)
    ids = torch.randint(5, 40, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    pos = position_ids_from_attention_mask(mask)
    kv = KVCache(batch=2)
    rows = torch.arange(2)
    with torch.no_grad():
        stack.refresh(ids, pos, mask.bool(), kv, rows)
        changed = ids.clone()
        changed[:, 5:7] = 41
        index = torch.arange(4, 8).expand(2, -1)
        win = stack.head(stack.window(changed[:, 4:8], pos[:, 4:8], index, mask.bool(), kv, rows))
        full = _model_fn(model, 0)(changed, mask)[:, 4:8]
    torch.testing.assert_close(win, full, atol=2e-5, rtol=1e-5)
