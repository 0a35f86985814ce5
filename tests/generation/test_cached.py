"""Tests for lit_rl.generation.cached (block KV cache, threshold decoding); the KV stack's refresh and window alone
are tested in test_kv_stack.py (which imports the tiny models here), DecodeSettings in test_settings.py."""

import pytest
import torch

from lit_rl.generation.cached import DecodeStats, cached_diffusion_generate
from lit_rl.generation.diffusion import diffusion_generate, position_ids_from_attention_mask
from lit_rl.generation.kv_stack import kv_stack_for
from lit_rl.generation.settings import DecodeSettings
from lit_rl.models import LoraSettings, TinyDiffusionLM

MASK = 1  # not used by the raw models below except as the [MASK] id


def _tiny_dream(layers=2):
    from transformers import Qwen2Config

    from lit_rl.models.dream import NativeDreamModel

    config = Qwen2Config(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, use_sliding_window=False, use_cache=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return NativeDreamModel(config).eval()


def _tiny_llada_gqa(layers=2):
    from lit_rl.models.llada import NativeLLaDAConfig, NativeLLaDAModel

    config = NativeLLaDAConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=layers, mlp_hidden_size=64, vocab_size=48,
                               embedding_size=48, max_sequence_length=128, rope_theta=10000.0, mask_token_id=MASK)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return NativeLLaDAModel(config).eval()


def _tiny_bert(layers=2):
    return TinyDiffusionLM(hidden_size=32, num_layers=layers, num_heads=4, intermediate_size=64, seed=0).model.eval()


MODELS = {"bert": _tiny_bert, "llada_gqa": _tiny_llada_gqa, "dream": _tiny_dream}


def _model_fn(model, shift):
    """The policy's forward contract: logits (B, T, V), Dream's shifted one position right."""

    def fn(ids, mask):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)).logits
        return torch.cat([logits[:, :1], logits[:, :-1]], 1) if shift else logits

    return fn


