"""GPU memory of a training run estimated from parameter counts (``python -m lit_rl.memory``).

No model hub is reachable from every machine, so the one-GPU recipes (README "One GPU") size themselves
from the architecture numbers of each model's ``config.json`` (:data:`MODELS`), with this arithmetic:

* **weights**: bf16 = 2 bytes per parameter; NF4 = 0.5 bytes per quantised parameter (+ one fp32 absmax
  per 64-weight block, 1/16 byte, with double quantisation ~1/32 byte), the embeddings and the output head
  stay bf16 (bitsandbytes quantises ``nn.Linear`` layers only; the LM head is kept);
* **trainable state**: fp32 master weights are not kept (the trainable weights are bf16 under
  ``bf16-mixed`` or fp32 LoRA adapters): trainable parameters x (weight + gradient + AdamW's two moments)
  = 2 + 2 + 4 + 4 = 12 bytes (bf16 full fine-tuning) or 4 + 4 + 4 + 4 = 16 bytes (fp32 LoRA);
* **activations** with gradient checkpointing: each layer's input, ``tokens x hidden x 2`` bytes per
  layer, plus one layer recomputed in full (~``tokens x (10 hidden + 2 intermediate) x 2`` bytes), plus the
  float32 logits and their gradient, ``tokens x vocab x 4 x 2`` bytes (the largest term at 126k-152k
  vocabularies), for one micro-batch of ``tokens = rows x sequence length``; with ``logprob_chunk = c`` the
  logits exist ``rows x c`` positions at a time (:meth:`lit_rl.models.ar.CausalPolicy.completion_scores`);
* **dLLM rollouts** (no vLLM for diffusion decoding): the bf16 logits of every decoding step,
  ``rows x sequence x vocab x 2`` bytes, plus the still-masked block positions' float32 copy and float64
  Gumbel noise and log, ``rows x block x vocab x 20`` bytes; generation runs before the loss, so the peak
  is the larger of this and the loss's activations;
* **frozen copies**: a reference policy (KL) or π_old held as a second set of weights, when asked;
* **vLLM** (colocated): its ``gpu_memory_utilization`` share of the card, which it takes whole; inside it, its
  own bf16 copy of the weights at tensor parallel 1 and the KV cache in what is left (``layers x kv_dim x 2 x 2``
  bytes a token), reported as tokens and as rows of ``max_model_len`` in the notes.

``--config FILE ...`` reads a training config into these settings (:func:`config_estimate`), composed as ``fit``
composes it (:func:`lit_rl.config.lines.compose_files`):

* **model**: the policy's ``path`` (or ``model_path``) matched to :data:`lit_rl.memory.MODELS` by name; a 4-bit base
  (``quantization.load_in_4bit``); LoRA's rank and whether it touches the MLP (``target_modules``).
* **rows of one loss pass**: ``micro_batch_size``, else every rollout of the rank's batch (``prompts_per_batch`` x G,
  G = ``g_on + g_ext`` or ``num_generations``), times the SPG surrogate's ``num_t`` noisy copies.
* **tokens per row**: ``max_prompt_len`` plus the generation length (``gen_length`` / ``max_new_tokens``); the
  policy's ``logprob_chunk``.
* **rollouts**: a diffusion policy decodes ``prompts_per_batch x g_on`` rows at once (its ``block_length``); a
  ``VLLMBackend`` colocated on the card takes ``gpu_memory_utilization`` of it.
* **strategy**: per GPU. DDP (and one device) keeps a whole copy on every GPU; a sharding strategy (FSDP,
  ``ModelParallelStrategy``) divides the weights and the trainable state by the devices.

An unknown model is one :class:`~lit_rl.errors.ConfigError` naming what is known (add its ``config.json`` numbers
to :data:`~lit_rl.memory.MODELS`).


Not counted: CUDA context and allocator fragmentation (budget ~1-2 GB), NCCL buffers. The estimate is an
upper bound for the recipes, not a measurement: ``benchmarks/gpu_smoke.py`` prints measured peaks.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from lit_rl.errors import ConfigError

GB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder's ``config.json`` the estimate needs.

    Attributes:
        name: the hub name.
        params: total parameters.
        layers, hidden, intermediate: ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``.
        kv_dim: key/value projection width (``num_key_value_heads x head_dim``).
        vocab: vocabulary size.
        tied: input and output embeddings share one matrix.
    """

    name: str
    params: float
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int
    vocab: int
    tied: bool

    @property
    def embedding_params(self) -> float:
        """Input embedding plus (untied) output head: the parameters 4-bit loading keeps in bf16."""
        return self.vocab * self.hidden * (1 if self.tied else 2)


