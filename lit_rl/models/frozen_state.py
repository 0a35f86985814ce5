"""Checkpoints of 4-bit runs: the frozen NF4 base stays out, and resuming checks it is the same base.

bitsandbytes' ``Linear4bit`` writes its weight as several state-dict entries (``weight``, ``weight.absmax``,
``weight.quant_map``, ``weight.quant_state.bitsandbytes__nf4``) and cannot take them back through a strict
``load_state_dict`` ("Unexpected key(s) ... weight.absmax"): every 4-bit ``fit --ckpt_path`` / ``validate
--ckpt_path`` failed. The frozen base never changes during training and is rebuilt from ``policy.path``
when the run's module is constructed, so a checkpoint does not need it (nor its size: ~3.9 GB for
LLaDA-8B in NF4 with its scales, estimated from the shapes):

* :func:`drop_frozen_4bit` (``on_save_checkpoint``) removes those entries and stores a fingerprint of the
  packed weights (shapes, dtypes and a hash of each tensor's first 64 KiB);
* :func:`expect_frozen_4bit` (``on_load_checkpoint``) drops the same entries from older checkpoints that
  still hold them, checks that every other entry of the module is present and nothing unknown is (what a
  strict load checks), and turns strict loading off for the frozen entries only. When the freshly loaded
  base differs from the fingerprint (another ``policy.path``, or quantised on another device) ``fit`` stops
  (a resumed run must continue the same run; set ``LIT_RL_ALLOW_NEW_BASE=1`` to continue anyway) and
  ``validate`` / ``test`` warn. Sharded (FSDP2 DTensor) weights are not fingerprinted.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any

import torch
from torch import nn

from lit_rl.models.quantization import linear4bit_modules

KEY = "lit_rl_frozen_4bit"
FINGERPRINT_BYTES = 1 << 16


def frozen_4bit_prefixes(module: nn.Module) -> list[str]:
    """``<name>.weight`` of every frozen ``Linear4bit`` in ``module`` (state-dict names)."""
    return [f"{n}.weight" for n, m in linear4bit_modules(module) if not m.weight.requires_grad]


def is_frozen_key(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def fingerprint(module: nn.Module, prefixes: list[str]) -> str | None:
    """blake2b over name, shape, dtype and the first 64 KiB of each frozen 4-bit weight (``None`` when the
    weights are sharded DTensors: each rank would hash its own shard)."""
    from torch.distributed.tensor import DTensor

    params = dict(module.named_parameters())
    if any(isinstance(params.get(p), DTensor) for p in prefixes):
        return None
    h = hashlib.blake2b(digest_size=16)
    for p in prefixes:
        w = params.get(p)
        if w is None:
            continue
        flat = w.detach().contiguous().reshape(-1).view(torch.uint8)
        h.update(f"{p}:{tuple(w.shape)}:{w.dtype}".encode())
        h.update(flat[:FINGERPRINT_BYTES].cpu().numpy().tobytes())
    return h.hexdigest()


def drop_frozen_4bit(module: nn.Module, checkpoint: dict[str, Any]) -> int:
    """Remove the frozen 4-bit base from ``checkpoint["state_dict"]``; returns how many entries went."""
    prefixes = frozen_4bit_prefixes(module)
    if not prefixes:
        return 0
    state = checkpoint["state_dict"]
    dropped = [k for k in state if is_frozen_key(k, prefixes)]
    for k in dropped:
        del state[k]
    checkpoint[KEY] = {"entries": len(dropped), "weights": len(prefixes), "fingerprint": fingerprint(module, prefixes)}
    return len(dropped)


def expect_frozen_4bit(module: Any, checkpoint: dict[str, Any], resuming_fit: bool = False) -> None:
    """Prepare ``module`` (a LightningModule) to load ``checkpoint`` without its frozen 4-bit base.

    Raises ``RuntimeError`` listing missing / unexpected entries as a strict load would, and when
    ``resuming_fit`` and the base differs from the checkpoint's (unless ``LIT_RL_ALLOW_NEW_BASE=1``); sets
    ``module.strict_loading = False`` only once everything but the frozen base has been checked.
    """
    prefixes = frozen_4bit_prefixes(module)
    if not prefixes:
        return
    state = checkpoint["state_dict"]
    for k in [k for k in state if is_frozen_key(k, prefixes)]:  # a checkpoint written before this fix
        del state[k]
    own = {k for k in module.state_dict() if not is_frozen_key(k, prefixes)}
    missing, unexpected = sorted(own - state.keys()), sorted(state.keys() - own)
    if missing or unexpected:
        raise RuntimeError(
            f"checkpoint does not fit model.policy: missing {missing[:5]} ({len(missing)}), "
            f"unexpected {unexpected[:5]} ({len(unexpected)}) (the frozen 4-bit base is rebuilt from policy.path)"
        )
    saved = (checkpoint.get(KEY) or {}).get("fingerprint")
    now = fingerprint(module, prefixes)
    if saved is not None and now is not None and saved != now:
        msg = (
            "checkpoint: the 4-bit base weights loaded from policy.path differ from those the checkpoint was trained "
            "on (another model folder, or quantised on another device)"
        )
        if resuming_fit and os.environ.get("LIT_RL_ALLOW_NEW_BASE") != "1":
            raise RuntimeError(f"{msg}; a resumed fit would not continue the same run "
                               "(LIT_RL_ALLOW_NEW_BASE=1 continues anyway)")
        warnings.warn(f"{msg}; continuing on the new base", stacklevel=2)
    module.strict_loading = False


__all__ = ["KEY", "drop_frozen_4bit", "expect_frozen_4bit", "fingerprint", "frozen_4bit_prefixes"]