def _prompts(B=3, P=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.long)
    mask[0, :3] = 0  # left padding of different widths
    mask[1, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


KW = dict(gen_length=32, block_length=8, steps=16, mask_id=MASK)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_uncached_loop_is_the_reference_decoder(temperature):
    # cache "none" in the per-row loop draws the same noise in the same order: identical tokens at any T
    model = _tiny_bert()
    fn = _model_fn(model, 0)
    ids, mask = _prompts()
    ref = diffusion_generate(fn, ids, mask, temperature=temperature, generator=torch.Generator().manual_seed(5), **KW)
    out = cached_diffusion_generate(ids, mask, model_fn=fn, cache="none", temperature=temperature,
                                    generator=torch.Generator().manual_seed(5), **KW)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refreshing_every_step_is_exact(name, cache):
    model = MODELS[name]()
    shift = kv_stack_for(model).shift
    ids, mask = _prompts()
    ref = diffusion_generate(_model_fn(model, shift), ids, mask, temperature=0.0, **KW)
    out = cached_diffusion_generate(ids, mask, stack=kv_stack_for(model), cache=cache, refresh_every=1,
                                    temperature=0.0, **KW)
    assert torch.equal(out, ref)


def test_forward_token_counts_by_hand():
    # B 3, P 7, L 32, blocks of 8, 16 steps -> 4 steps per block; T = 39
    # exact: 16 steps x 39 = 624 per row; dual: per block one refresh (39) + 3 block-only steps (8) = 63, x 4
    # blocks = 252 per row; prefix: 4 x 39 + 3 x (32 + 24 + 16 + 8) = 156 + 240 = 396 per row;
    # dual refreshing every 2 steps: per block 2 x 39 + 2 x 8 = 94, x 4 = 376 per row
    model = _tiny_bert()
    ids, mask = _prompts()
    expected = {("none", None): 624, ("dual", None): 252, ("prefix", None): 396, ("dual", 2): 376}
    for (cache, every), per_row in expected.items():
        stats = DecodeStats()
        out = cached_diffusion_generate(ids, mask, model_fn=_model_fn(model, 0), stack=kv_stack_for(model), cache=cache,
                                        refresh_every=every, temperature=0.0, stats=stats, **KW)
        assert stats.forward_tokens == 3 * per_row, (cache, every)
        assert stats.steps == 16 and stats.row_forwards == 48
        assert not (out[:, 7:] == MASK).any()


def test_stale_cache_changes_tokens_on_a_random_model():
    # the cache is really used: without refreshes a random model's choices drift from the exact decoder
    model = _tiny_llada_gqa()
    ids, mask = _prompts()
    ref = diffusion_generate(_model_fn(model, 0), ids, mask, temperature=0.0, **KW)
    out = cached_diffusion_generate(ids, mask, stack=kv_stack_for(model), cache="dual", temperature=0.0, **KW)
    assert not torch.equal(out, ref)
    assert not (out == MASK).any()


class ConfidentRow:
    """Row 0 is certain of token 7 everywhere; the other rows see nearly flat logits (V 16)."""

    def __call__(self, ids, attn):
        B, T = ids.shape
        logits = torch.linspace(0, 0.1, 16).expand(B, T, 16).clone()
        sure = ids[:, :1] == 3  # row 0's prompt starts with 3
        logits[sure[:, 0], :, 7] = 50.0
        return logits


def test_threshold_reveals_confident_positions_together_and_rows_progress_independently():
    ids = torch.tensor([[3, 4], [5, 4]])
    mask = torch.ones(2, 2, dtype=torch.long)
    stats = DecodeStats()
    out = cached_diffusion_generate(ids, mask, model_fn=ConfidentRow(), cache="none", threshold=0.9, temperature=0.0,
                                    gen_length=16, block_length=8, steps=16, mask_id=15, stats=stats)
    # row 0: each block in one step (2 forwards); row 1: nothing reaches 0.9, so one token per step (16)
    assert stats.row_forwards == 2 + 16
    assert stats.steps == 16
    assert out[0, 2:].tolist() == [7] * 16
    assert not (out == 15).any()


def test_threshold_with_the_schedule_as_floor_never_needs_more_passes_than_steps():
    ids = torch.tensor([[3, 4], [5, 4]])
    mask = torch.ones(2, 2, dtype=torch.long)
    stats = DecodeStats()
    out = cached_diffusion_generate(ids, mask, model_fn=ConfidentRow(), cache="none", threshold=0.9, temperature=0.0,
                                    threshold_floor="schedule", gen_length=16, block_length=8, steps=4, mask_id=15,
                                    stats=stats)
    # steps 4 over 2 blocks: the schedule reveals 4 + 4 per block. Row 0 is sure of all 8: one pass per block;
    # row 1 passes nothing, so the schedule's 4 per step: 2 passes per block (the floor "one" would take 16)
    assert stats.row_forwards == 2 + 4
    assert stats.revealed == 32
    assert out[0, 2:].tolist() == [7] * 16
    assert not (out == 15).any()
    with pytest.raises(ValueError, match="threshold_floor"):
        cached_diffusion_generate(ids, mask, model_fn=ConfidentRow(), cache="none", threshold=0.9,
                                  threshold_floor="two", temperature=0.0, gen_length=16, block_length=8, steps=4,
                                  mask_id=15)


class PartlySure:
    """Sure of token 7 at the first 5 positions of each 8-position block after a 2-token prompt (V 16)."""

    def __call__(self, ids, attn):
        B, T = ids.shape
        logits = torch.linspace(0, 0.1, 16).expand(B, T, 16).clone()
        sure = (torch.arange(T) - 2) % 8 < 5
        sure[:2] = False
        logits[:, sure, 7] = 50.0
        return logits


def test_threshold_floor_stops_at_the_blocks_last_mask():
    # steps 4 over 2 blocks: schedule 4 + 4. The first step reveals the 5 sure positions (more than 4), so the
    # second step's floor (4) exceeds the 3 [MASK] left: it reveals those 3 and never rewrites a revealed token
    ids, mask = torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.long)
    stats = DecodeStats()
    out = cached_diffusion_generate(ids, mask, model_fn=PartlySure(), cache="none", threshold=0.9, temperature=0.0,
                                    threshold_floor="schedule", gen_length=16, block_length=8, steps=4, mask_id=15,
                                    stats=stats)
    assert not (out == 15).any()
    assert stats.row_forwards == 4 and stats.revealed == 16
    assert out[0, 2:7].tolist() == [7] * 5 and out[0, 10:15].tolist() == [7] * 5


