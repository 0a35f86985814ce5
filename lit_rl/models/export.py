"""Export a trained policy from a Lightning checkpoint: PEFT adapters, and optionally a merged model.

Training keeps the base weights 4-bit (NF4) and trains LoRA adapters only. An export therefore:

1. rebuilds the run's policy from its saved config (``config.yaml`` in the run folder, or ``--config``)
   with a **full-precision** base (quantisation off, ``dtype``): the adapters are the same tensors either
   way, and merging into a full-precision base is exact where merging into NF4 would re-quantise;
2. loads the checkpoint's adapter weights (``policy.*lora_*`` entries) into it — every adapter of the
   policy must be found;
3. writes ``<out>/adapter`` with peft's ``save_pretrained`` (``adapter_config.json`` +
   ``adapter_model.safetensors``; ``PeftModel.from_pretrained(base, "<out>/adapter")`` loads it) and the
   tokenizer;
4. with ``merge``, folds the adapters into the base (``merge_and_unload``) and writes ``<out>/merged``: a
   plain model directory (remote-code models keep their modeling files and ``auto_map``) with the
   tokenizer, loadable by ``AutoModel.from_pretrained(..., trust_remote_code=True)``.

A policy trained without LoRA is written to ``<out>/merged`` only. ``<out>/export.json`` records the sources.

Both kinds of policy export: dLLMs (:class:`~lit_rl.models.policy.DiffusionPolicy`; the merged folder
loads with ``AutoModel``) and causal LMs (:class:`~lit_rl.models.ar.CausalPolicy`, double-rollout GRPO; the
merged folder is a plain ``*ForCausalLM`` directory that ``AutoModelForCausalLM`` and vLLM load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

from lit_rl.atomic import atomic_write_text
from lit_rl.errors import CheckpointError, ConfigError, one_line
from lit_rl.models.policy import DiffusionPolicy, PretrainedDiffusionLM


def find_run_config(ckpt: Path) -> Path:
    """The ``config.yaml`` LightningCLI saved for the run of ``ckpt`` (its folder or up to two levels above)."""
    for d in [ckpt.parent, *list(ckpt.parents)[1:3]]:
        if (d / "config.yaml").exists():
            return d / "config.yaml"
    raise FileNotFoundError(f"no config.yaml next to or above {ckpt}; pass --config with the run's config")


def policy_config(config_path: Path) -> dict[str, Any]:
    """``model.init_args.policy`` (``class_path`` + ``init_args``) of a saved run config."""
    cfg = yaml.safe_load(config_path.read_text()) or {}
    cfg = cfg.get("fit", cfg)  # a config saved from `fit` may be nested under the subcommand
    try:
        policy = cfg["model"]["init_args"]["policy"]
    except (KeyError, TypeError):
        raise ValueError(f"{config_path}: no model.init_args.policy") from None
    if not isinstance(policy, dict) or "class_path" not in policy:
        raise ValueError(f"{config_path}: model.init_args.policy has no class_path")
    return policy


def build_full_precision_policy(policy: dict[str, Any], dtype: str = "bfloat16") -> torch.nn.Module:
    """Instantiate the policy of a run config with quantisation and checkpointing off (``dtype`` weights)."""
    from jsonargparse import ArgumentParser

    from lit_rl.models.ar import CausalPolicy, PretrainedCausalLM

    policy = {"class_path": policy["class_path"], "init_args": dict(policy.get("init_args") or {})}
    args = policy["init_args"]
    cls = policy_class(policy["class_path"])
    if issubclass(cls, (PretrainedDiffusionLM, PretrainedCausalLM)):
        args.update(quantization=None, gradient_checkpointing=False, dtype=dtype)
    if not issubclass(cls, (DiffusionPolicy, CausalPolicy)):
        raise ValueError(f"policy.class_path {policy['class_path']!r}: not a DiffusionPolicy or CausalPolicy")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(DiffusionPolicy if issubclass(cls, DiffusionPolicy) else CausalPolicy, "policy")
    cfg = parser.parse_object({"policy": policy})
    return parser.instantiate_classes(cfg).policy


def policy_class(class_path: str) -> type:
    """The class a ``class_path`` names (``lit_rl.models.NativeLLaDA``)."""
    import importlib

    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"policy.class_path {class_path!r}: no such class") from None


def keep_official_files(policy: DiffusionPolicy, merged_dir: Path) -> list[str]:
    """A native LLaDA's / Dream's merged export keeps the source's ``config.json`` and the modeling files its
    ``auto_map`` names (local folder or hub cache), so it loads on the official remote code and on the native
    class alike; returns what was copied. A missing ``config.json`` is an error: without it the export would
    carry lit_rl's own config, which the official code cannot read."""
    import shutil

    from lit_rl.models.llada import config_file
    from lit_rl.models.native import NativeDream, NativeLLaDA

    if not isinstance(policy, (NativeLLaDA, NativeDream)):
        return []
    config = config_file(policy.path)
    raw = json.loads(config.read_text())
    modules = {ref.split(".")[0] for ref in (raw.get("auto_map") or {}).values() if isinstance(ref, str)}
    files = [config]
    for module in sorted(modules):
        local = config.parent / f"{module}.py"
        if not local.is_file():
            from transformers.utils import cached_file

            try:
                local = Path(cached_file(policy.path, f"{module}.py"))
            except OSError as err:
                raise FileNotFoundError(f"export: {policy.path} names {module}.py in its auto_map but it cannot be "
                                        f"found ({err})") from None
        files.append(local)
    for f in files:
        shutil.copy(f, merged_dir / f.name)
    return [f.name for f in files]


