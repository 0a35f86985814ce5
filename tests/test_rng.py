"""lit_rl.rng: one rule for random draws (draw where the generator lives, then move), checked on CPU under
a wrapper that enforces CUDA's rule, with outputs on ``meta``; and a source walk that finds no other draw."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from lit_rl import rng
from lit_rl.core.double_rollout import one_sided_replacement
from lit_rl.core.masks import mask_prompt_tokens, spg_block_masks, uniform_random_masks
from lit_rl.core.denoising import denoising_masks
from lit_rl.generation.ar import sample_next
from lit_rl.generation.diffusion import _choose_tokens

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lit_rl", "datamodules", "callbacks")
DRAWS = {
    "rand", "randn", "randint", "randperm", "multinomial", "bernoulli", "normal", "poisson",
    "rand_like", "randn_like", "randint_like",
    "exponential_", "uniform_", "normal_", "random_", "bernoulli_", "geometric_", "cauchy_", "log_normal_",
}


class CudaRuleViolation(RuntimeError):
    pass


def _check(generator, out: torch.Tensor, name: str) -> None:
    if generator is not None and generator.device.type != out.device.type:
        raise CudaRuleViolation(
            f"{name}: Expected a '{out.device.type}' device type for generator but found '{generator.device.type}'"
        )


@pytest.fixture
def cuda_rule(monkeypatch):
    """torch draws raise, as on CUDA, when the generator's device is not the output's."""
    for name in ("rand", "randn", "randint", "randperm"):
        orig = getattr(torch, name)

        def wrapped(*args, _orig=orig, _name=name, **kw):
            out = _orig(*args, **kw)
            _check(kw.get("generator"), out, _name)
            return out

        monkeypatch.setattr(torch, name, wrapped)
    orig_multinomial = torch.multinomial

    def multinomial(input, *args, **kw):
        out = orig_multinomial(input, *args, **kw)
        _check(kw.get("generator"), out, "multinomial")
        return out

    monkeypatch.setattr(torch, "multinomial", multinomial)
    for name in ("exponential_", "uniform_"):
        orig = getattr(torch.Tensor, name)

        def method(self, *args, _orig=orig, _name=name, **kw):
            _check(kw.get("generator"), self, _name)
            return _orig(self, *args, **kw)

        monkeypatch.setattr(torch.Tensor, name, method)


META = torch.device("meta")
PINNED_0 = 1786884285633530058  # derive_seed(0)
PINNED_MASKS = 3724208863957675064  # seed_for(42, Stream.MASKS, rank=0, step=3, row=1)


def test_the_wrapper_catches_a_cpu_generator_drawing_on_another_device(cuda_rule):
    with pytest.raises(CudaRuleViolation, match="generator"):
        torch.rand(3, generator=rng.cpu_generator(0), device=META)
    with pytest.raises(CudaRuleViolation):
        torch.empty(3, device=META).exponential_(generator=rng.cpu_generator(0))
    torch.rand(3, generator=rng.cpu_generator(0))  # same device: fine


def test_helpers_draw_on_the_generator_device_then_move(cuda_rule):
    g = rng.cpu_generator(5)
    assert rng.uniform((2, 3), generator=g, device=META).device == META
    assert rng.exponential((4,), generator=g, device=META).device == META
    assert rng.randint(0, 5, (3,), generator=g, device=META).device == META
    # the values are the CPU stream's, wherever they go
    expected = torch.rand(2, 3, generator=rng.cpu_generator(5))
    torch.testing.assert_close(rng.uniform((2, 3), generator=rng.cpu_generator(5)), expected)
    a = rng.exponential((6,), generator=rng.cpu_generator(1))
    b = torch.empty(6).exponential_(generator=rng.cpu_generator(1))
    torch.testing.assert_close(a, b)
    # a device generator for large noise draws where it lives
    assert rng.device_generator(0, "cpu").device.type == "cpu"
    # no generator: the output device's own stream (nothing drawn on CPU and copied)
    assert rng.uniform((2,), device=META).device == META


def test_pure_mask_and_sampling_functions_follow_the_rule(cuda_rule):
    # tensors on meta stand for CUDA; the generators are CPU ones (masks are drawn on CPU, then moved)
    cm = torch.ones(3, 8, dtype=torch.bool, device=META)
    g = rng.cpu_generator(0)
    m = spg_block_masks(cm, 4, 2, g, p_mask_clean=0.15)
    assert m.completion.device == META and m.loss.shape == (2, 3, 8)
    spg_block_masks(cm, 4, 3, g, block_choice="uniform", gen_width=6)
    uniform_random_masks(cm, 2, g, rule="count")
    uniform_random_masks(cm, 2, g, rule="bernoulli")
    mask_prompt_tokens(m, torch.ones(3, 5, dtype=torch.bool, device=META), 0.15, g)
    t, masked = denoising_masks(cm, g)
    assert t.device == META and masked.device == META
    flat = torch.zeros(4, 11, device=META)
    for sampler in ("gumbel", "inverse_cdf"):
        x0, _ = _choose_tokens(flat, 1.0, 3, sampler, g, torch.float64)
        assert x0.device == META
    assert sample_next(torch.zeros(4, 11, device=META), 1.0, 1.0, g).device == META
    cc = torch.ones(2, 3, dtype=torch.bool, device=META)
    one_sided_replacement(torch.ones(2, device=META), torch.zeros(2, dtype=torch.bool, device=META), cc, rule="random",
                          generator=g)


def _draw_calls(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not any(k.arg == "generator" for k in node.keywords):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in DRAWS:
            found.append((node.lineno, name))
    return found


def test_no_generator_draw_outside_the_helper():
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "lit_rl" / "rng.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: torch {name}(generator=...)"
                          for line, name in _draw_calls(path)]
    assert not offenders, "random draws must go through lit_rl.rng:\n" + "\n".join(offenders)
    # the walk does see draws: the helper itself has them
    assert {n for _, n in _draw_calls(ROOT / "lit_rl" / "rng.py")} >= {"rand", "randint", "exponential_"}


def test_seed_for_separates_streams_ranks_steps_and_rows():
    base = rng.seed_for(42, rng.Stream.MASKS, rank=0, step=3, row=1)
    others = {
        rng.seed_for(42, rng.Stream.GENERATION, rank=0, step=3, row=1),
        rng.seed_for(42, rng.Stream.MASKS, rank=1, step=3, row=1),
        rng.seed_for(42, rng.Stream.MASKS, rank=0, step=4, row=1),
        rng.seed_for(42, rng.Stream.MASKS, rank=0, step=3, row=2),
        rng.seed_for(43, rng.Stream.MASKS, rank=0, step=3, row=1),
    }
    assert base not in others and len(others) == 5
    assert base == rng.seed_for(42, rng.Stream.MASKS, rank=0, step=3, row=1)
    assert 0 <= base < 2**63
    # blake2b of the little-endian 64-bit parts: the same value on every machine and Python (pinned)
    assert rng.derive_seed(0) == PINNED_0
    assert base == PINNED_MASKS


def test_row_streams_give_each_row_its_own_generators_numbers_on_the_named_axis():
    from lit_rl.rng import RowStreams, cpu_generator, uniform

    streams = RowStreams.from_seeds([3, 4, 5])
    got = uniform((2, 3, 4), generator=streams, row_dim=1, dtype=torch.float64)  # (num_t, B, L)
    for i, seed in enumerate((3, 4, 5)):
        assert torch.equal(got[:, i:i + 1], torch.rand((2, 1, 4), generator=cpu_generator(seed), dtype=torch.float64))
    assert not torch.equal(got[:, 0], got[:, 1])
    with pytest.raises(ValueError, match="needs row_dim"):
        uniform((2, 3), generator=streams)
    with pytest.raises(ValueError, match="has 2 rows on axis 0, but the streams hold 3"):
        uniform((2, 3), generator=streams, row_dim=0)
