"""FSDP2 sharding of policies (:mod:`lit_rl.distributed`, :meth:`RLModule.configure_model`).

* The block finder picks each architecture's transformer blocks (tiny BERT and Llama, the LLaDA and Dream
  remote-code fixtures, peft-wrapped or not) and fails clearly where there are none.
* ``configure_model`` does nothing without a device mesh (DDP, one device).
* Two gloo ranks on CPU (``torch.multiprocessing``): the hook shards every weight (one unit per block +
  the root) and a second call changes nothing (tensor parallelism is refused, in-process); the NaN guard of
  ``optimizer_update`` skips on both ranks when only rank 1's gradient shard is NaN; and a 4-bit NF4
  LLaDA + LoRA with activation checkpointing shards and trains exactly like the unsharded model (fp32),
  and within bf16 rounding under the mixed-precision policy.

The 2-process CPU fit through the CLI is in ``tests/test_fsdp.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lit_rl.algorithms.erils import ERILSModule
from lit_rl.distributed import find_transformer_blocks
from lit_rl.models import TinyDiffusionLM
from lit_rl.models.ar import TinyCausalLM
from lit_rl.models.policy import LoraSettings, PretrainedDiffusionLM, QuantizationSettings

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=64)
LORA = LoraSettings(r=4, alpha=8, dropout=0.0)


def remote(name: str, quantized: bool = False, **kw) -> PretrainedDiffusionLM:
    return PretrainedDiffusionLM(
        str(ROOT / "tests/fixtures" / name), mask_id=None, eos_id=None, dtype="float32",
        logits_shift=name == "tiny_dream",
        quantization=QuantizationSettings(compute_dtype="float32") if quantized else None, **kw,
    )


# -- the block finder ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, blocks",
    [
        (lambda: TinyDiffusionLM(**TINY), "bert.encoder.layer"),
        (lambda: TinyDiffusionLM(**TINY, lora=LORA), "base_model.model.bert.encoder.layer"),
        (lambda: TinyCausalLM(**TINY), "model.layers"),
        (lambda: TinyCausalLM(**TINY, lora=LORA), "base_model.model.model.layers"),
        (lambda: remote("tiny_llada"), "model.transformer.blocks"),
        (lambda: remote("tiny_llada", quantized=True, lora=LORA), "base_model.model.model.transformer.blocks"),
        (lambda: remote("tiny_dream"), "model.layers"),
        (lambda: remote("tiny_dream", lora=LORA), "base_model.model.model.layers"),
    ],
    ids=["bert", "bert-lora", "llama", "llama-lora", "llada", "llada-4bit-lora", "dream", "dream-lora"],
)
def test_find_transformer_blocks(build, blocks):
    model = build().model
    found = find_transformer_blocks(model)
    want = list(model.get_submodule(blocks))
    assert len(want) == 2 and len(found) == len(want)
    assert all(a is b for a, b in zip(found, want))


def test_find_transformer_blocks_names_the_model_when_there_are_none():
    # a ModuleList of mixed classes is not a block stack
    model = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]))
    with pytest.raises(ValueError, match="FSDP2: found no transformer blocks in Sequential"):
        find_transformer_blocks(model)


def test_configure_model_does_nothing_without_a_device_mesh():
    module = ERILSModule(TinyDiffusionLM(**TINY))
    before = dict(module.named_parameters())
    module.configure_model()  # DDP / single device: no trainer needed, nothing sharded
    after = dict(module.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert not any(type(p).__name__ == "DTensor" for p in after.values())


class _FakeMesh:
    """A named device mesh's sizes, without processes."""

    def __init__(self, **sizes: int) -> None:
        self.sizes, self.mesh_dim_names = sizes, tuple(sizes)

    def __getitem__(self, name: str):
        return SimpleNamespace(size=lambda: self.sizes[name])


def test_configure_model_refuses_tensor_parallelism():
    module = ERILSModule(TinyDiffusionLM(**TINY))
    module._trainer = SimpleNamespace(precision="32-true")
    module._device_mesh = _FakeMesh(data_parallel=1, tensor_parallel=2)
    with pytest.raises(ValueError, match="set trainer.strategy.init_args.tensor_parallel_size: 1"):
        module.configure_model()


def _dp_module(monkeypatch, policy, **kw):
    sharded = []
    monkeypatch.setattr("lit_rl.distributed.shard_policy_fsdp2", lambda model, mesh, **_: sharded.append(model))
    module = ERILSModule(policy, **kw)
    module._trainer = SimpleNamespace(precision="32-true")
    module._device_mesh = _FakeMesh(data_parallel=2)
    return module, sharded


def test_fsdp2_refuses_a_deep_copied_kl_reference_and_accepts_the_adapter_one(monkeypatch):
    from lit_rl.algorithms.d1 import D1Loss

    module, sharded = _dp_module(monkeypatch, TinyDiffusionLM(**TINY), loss_fn=D1Loss(beta=0.04))
    with pytest.raises(ValueError, match="deep copy of the FSDP2-sharded policy.*LoRA policy"):
        module.configure_model()
    assert sharded == []
    for policy, loss in ((TinyDiffusionLM(**TINY), D1Loss(beta=0.0)),  # no KL term: nothing to copy
                         (TinyDiffusionLM(**TINY, lora=LORA), D1Loss(beta=0.04))):  # adapter-disabled reference
        module, sharded = _dp_module(monkeypatch, policy, loss_fn=loss)
        module.configure_model()
        assert sharded == [module.policy.model]


