"""bitsandbytes 4-bit helpers: the CPU weight-packing guard and small inspection utilities.

**The trap** (bitsandbytes 0.50, measured on an AVX512-BF16 CPU): ``bnb.nn.Linear4bit.forward`` converts its
NF4 weight, in place, to a CPU-only packed layout the first time it runs on a CPU *in eval mode with an
input that does not require grad* (``support_avx512bf16_for_cpu and not self.training and not
x.requires_grad``, ``bitsandbytes/nn/modules.py``). The packed matmul (``bitsandbytes::gemv_4bit``) has no
autograd kernel, and the conversion is permanent. So after one eval-mode no-grad forward — Lightning's
sanity-check validation, a greedy evaluation, on-policy rollout generation — training forwards of the
same layers no longer propagate gradients to their inputs: LoRA adapters below the first packed layer
silently receive wrong gradients (torch only warns "an autograd kernel was not registered"). On a CPU
without AVX512-BF16 the flag is ``False`` from the start and nothing happens, which is why the test
simulates the flag.

:func:`disable_cpu_weight_packing` sets ``support_avx512bf16_for_cpu = False`` on every ``Linear4bit`` (and
undoes a packing that already happened); :class:`~lit_rl.models.policy.PretrainedDiffusionLM` calls it
right after loading, before any forward. GPU training is unaffected (the branch requires a CPU input).
"""

from __future__ import annotations

import sys

from torch import nn

#: ``Linear4bit`` attribute that enables the packed CPU inference path (bitsandbytes >= 0.48).
PACKING_FLAG = "support_avx512bf16_for_cpu"


def linear4bit_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every ``bitsandbytes.nn.Linear4bit`` in ``model`` (peft's wrappers excluded).

    Looks in ``sys.modules`` instead of importing: a model can hold a ``Linear4bit`` only once bitsandbytes
    is imported, and importing it costs 1.5-2 s (this 2-core machine) and prints a kernels warning in every
    run that saves a checkpoint of a model without 4-bit layers."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:  # never imported: no 4-bit layers
        return []
    return [(n, m) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]


def is_packed_for_cpu(module: nn.Module) -> bool:
    """Whether a ``Linear4bit``'s weight is in the inference-only CPU packed layout."""
    state = getattr(getattr(module, "weight", None), "quant_state", None)
    return bool(getattr(state, "packing_format_for_cpu", False))


def disable_cpu_weight_packing(model: nn.Module) -> int:
    """Keep every 4-bit layer of ``model`` trainable on CPU; returns how many ``Linear4bit`` were found.

    Sets ``support_avx512bf16_for_cpu = False`` (so eval-mode no-grad forwards never pack the weight) and
    converts a weight that was already packed back to the standard NF4/FP4 layout.
    """
    layers = linear4bit_modules(model)
    if not layers:
        return 0
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

    for _, m in layers:
        setattr(m, PACKING_FLAG, False)
        if is_packed_for_cpu(m):
            w = m.weight
            nested = bool(getattr(w.quant_state, "original_nested", False))
            w.data, state = _convert_weight_packed_for_cpu_inverse(w.data, w.quant_state)
            if not nested and state.absmax.dim() == 2:
                # the inverse leaves a non-nested absmax in the packed (K/blocksize, N) bf16 layout
                state.absmax = state.absmax.T.reshape(-1).float().contiguous()
            w.quant_state = m.quant_state = state
    return len(layers)


def packed_layers(model: nn.Module) -> list[str]:
    """Names of the ``Linear4bit`` layers whose weight is packed (should be empty during training)."""
    return [n for n, m in linear4bit_modules(model) if is_packed_for_cpu(m)]