#: config.json numbers of the configs' models (Qwen2.5-0.5B/1.5B-Instruct, LLaDA-8B-Instruct; SmolLM2-135M-Instruct,
#: the real-model configs'; Qwen3-30B-A3B, the double-rollout paper config's MoE: 128 experts of 768, 8 active per
#: token, so ``intermediate`` is the active width 8 x 768 = 6144, which sets the activations; ``params`` counts all)
MODELS = {
    "qwen2.5-0.5b": ModelShape("Qwen/Qwen2.5-0.5B-Instruct", 494.0e6, 24, 896, 4864, 128, 151936, True),
    "qwen2.5-1.5b": ModelShape("Qwen/Qwen2.5-1.5B-Instruct", 1.544e9, 28, 1536, 8960, 256, 151936, True),
    "llada-8b": ModelShape("GSAI-ML/LLaDA-8B-Instruct", 8.02e9, 32, 4096, 12288, 4096, 126464, False),
    "smollm2-135m": ModelShape("HuggingFaceTB/SmolLM2-135M-Instruct", 134.5e6, 30, 576, 1536, 192, 49152, True),
    "qwen3-30b-a3b": ModelShape("Qwen/Qwen3-30B-A3B-Thinking-2507", 30.5e9, 48, 2048, 6144, 512, 151936, False),
}


