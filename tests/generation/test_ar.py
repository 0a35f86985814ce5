import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lit_rl.generation.ar import HFBackend, VLLMBackend, hit_budget, left_pad, merged_state_dict, sample_next
from lit_rl.models import LoraSettings
from lit_rl.models.ar import TinyCausalLM


def tiny(**kw) -> TinyCausalLM:
    args = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=128, seed=0)
    args.update(kw)
    return TinyCausalLM(**args).eval()


class EOSBias(nn.Module):
    """lm_head followed by +bias on the EOS logit: EOS becomes likely, so rows stop at varied steps."""

    def __init__(self, head: nn.Module, eos_id: int, bias: float) -> None:
        super().__init__()
        self.head, self.eos_id, self.bias = head, eos_id, bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.head(h)
        out[..., self.eos_id] += self.bias
        return out


class CallLog:
    """Wraps the HF model's forward and records each call's input shape."""

    def __init__(self, model: nn.Module) -> None:
        self.shapes: list[tuple[int, int]] = []
        inner = model.forward

        def forward(*args, **kwargs):
            self.shapes.append(tuple(kwargs["input_ids"].shape))
            return inner(*args, **kwargs)

        model.forward = forward

    @property
    def prefills(self) -> list[tuple[int, int]]:
        return [s for s in self.shapes if s[1] > 1]


PREFIXES = [[10, 11, 12], [13, 14, 15, 16, 17, 18], [19, 20]]  # unequal: exercises left padding


def prompts(p):
    return p.encode_prompts([[{"role": "user", "content": "12"}], [{"role": "user", "content": "12345"}]])


def test_generate_is_deterministic_per_seed_and_prompt_major():
    p = tiny()
    ids, mask = prompts(p)
    b = HFBackend(p)
    a1 = b.generate(ids, mask, max_new_tokens=12, n=3, seed=7)
    a2 = b.generate(ids, mask, max_new_tokens=12, n=3, seed=7)
    other = b.generate(ids, mask, max_new_tokens=12, n=3, seed=8)
    assert a1.shape == (6, 12)
    assert torch.equal(a1, a2)
    assert not torch.equal(a1, other)
    # prompt-major: rows 0-2 continue prompt 0. At T=0 the n samples of a prompt are identical.
    g = b.generate(ids, mask, max_new_tokens=12, n=3, temperature=0.0)
    assert torch.equal(g[0], g[1]) and torch.equal(g[1], g[2]) and torch.equal(g[3], g[5])
    assert torch.equal(g[::3], b.generate(ids, mask, max_new_tokens=12, n=1, temperature=0.0))


def test_rows_are_eos_filled_after_the_first_eos_and_generation_stops_early():
    p = tiny()
    p.model.lm_head = EOSBias(p.model.lm_head, p.eos_id, bias=4.0)
    log = CallLog(p.model)
    ids, mask = prompts(p)
    out = HFBackend(p).generate(ids, mask, max_new_tokens=40, n=8, seed=0)  # (16, 40)
    is_eos = out == p.eos_id
    first = is_eos.float().argmax(-1)  # (16,)
    assert is_eos.any(-1).all(), "with the EOS bias every row ends within 40 tokens for this seed"
    assert len(set(first.tolist())) > 1, "rows end at different steps"
    for row, f in zip(is_eos, first.tolist()):
        assert row[f:].all()
    # the loop stops once every row has ended: prefill + one step per generated column before that
    assert len(log.shapes) == int(first.max()) + 1 < 41