def test_fsdp2_refuses_the_dllm_double_rollout_processor(monkeypatch):
    from lit_rl.algorithms.advantages import OnPolicyOnly
    from lit_rl.algorithms.dr_estimate import DoubleRolloutEstimate

    module, sharded = _dp_module(monkeypatch, TinyDiffusionLM(**TINY),
                                 processors=[OnPolicyOnly(), DoubleRolloutEstimate()])
    with pytest.raises(ValueError, match="DoubleRolloutEstimate does not support FSDP2.*trainer.strategy: ddp"):
        module.configure_model()
    assert sharded == []


# -- two CPU ranks -----------------------------------------------------------------------------------------
def _randomize_adapters(policy: nn.Module) -> None:
    """peft initialises lora_B to zero (lora_A grads are 0 at init): give every adapter weight a value."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in sorted(policy.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _check_hook_and_nan_guard(rank: int, mesh_2d) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    torch.manual_seed(0)
    module = ERILSModule(TinyDiffusionLM(**TINY), max_consecutive_skips=5)
    module._trainer = SimpleNamespace(precision="32-true")  # all the hook reads from the trainer
    module._device_mesh = mesh_2d
    module.configure_model()
    params = dict(module.policy.named_parameters())
    assert all(isinstance(p, DTensor) and p.placements == (Shard(0),) for p in params.values())
    units = [m for m in module.policy.modules() if isinstance(m, FSDPModule)]
    assert units == [module.policy.model, *module.policy.model.bert.encoder.layer]  # root + 2 blocks
    module.configure_model()  # Lightning calls it again for validate/test: nothing changes
    assert all(p is params[n] for n, p in module.policy.named_parameters())

    # the NaN guard: only rank 1's shard of one gradient is NaN; both ranks must skip the update
    opt = torch.optim.SGD(module.policy.parameters(), lr=0.1)
    module.optimizers = lambda: opt
    module.lr_schedulers = lambda: None
    module.log = lambda *a, **k: None
    module.clip_gradients = lambda *a, **k: None
    ids = torch.randint(3, 30, (2, 12), generator=torch.Generator().manual_seed(rank))  # per-rank data

    def backward(poison: bool):
        def run():
            loss = module.policy(ids).float().pow(2).mean()
            loss.backward()
            if poison and rank == 1:
                params["model.bert.encoder.layer.1.output.dense.weight"].grad.to_local().view(-1)[0] = float("nan")
            return loss.detach(), {}
        return run

    before = {n: p.detach().to_local().clone() for n, p in params.items()}
    module.optimizer_update(backward(poison=True), "train")
    assert module.skipped_updates == 1 and module.consecutive_skips == 1
    assert all(torch.equal(p.to_local(), before[n]) for n, p in params.items())  # no rank stepped
    module.optimizer_update(backward(poison=False), "train")
    assert module.skipped_updates == 1 and module.consecutive_skips == 0
    # both ranks stepped (position rows past the 12 tokens get no gradient, so check the blocks)
    assert all(not torch.equal(p.to_local(), before[n]) for n, p in params.items() if ".encoder.layer." in n)



def _check_4bit_lora_parity(rank: int, mesh) -> None:
    """Sharded vs unsharded 4-bit NF4 LLaDA + LoRA (LLaDA's own whole-layer activation checkpointing):
    same logits, same adapter gradients, same weights after two SGD steps."""
    from torch.distributed.tensor import DTensor

    from lit_rl.distributed import shard_policy_fsdp2

    def build():
        torch.manual_seed(0)
        lora = LoraSettings(r=8, alpha=16, dropout=0.0)
        policy = remote("tiny_llada", quantized=True, lora=lora, gradient_checkpointing=True)
        _randomize_adapters(policy)
        return policy

    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(5))
    for mixed in (False, True):
        sharded, ref = build(), build()
        shard_policy_fsdp2(sharded.model, mesh, mixed_precision=mixed)
        linear4 = [m for m in sharded.modules() if type(m).__name__ == "Linear4bit"]
        assert linear4 and all(isinstance(m.weight, DTensor) and m.weight.dtype == torch.uint8 for m in linear4)
        train = [(n, p) for n, p in sharded.named_parameters() if p.requires_grad]
        ref_train = dict((n, p) for n, p in ref.named_parameters() if p.requires_grad)
        assert train and all("lora_" in n and p.dtype == torch.float32 for n, p in train)
        opt = torch.optim.SGD([p for _, p in train], lr=0.1)
        ref_opt = torch.optim.SGD(ref_train.values(), lr=0.1)
        tol = dict(atol=0.1, rtol=0.05) if mixed else dict(atol=0.0, rtol=0.0)  # bf16 gathers: rounding only
        grad_tol = dict(atol=1e-3, rtol=0.05) if mixed else tol
        for _ in range(2):
            out, ref_out = sharded(ids).float(), ref(ids).float()  # (B, T, V)
            torch.testing.assert_close(out, ref_out, **tol)
            out.pow(2).mean().backward()
            ref_out.pow(2).mean().backward()
            for n, p in train:
                assert p.grad.dtype == torch.float32  # fp32 reduction into fp32 shards
                torch.testing.assert_close(p.grad.full_tensor(), ref_train[n].grad, **grad_tol)
            opt.step(), ref_opt.step(), opt.zero_grad(), ref_opt.zero_grad()
        if not mixed:
            assert all(torch.equal(p.full_tensor(), ref_train[n]) for n, p in train)


def _worker(rank: int, world: int, init_file: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh_2d = init_device_mesh("cpu", (world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        _check_hook_and_nan_guard(rank, mesh_2d)
        _check_4bit_lora_parity(rank, mesh_2d["data_parallel"])
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore")
def test_two_cpu_ranks_hook_nan_guard_and_4bit_parity(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks inherit it
    ctx = mp.start_processes(_worker, args=(2, str(tmp_path / "pg")), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=5):  # raises ProcessRaisedException with the rank's traceback
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("2-rank FSDP2 checks hung (a collective on one rank only?)")