def test_threshold_one_reveals_a_single_token_per_step_on_random_weights():
    # (on a confident model a float32 confidence can round to exactly 1.0 and pass tau 1.0)
    model = _tiny_bert()
    ids, mask = _prompts()
    stats = DecodeStats()
    cached_diffusion_generate(ids, mask, stack=kv_stack_for(model), cache="dual", threshold=1.0, temperature=0.0,
                              stats=stats, **KW)
    assert stats.steps == 32 and stats.refreshes == 3 * 4


def test_policy_generate_uses_the_cache_and_names_the_field_when_it_cannot():
    policy = TinyDiffusionLM(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=0,
                             lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    ids, mask = _prompts()
    exact = DecodeSettings(gen_length=16, block_length=8, steps=8, temperature=0.0)
    every = DecodeSettings(gen_length=16, block_length=8, steps=8, temperature=0.0, cache="dual", refresh_every=1)
    assert torch.equal(policy.generate(ids, mask, exact, 0), policy.generate(ids, mask, every, 0))  # through peft
    policy.model = torch.nn.Linear(2, 2)  # an architecture without an adapter
    from lit_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="generation.cache"):
        policy.generate(ids, mask, every, 0)


# With ONE layer the cache is exact: layer-0 keys/values depend only on each position's own token and position,
# and a cached position's token never changes before its next refresh (finished blocks are final, the masked
# suffix stays [MASK]). So every cached mode must reproduce the uncached tokens exactly, through the window
# path (the refresh_every=1 tests above never run it): a missing scatter of the window's fresh keys/values, a
# wrong window offset or a forgotten Dream shift all break this.
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_one_layer_cache_is_exact_through_the_window(name, cache):
    model = MODELS[name](layers=1)
    stack = kv_stack_for(model)
    fn = _model_fn(model, stack.shift)
    ids, mask = _prompts(B=4)
    ref = diffusion_generate(fn, ids, mask, temperature=0.0, **KW)
    stats = DecodeStats()
    out = cached_diffusion_generate(ids, mask, stack=stack, cache=cache, temperature=0.0, stats=stats, **KW)
    assert torch.equal(out, ref)
    assert stats.refreshes == 4 * 4  # once per row and block: the other 12 steps per row ran the window
    # threshold decoding: rows drift apart (some refresh while others run a window, the prefix window is shared
    # by rows at different block starts, finished rows leave): still the uncached threshold loop's tokens
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(60.0)  # a peaked head: some positions pass the threshold
    drifted = False
    for tau in (0.3, 0.6, 0.8):
        plain, cached = DecodeStats(), DecodeStats()
        a = cached_diffusion_generate(ids, mask, model_fn=fn, cache="none", threshold=tau, temperature=0.0,
                                      stats=plain, **KW)
        b = cached_diffusion_generate(ids, mask, stack=stack, cache=cache, threshold=tau, temperature=0.0,
                                      stats=cached, **KW)
        assert torch.equal(a, b), tau
        assert plain.row_forwards == cached.row_forwards
        drifted |= plain.row_forwards < 4 * plain.steps  # some rows finished before others
    assert drifted