def lora_params(shape: ModelShape, r: int, attention: bool = True, mlp: bool = True) -> int:
    """LoRA parameters, ``r x (d_in + d_out)`` per adapted matrix: q/o (hidden->hidden), k/v (hidden->kv_dim)
    and the MLP's gate/up (hidden->intermediate) and down (intermediate->hidden), in every layer."""
    h, kv, m = shape.hidden, shape.kv_dim, shape.intermediate
    per_layer = 0
    if attention:
        per_layer += r * (h + h) * 2 + r * (h + kv) * 2
    if mlp:
        per_layer += r * (h + m) * 2 + r * (m + h)
    return per_layer * shape.layers


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part (GiB in :meth:`as_gib`)."""

    weights: float
    trainable_state: float
    activations: float
    generation: float
    frozen_copies: float
    vllm: float

    @property
    def total(self) -> float:
        """Resident parts plus the larger of the two passes (rollout generation, then the loss)."""
        return (self.weights + self.trainable_state + self.frozen_copies + self.vllm
                + max(self.activations, self.generation))

    def as_gib(self) -> dict[str, float]:
        return {k: round(v / GB, 2) for k, v in (*asdict(self).items(), ("total", self.total))}


def estimate(
    shape: ModelShape,
    *,
    four_bit: bool = False,
    lora_r: int | None = None,
    lora_mlp: bool = True,
    micro_batch_rows: int = 1,
    seq_len: int = 1024,
    gradient_checkpointing: bool = True,
    frozen_copies: int = 0,
    vllm_fraction: float = 0.0,
    gpu_gib: float = 80.0,
    gen_rows: int = 0,
    gen_block: int = 32,
    logprob_chunk: int = 0,
) -> MemoryEstimate:
    """The estimate of the module docstring for one GPU.

    Args:
        shape: the model.
        four_bit: NF4 base (bitsandbytes, double quantisation) instead of bf16.
        lora_r: LoRA rank on attention + MLP (``None``: full fine-tuning of every weight).
        lora_mlp: LoRA on the MLP projections too (False: attention only, as the MoE configs do).
        micro_batch_rows, seq_len: one micro-batch of the loss (prompt + completion tokens per row).
        gradient_checkpointing: recompute layer activations in the backward pass.
        frozen_copies: extra frozen weight copies (a reference model for KL: 1).
        vllm_fraction: ``gpu_memory_utilization`` of a colocated vLLM engine.
        gpu_gib: the card's memory (for the vLLM share).
        gen_rows, gen_block: dLLM rollouts decoded in one batch (``seq_len`` tokens each) and the decoding
            block (0 rows: generation elsewhere, e.g. vLLM).
        logprob_chunk: positions per LM-head pass of the loss (0: the whole row at once).
    """
    quantised = shape.params - shape.embedding_params
    if four_bit:
        weights = quantised * (0.5 + 1 / 32) + shape.embedding_params * 2
    else:
        weights = shape.params * 2
    if lora_r is None:
        trainable = shape.params * 12.0
    else:
        trainable = lora_params(shape, lora_r, mlp=lora_mlp) * 16.0
    tokens = micro_batch_rows * seq_len
    scored = micro_batch_rows * min(seq_len, logprob_chunk) if logprob_chunk > 0 else tokens
    logits = scored * shape.vocab * 4 * 2
    if gradient_checkpointing:
        acts = tokens * shape.hidden * 2 * shape.layers + tokens * (10 * shape.hidden + 2 * shape.intermediate) * 2
    else:
        acts = tokens * (10 * shape.hidden + 2 * shape.intermediate) * 2 * shape.layers
    generation = gen_rows * seq_len * shape.vocab * 2 + gen_rows * gen_block * shape.vocab * 20
    return MemoryEstimate(
        weights=weights,
        trainable_state=trainable,
        activations=acts + logits,
        generation=float(generation),
        frozen_copies=frozen_copies * weights,
        vllm=vllm_fraction * gpu_gib * GB,
    )


#: the one-GPU recipes (conf/gpu/*.yaml) and the settings each one's estimate uses
RECIPES = {
    "conf/gpu/grpo_qwen2.5_0.5b_countdown.yaml": dict(model="qwen2.5-0.5b", micro_batch_rows=4, seq_len=1280,
                                                      vllm_fraction=0.3),
    "conf/gpu/double_rollout_qwen2.5_1.5b_countdown.yaml": dict(model="qwen2.5-1.5b", micro_batch_rows=2, seq_len=1280,
                                                                vllm_fraction=0.3),
    # 8 prompt groups per update as the paper's 8 GPUs (gradient accumulation over micro-batches of 6 rows; SPG's
    # num_t 2 noisy copies make 12 rows per forward); 8 x G_on 4 = 32 rollouts decoded at once
    "conf/gpu/erils_llada8b_sudoku.yaml": dict(model="llada-8b", four_bit=True, lora_r=128, micro_batch_rows=12,
                                               seq_len=456, gen_rows=32),
}


def recipe_table() -> list[dict[str, object]]:
    """One row per recipe: its settings and the estimate in GiB."""
    rows = []
    for config, kw in RECIPES.items():
        kw = dict(kw)
        shape = MODELS[kw.pop("model")]
        rows.append({"config": config, "model": shape.name, **kw, **estimate(shape, **kw).as_gib()})
    return rows


# ---------------------------------------------------------------------------------------------------------
# a training config read into estimate()'s settings (python -m lit_rl.memory --config ...)
# ---------------------------------------------------------------------------------------------------------
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
    chunk = int(_get(policy, "logprob_chunk", default=0) or 0)
    kl = float(_get(cfg, "model", "loss", "kl_beta", default=0.0) or 0.0)
    frozen = 1 if kl > 0 and lora_r is None else 0
    trainer = cfg.get("trainer") or {}
    devices = trainer.get("devices", 1)
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    strategy = trainer.get("strategy", "auto")
    strategy_name = strategy if isinstance(strategy, str) else str((strategy or {}).get("class_path", "custom"))
    est = estimate(shape, four_bit=four_bit, lora_r=lora_r, lora_mlp=lora_mlp, micro_batch_rows=rows,
                   seq_len=seq_len, frozen_copies=frozen, vllm_fraction=vllm, gpu_gib=gpu_gib, gen_rows=gen_rows,
                   gen_block=block, logprob_chunk=chunk)
    parts = est.as_gib()
    if any(k in strategy_name.lower() for k in SHARDING) and devices > 1:
        for k in ("weights", "trainable_state", "frozen_copies"):
            parts[k] = round(parts[k] / devices, 2)
        notes.append(f"{strategy_name}: weights and trainable state sharded over {devices} GPUs")
        parts["total"] = round(sum(parts[k] for k in ("weights", "trainable_state", "frozen_copies", "vllm"))
                               + max(parts["activations"], parts["generation"]), 2)
    if vllm:
        own, share = shape.params * 2 / GB, vllm * gpu_gib
        notes.append(f"vLLM takes {vllm:g} x {gpu_gib:g} GiB of the card whole; its own copy of the weights "
                     f"({own:.1f} GiB in bf16 at tensor parallel 1) must fit inside that share")
        if own > share:
            notes.append(f"vLLM's bf16 weights alone ({own:.1f} GiB) exceed its share "
                         f"({share:.1f} GiB): the engine cannot start at tensor parallel 1")
        else:
            per_token = shape.layers * shape.kv_dim * 2 * 2  # K and V, bf16
            kv_tokens = (share - own) * GB / per_token
            max_len = int(_get(backend, "max_model_len", default=0) or seq_len)
            notes.append(f"vLLM's KV cache: at most {share - own:.1f} GiB = {kv_tokens / 1e3:.0f}k tokens "
                         f"({per_token / 1024:.0f} KiB a token), {kv_tokens / max_len:.1f} rows of {max_len} "
                         "tokens at once (less its activation peak and CUDA graphs)")
    if chunk:
        notes.append(f"logprob_chunk {chunk}: the loss's float32 logits exist {min(chunk, seq_len)} positions per "
                     f"row at a time (whole rows: {rows * seq_len * shape.vocab * 8 / GB:.1f} GiB)")
    return {"config": list(files), "model": shape.name, "four_bit": four_bit, "lora_r": lora_r, "lora_mlp": lora_mlp,
            "rows": rows, "seq_len": seq_len, "logprob_chunk": chunk, "gen_rows": gen_rows, "vllm_fraction": vllm,
            "devices": devices, "strategy": strategy_name, **parts, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """``python -m lit_rl.memory``: the recipes' estimates as a Markdown table; ``--config FILE ...``: one training
    config's (:func:`config_estimate`). A JSON line last either way."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lit_rl.memory", description=(
        "GPU memory of a training run, estimated from parameter counts (not measured; benchmarks/gpu_smoke.py "
        "measures). Without --config: the conf/gpu/ recipes' table."))
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="a training config, as fit takes it (repeat for an overlay: base first)")
    p.add_argument("--gpu_gib", type=float, default=80.0, help="the card's memory, for vLLM's share (default 80)")
    a = p.parse_args(argv)
    if a.config:
        try:
            row = config_estimate(a.config, gpu_gib=a.gpu_gib)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{' + '.join(a.config)}: {row['model']} on {row['devices']} GPU(s) ({row['strategy']}), per GPU:")
        for k in ("weights", "trainable_state", "activations", "generation", "frozen_copies", "vllm", "total"):
            print(f"  {k:<16} {row[k]:>8.2f} GiB")
        for note in row["notes"]:
            print(f"  note: {note}")
        fits = "fits" if row["total"] <= a.gpu_gib else "does NOT fit"
        print(f"  -> {row['total']:.1f} GiB of {a.gpu_gib:g}: {fits} (plus ~1-2 GiB CUDA context)")
        print(json.dumps(row))
        return 0
    rows = recipe_table()
    print("| recipe | model | weights | trainable state | loss activations + logits | dLLM rollouts | vLLM share "
          "| total (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| `{r['config']}` | {r['model']} | {r['weights']} | {r['trainable_state']} | {r['activations']} | "
              f"{r['generation']} | {r['vllm']} | **{r['total']}** |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
