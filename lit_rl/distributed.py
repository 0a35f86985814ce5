"""FSDP2 sharding of a policy's model (``torch.distributed.fsdp.fully_shard``).

lit_rl shards with FSDP2 through Lightning's ``ModelParallelStrategy``; :meth:`RLModule.configure_model`
calls :func:`shard_policy_fsdp2` on ``policy.model`` with the strategy's data-parallel mesh. Lightning's
``FSDPStrategy`` (FSDP1) cannot train lit_rl's modules (``tests/test_fsdp.py`` pins why): it runs
``training_step`` inside the root unit's forward, where ``manual_backward`` fails, and leaves the weights
sharded while the DataModule generates rollouts outside that forward. An FSDP2 unit instead gathers its
weights whenever *it* runs, so generation, the surrogate's forward/backward and evaluation all work.

The units follow the usual FSDP2 recipe (torchtitan, torchtune): one per transformer block, then the
model itself as the root unit (embeddings, final norm, LM head). Blocks are found generically — the
children of the largest ``nn.ModuleList`` of same-class modules — so the same code shards ``BertForMaskedLM``
(``bert.encoder.layer``), ``LlamaForCausalLM`` (``model.layers``), LLaDA (``model.transformer.blocks``),
Dream (``model.layers``) and their peft-wrapped versions.

A bitsandbytes 4-bit (NF4) base shards too: ``fully_shard`` turns each ``Params4bit`` into a plain uint8
``DTensor`` (losing its ``quant_state``), and ``Linear4bit.forward`` restores the state from the module on
every call (bitsandbytes does this for FSDP); uint8 is not floating point, so a mixed-precision policy leaves
it alone. On CPU the sharded model's outputs and LoRA gradients equal the unsharded model's exactly
(``tests/test_distributed.py``); it has not been run on CUDA. Checkpoints then hold the packed weights
without their quantisation statistics (``weight.absmax``, ``weight.quant_map``, ...): the frozen base is
reloaded from its source and ``lit_rl export`` reads the adapters only.

Every unit's forward is a collective, so all ranks must run the same number of forward passes. dLLM
generation has a fixed step count, and the eval sets split into whole batches per rank when sized so
(``conf/paper/erils_sudoku_fsdp.yaml``). Trained and tested with ``ERILSModule`` only: the AR
double-rollout module is not FSDP2-ready (its HF generation loop stops early per rank, its vLLM weight
sync reads ``state_dict()`` of DTensors, and its KL reference is a deep copy of the policy), so its
``configure_model`` refuses a device mesh with a clear error instead of risking a hang.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["find_transformer_blocks", "shard_policy_fsdp2"]


def find_transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``model``: the children of its largest ``nn.ModuleList`` (by parameter
    count) whose children are all of one class.

    Raises:
        ValueError: no such ``nn.ModuleList`` with parameters (nothing to shard block by block).
    """
    best: nn.ModuleList | None = None
    best_numel = 0
    for m in model.modules():
        if not isinstance(m, nn.ModuleList) or len(m) == 0 or len({type(c) for c in m}) != 1:
            continue
        numel = sum(p.numel() for p in m.parameters())
        if numel > best_numel:  # nested lists (e.g. experts inside blocks) hold fewer parameters
            best, best_numel = m, numel
    if best is None:
        raise ValueError(
            f"FSDP2: found no transformer blocks in {type(model).__name__} (no nn.ModuleList of same-class "
            "modules with parameters); shard it with torch.distributed.fsdp.fully_shard yourself"
        )
    return list(best)


def shard_policy_fsdp2(
    model: nn.Module,
    mesh,
    mixed_precision: bool = False,
    reshard_after_forward: bool = True,
) -> list[nn.Module]:
    """Shard ``model`` in place over the 1-D data-parallel ``mesh``: ``fully_shard`` on every block of
    :func:`find_transformer_blocks`, then on ``model`` (the root unit). Returns the blocks.

    Every parameter becomes a ``DTensor`` with placement ``Shard(0)``; frozen and trainable parameters
    (a frozen base with LoRA adapters) may share a unit. Calling it again on a sharded model does nothing.

    Args:
        model: the policy's model (``policy.model``, possibly peft-wrapped).
        mesh: a 1-D ``DeviceMesh`` (``ModelParallelStrategy``'s ``device_mesh["data_parallel"]``).
        mixed_precision: ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: floating-point
            weights are gathered and computed in bf16 and gradients reduced in fp32, while the shards (and the
            optimizer) keep each parameter's own dtype (fp32 LoRA adapters stay fp32); ``False`` gathers and
            reduces in each parameter's own dtype.
        reshard_after_forward: free the gathered weights after each unit's forward (ZeRO-3); ``False``
            keeps them until backward (ZeRO-2: more memory, one all-gather fewer).

    Raises:
        ValueError: no transformer blocks found (:func:`find_transformer_blocks`).
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule):
        return find_transformer_blocks(model)
    mp = MixedPrecisionPolicy()  # gather and reduce in each parameter's own dtype
    if mixed_precision:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = find_transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return blocks
