"""A training config read into :func:`lit_rl.memory.estimate`'s settings: ``python -m lit_rl.memory --config ...``.

The config is composed as ``fit`` composes it (:func:`lit_rl.config.lines.compose_files`), then read:

* **model**: the policy's ``path`` (or ``model_path``) matched to :data:`lit_rl.memory.MODELS` by name; a 4-bit base
  (``quantization.load_in_4bit``); LoRA's rank and whether it touches the MLP (``target_modules``).
* **rows of one loss pass**: ``micro_batch_size``, else every rollout of the rank's batch (``prompts_per_batch`` x G,
  G = ``g_on + g_ext`` or ``num_generations``), times the SPG surrogate's ``num_t`` noisy copies.
* **tokens per row**: ``max_prompt_len`` plus the generation length (``gen_length`` / ``max_new_tokens``).
* **rollouts**: a diffusion policy decodes ``prompts_per_batch x g_on`` rows at once (its ``block_length``); a
  ``VLLMBackend`` colocated on the card takes ``gpu_memory_utilization`` of it.
* **strategy**: per GPU. DDP (and one device) keeps a whole copy on every GPU; a sharding strategy (FSDP,
  ``ModelParallelStrategy``) divides the weights and the trainable state by the devices.

An unknown model is one :class:`~lit_rl.errors.ConfigError` naming what is known (add its ``config.json`` numbers
to :data:`~lit_rl.memory.MODELS`).
"""

from __future__ import annotations

from typing import Any, Sequence

from lit_rl.errors import ConfigError
from lit_rl.memory import GB, MODELS, estimate

__all__ = ["config_estimate", "model_key"]

#: substrings of a model's path or hub name -> its key in MODELS
ALIASES = {
    "llada-8b": "llada-8b", "qwen2.5-0.5b": "qwen2.5-0.5b", "qwen2.5-1.5b": "qwen2.5-1.5b",
    "smollm2-135m": "smollm2-135m", "qwen3-30b-a3b": "qwen3-30b-a3b", "nemotron-3-nano-30b-a3b": "qwen3-30b-a3b",
}
SHARDING = ("fsdp", "modelparallel", "deepspeed")


def _get(node: Any, *keys: str, default: Any = None) -> Any:
    """``node[k1][k2]...``, stepping into a ``class_path`` node's ``init_args`` where the key is not its own."""
    for k in keys:
        if isinstance(node, dict) and k not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return node


def model_key(name: str) -> str:
    """The :data:`~lit_rl.memory.MODELS` key of a model path or hub name (a ConfigError naming the known ones)."""
    low = str(name).lower()
    for alias, key in ALIASES.items():
        if alias in low:
            return key
    raise ConfigError(f"model.init_args.policy: lit_rl.memory does not know the model {name!r} (it knows "
                      f"{', '.join(sorted(ALIASES))}); add its config.json numbers to lit_rl.memory.MODELS")


def config_estimate(files: Sequence[str], gpu_gib: float = 80.0) -> dict[str, Any]:
    """The per-GPU estimate of a training config (the module docstring says what is read), in GiB, with the
    settings it used and notes on what it could not read."""
    from lit_rl.config.lines import compose_files

    cfg = compose_files(files).data
    policy = _get(cfg, "model", "policy") or {}
    cls = str(policy.get("class_path", "")) if isinstance(policy, dict) else ""
    name = _get(policy, "path") or _get(policy, "model_path") or cls
    notes: list[str] = []
    if "tiny" in cls.lower():
        raise ConfigError(f"model.init_args.policy: {cls} is a tiny model built from its config (well under 1 GiB); "
                          "lit_rl.memory estimates pretrained models")
    shape = MODELS[model_key(name)]
    quant = _get(policy, "quantization") or {}
    four_bit = bool(isinstance(quant, dict) and quant.get("load_in_4bit")) or bool(_get(policy, "load_in_4bit"))
    lora = _get(policy, "lora")
    lora_r = int(lora["r"]) if isinstance(lora, dict) and lora.get("r") else None
    targets = lora.get("target_modules") if isinstance(lora, dict) else None
    lora_mlp = not targets or any(t in str(targets) for t in ("gate", "up_proj", "down", "ff", "mlp"))
    data = _get(cfg, "data") or {}
    ppb = int(_get(data, "prompts_per_batch", default=1) or 1)
    g = int(_get(data, "num_generations", default=0) or 0) or (
        int(_get(data, "g_on", default=0) or 0) + int(_get(data, "g_ext", default=0) or 0)) or 1
    num_t = int(_get(cfg, "model", "surrogate", "num_t", default=1) or 1)
    mbs = _get(cfg, "model", "micro_batch_size")
    rows = (int(mbs) if mbs else ppb * g) * num_t
    gen = _get(data, "generation") or {}
    gen_len = int((gen.get("gen_length") or gen.get("max_new_tokens") or 0) if isinstance(gen, dict) else 0)
    seq_len = int(_get(data, "max_prompt_len", default=256) or 256) + gen_len
    backend = _get(data, "backend") or {}
    vllm = 0.0
    if isinstance(backend, dict) and str(backend.get("class_path", "")).endswith("VLLMBackend"):
        vllm = float(_get(backend, "gpu_memory_utilization", default=0.9) or 0.9)
    diffusion = "diffusion" in cls.lower() or "llada" in cls.lower() or "dream" in cls.lower()
    gen_rows = ppb * int(_get(data, "g_on", default=0) or 0) if diffusion else 0
    block = int(gen.get("block_length") or 32) if isinstance(gen, dict) else 32
    kl = float(_get(cfg, "model", "loss", "kl_beta", default=0.0) or 0.0)
    frozen = 1 if kl > 0 and lora_r is None else 0
    trainer = cfg.get("trainer") or {}
    devices = trainer.get("devices", 1)
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    strategy = trainer.get("strategy", "auto")
    strategy_name = strategy if isinstance(strategy, str) else str((strategy or {}).get("class_path", "custom"))
    est = estimate(shape, four_bit=four_bit, lora_r=lora_r, lora_mlp=lora_mlp, micro_batch_rows=rows,
                   seq_len=seq_len, frozen_copies=frozen, vllm_fraction=vllm, gpu_gib=gpu_gib, gen_rows=gen_rows,
                   gen_block=block)
    parts = est.as_gib()
    if any(k in strategy_name.lower() for k in SHARDING) and devices > 1:
        for k in ("weights", "trainable_state", "frozen_copies"):
            parts[k] = round(parts[k] / devices, 2)
        notes.append(f"{strategy_name}: weights and trainable state sharded over {devices} GPUs")
        parts["total"] = round(sum(parts[k] for k in ("weights", "trainable_state", "frozen_copies", "vllm"))
                               + max(parts["activations"], parts["generation"]), 2)
    if vllm:
        notes.append(f"vLLM takes {vllm:g} x {gpu_gib:g} GiB of the card whole; its own copy of the weights "
                     f"({shape.params * 2 / GB:.1f} GiB in bf16 at tensor parallel 1) must fit inside that share")
        if shape.params * 2 / GB > vllm * gpu_gib:
            notes.append(f"vLLM's bf16 weights alone ({shape.params * 2 / GB:.1f} GiB) exceed its share "
                         f"({vllm * gpu_gib:.1f} GiB): the engine cannot start at tensor parallel 1")
    return {"config": list(files), "model": shape.name, "four_bit": four_bit, "lora_r": lora_r, "lora_mlp": lora_mlp,
            "rows": rows, "seq_len": seq_len, "gen_rows": gen_rows, "vllm_fraction": vllm, "devices": devices,
            "strategy": strategy_name, **parts, "notes": notes}