def checkpoint_policy_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """The ``policy.*`` entries of a Lightning checkpoint, prefix removed."""
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - a truncated, empty or foreign file: one line naming it
        raise CheckpointError(f"checkpoint {ckpt} cannot be read ({type(e).__name__}: "
                              f"{one_line(e, 200)})") from None
    sd = state.get("state_dict", state)
    return {k.removeprefix("policy."): v for k, v in sd.items() if k.startswith("policy.")}


def export_policy(ckpt: str | Path, out: str | Path, merge: bool = False, config: str | Path | None = None,
                  dtype: str = "bfloat16") -> dict[str, Any]:
    """Export the policy of ``ckpt`` to ``out`` (see the module docstring); returns the manifest."""
    ckpt, out = Path(ckpt), Path(out)
    if not ckpt.is_file():  # before the config is looked up next to it, so that the message names what is missing
        raise CheckpointError(f"checkpoint not found: {ckpt} (--ckpt_path)" if not ckpt.exists()
                              else f"--ckpt_path {ckpt} is a folder, not a checkpoint file")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: export writes a folder (adapter/, merged/, export.json); "
                          "give a new or existing folder")
    config_path = Path(config) if config else find_run_config(ckpt)
    policy_cfg = policy_config(config_path)
    policy = build_full_precision_policy(policy_cfg, dtype=dtype)
    state = checkpoint_policy_state(ckpt)
    names = [n for n, _ in policy.named_parameters() if "lora_" in n]
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"checkpoint": str(ckpt), "config": str(config_path), "policy": policy_cfg["class_path"],
                                "dtype": dtype}
    if names:
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(f"{ckpt}: {len(missing)} adapter weights missing (e.g. {missing[:3]}); wrong --config?")
        policy.load_state_dict({n: state[n] for n in names}, strict=False)
        adapter_dir = out / "adapter"
        policy.model.save_pretrained(str(adapter_dir))
        policy.tokenizer.save_pretrained(str(adapter_dir))
        manifest["adapter"] = str(adapter_dir)
        manifest["adapter_tensors"] = len(names)
    else:
        # full fine-tuning: the checkpoint holds every weight of the (unquantised) model
        policy.load_state_dict(state, strict=True)
        merge = True
    if merge:
        model = policy.model.merge_and_unload() if names else policy.model
        merged_dir = out / "merged"
        model.save_pretrained(str(merged_dir), safe_serialization=True)
        policy.tokenizer.save_pretrained(str(merged_dir))
        manifest["merged"] = str(merged_dir)
        if copied := keep_official_files(policy, merged_dir):
            manifest["official_files"] = copied
    atomic_write_text(out / "export.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