def test_max_new_tokens_and_per_prefix_budgets_are_respected():
    p = tiny()
    b = HFBackend(p)
    ids, mask = prompts(p)
    assert b.generate(ids, mask, max_new_tokens=5, n=2, seed=0).shape == (4, 5)
    log = CallLog(p.model)
    out = b.continue_from(PREFIXES, n=2, max_new_tokens=[2, 6, 4], seed=0)  # (6, 6)
    assert out.shape == (6, 6)
    assert len(log.shapes) <= 6  # never more forwards than the widest budget
    budgets = torch.tensor([2, 2, 6, 6, 4, 4])
    for row, budget in zip(out, budgets.tolist()):
        assert (row[budget:] == p.eos_id).all()
    cut = hit_budget(out, budgets, p.eos_id)  # the random tiny model rarely emits EOS
    assert cut.tolist() == [(r[:k] != p.eos_id).all().item() for r, k in zip(out, budgets.tolist())]
    with pytest.raises(ValueError, match="3 prefixes"):
        b.continue_from(PREFIXES, n=2, max_new_tokens=[2, 6])


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_shared_prefix_gives_the_samples_of_re_encoding_with_one_prefill_per_prefix(temperature):
    p = tiny()
    p.model.double()  # float64: the two paths then agree to ~1e-15, far below any sampling tie
    shared, again = HFBackend(p, share_prefix=True), HFBackend(p, share_prefix=False)
    log = CallLog(p.model)
    a = shared.continue_from(PREFIXES, n=4, max_new_tokens=[5, 9, 7], temperature=temperature, seed=11)
    shared_calls = list(log.shapes)
    log.shapes.clear()
    b = again.continue_from(PREFIXES, n=4, max_new_tokens=[5, 9, 7], temperature=temperature, seed=11)
    assert torch.equal(a, b)
    # shared: ONE prefill forward over the 3 prefixes (left-padded to 6), then 1-token steps on the
    # 12 rows, fewer once the rows with budget 5 and 7 have ended and are pruned
    assert [s for s in shared_calls if s[1] > 1] == [(3, 6)]
    assert [s[0] for s in shared_calls[1:]] == [12] * 4 + [8] * 2 + [4] * 2
    # re-encoding: the prefill runs over 3 x 4 = 12 rows
    assert log.prefills == [(12, 6)]


@pytest.mark.parametrize("prune", [0.0, 0.25])
def test_kv_cached_greedy_decoding_matches_full_recompute(prune):
    p = tiny()
    out = HFBackend(p, prune_finished=prune).continue_from(PREFIXES, n=1, max_new_tokens=[6, 2, 4], temperature=0.0)
    for prefix, row, budget in zip(PREFIXES, out, [6, 2, 4]):
        seq = list(prefix)
        for _ in range(6):  # no cache, no padding: argmax of the last position, one token at a time
            with torch.no_grad():
                logits = p(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
            seq.append(int(logits[0, -1].argmax()))
        assert row[:budget].tolist() == seq[len(prefix):len(prefix) + budget]


def test_top_p_nucleus_and_chunking():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    # a tiny nucleus keeps only the most likely token: top_p -> 0 is greedy
    assert sample_next(logits, 1.0, 1e-6, g).tolist() == [1, 0]
    p = tiny()
    whole = HFBackend(p).continue_from(PREFIXES, n=2, max_new_tokens=4, temperature=0.0)
    log = CallLog(p.model)
    chunked = HFBackend(p, max_rows=2).continue_from(PREFIXES, n=2, max_new_tokens=4, temperature=0.0)
    assert torch.equal(whole, chunked)
    assert log.prefills == [(1, 3), (1, 6), (1, 2)]  # one prefix (2 rows) per chunk


def test_backend_runs_a_lora_policy_and_restores_train_mode():
    p = tiny(lora=LoraSettings(r=4, alpha=8, dropout=0.1)).train()
    ids, mask = prompts(p)
    out = HFBackend(p).generate(ids, mask, max_new_tokens=4, n=2, seed=0)
    assert out.shape == (4, 4)
    assert p.model.training


def test_left_pad():
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


def test_hf_logprobs_are_the_trainers_values_of_the_same_samples():
    p = tiny()
    p.model.lm_head = EOSBias(p.model.lm_head, p.eos_id, bias=3.0)  # rows end at varied steps
    ids, mask = prompts(p)
    b = HFBackend(p)
    comp, lps = b.generate_with_logprobs(ids, mask, max_new_tokens=10, temperature=0.7, n=3, seed=5)
    assert torch.equal(comp, b.generate(ids, mask, max_new_tokens=10, temperature=0.7, n=3, seed=5))
    grp = torch.arange(2).repeat_interleave(3)
    full = torch.cat([ids[grp], comp], 1)  # (6, P + 10)
    with torch.no_grad():
        trainer = p.token_logprobs(full, torch.cat([mask[grp], torch.ones_like(comp)], 1), ids.shape[1], 0.7)
    lengths = p.completion_lengths(comp)  # EOS included
    live = torch.arange(10)[None, :] < lengths[:, None]  # (6, 10)
    assert 0 < int(live.sum()) < live.numel(), "some rows end before the budget"
    torch.testing.assert_close(lps[live], trainer[live], atol=1e-5, rtol=0)
    assert (lps[~live] == 0).all()
    # greedy: the unscaled log-softmax of the argmax token, at every position up to the row's end
    g, glp = b.generate_with_logprobs(ids, mask, max_new_tokens=10, temperature=0.0)
    with torch.no_grad():
        ref = p.token_logprobs(torch.cat([ids, g], 1), torch.cat([mask, torch.ones_like(g)], 1), ids.shape[1])
    live = torch.arange(10)[None, :] < p.completion_lengths(g)[:, None]
    torch.testing.assert_close(glp[live], ref[live], atol=1e-5, rtol=0)


def test_merged_state_dict_of_a_plain_model_is_its_state_dict():
    p = tiny()
    assert merged_state_dict(p.model).keys() == p.model.state_dict().keys()


def test_vllm_missing_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"lit-rl\[vllm\].*scripts/setup.sh vllm.*HFBackend"):
        VLLMBackend("m")



# -- VLLMBackend's own logic around the engine (the engine itself: tests/vllm_real, in .venv-vllm) ------------------
class _LP:
    def __init__(self, logprob):
        self.logprob = logprob


def _sample(index, tokens, finish, stop=None):
    """A vLLM CompletionOutput's fields: ``logprobs=0`` gives one dict per step holding the sampled token."""
    return SimpleNamespace(index=index, token_ids=tokens, finish_reason=finish, stop_reason=stop,
                           logprobs=[{t: _LP(-0.5 - k)} for k, t in enumerate(tokens)])


class _Engine:
    """Records the requests and returns scripted samples, out of order (the backend sorts them by index)."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        return [SimpleNamespace(outputs=[
            _sample(1, [60 + i, 99], "stop", 99),  # another stop token id: rewritten as our EOS (2)
            _sample(0, [50 + i, 2], "stop", None),  # our EOS itself
            _sample(2, [70 + i] * p.max_tokens, "length"),
        ]) for i, p in enumerate(params)]


def _backend():
    b = object.__new__(VLLMBackend)
    b.vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw))
    b.llm, b.eos_id, b.ignore_eos = _Engine(), 2, False
    return b


def test_vllm_rows_rewrite_other_stops_as_eos_and_mark_their_logprob_unknown():
    b = _backend()
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out, lps = b.generate_with_logprobs(ids, mask, max_new_tokens=4, temperature=0.7, n=3, seed=10)
    prompts, params = b.llm.calls[-1]
    assert prompts == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7, 8, 9, 10]}]  # padding stripped
    # seeds n apart: vLLM gives the j-th of n samples seed + j, so no two samples share a stream
    assert [p.seed for p in params] == [10, 13] and all(p.stop_token_ids == [2] and p.logprobs == 0 for p in params)
    assert out.tolist() == [[50, 2, 2, 2], [60, 2, 2, 2], [70, 70, 70, 70], [51, 2, 2, 2], [61, 2, 2, 2], [71] * 4]
    # the engine scored 99, not EOS, at the rewritten position: NaN there; 0 after each row's end
    assert lps[0].tolist() == [-0.5, -1.5, 0.0, 0.0] and lps[2].tolist() == [-0.5, -1.5, -2.5, -3.5]
    assert lps[1, 0].item() == -0.5 and torch.isnan(lps[1, 1]) and lps[1, 2:].tolist() == [0.0, 0.0]


def test_vllm_closed_backend_says_so():
    b = _backend()
    b._tmp = None
    b.close()
    b.close()  # idempotent
    with pytest.raises(RuntimeError, match="engine was closed"):
        b.generate(torch.tensor([[5]]), torch.tensor([[1]]), max_new_tokens=2)
