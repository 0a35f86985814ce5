"""Masked diffusion LM policies: one interface for tiny offline models and LLaDA-style checkpoints.

A :class:`DiffusionPolicy` owns a bidirectional masked LM and its tokenizer and exposes what ERILS needs:

* ``forward(input_ids, attention_mask) -> logits (B, T, V)`` with left-padding handled (position ids
  from the attention mask where the architecture accepts them, Dream-style one-position logit shift);
* prompt encoding through the tokenizer's chat template (left-padded), completion encoding/decoding
  (cut at the first EOS), and the completion mask "up to and including the first EOS" (§2).

Two concrete policies, both built by LightningCLI from YAML:

* :class:`TinyDiffusionLM` — a ``transformers.BertForMaskedLM`` built from a config with the
  character tokenizer of :mod:`lit_rl.models.tokenizer` (offline, CPU, seconds to build);
* :class:`PretrainedDiffusionLM` — ``AutoModel.from_pretrained(path, trust_remote_code=True)`` for
  LLaDA-8B-Instruct (mask 126336, EOS 126081) and compatible dLLMs, optionally 4-bit NF4 (bitsandbytes).

Both take an optional :class:`LoraSettings` (peft) and an optional ``init_checkpoint``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn

from lit_rl.errors import FieldError
from lit_rl.generation.diffusion import position_ids_from_attention_mask
from lit_rl.models.text import TextPolicy
from lit_rl.models.remote_compat import check_token_id, mask_token_id
from lit_rl.models.tokenizer import build_char_tokenizer

if TYPE_CHECKING:
    from lit_rl.generation.diffusion import DecodeStats
    from lit_rl.generation.kv_stack import KVStack
    from lit_rl.generation.settings import DecodeSettings

# LoRA targets per architecture (``config.model_type``, matched case-insensitively): the attention and MLP
# projections. LLaDA names its MLP down-projection ``ff_out``, like its LM head (``model.transformer.ff_out``):
# the head (and any Linear that projects to the vocabulary) is never adapted, see ``lora_excluded_modules``.
LORA_TARGETS: dict[str, list[str]] = {
    "bert": ["query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"],
    "llada": ["q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"],
    "lit_rl_llada": ["q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "dream": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


@dataclass
class LoraSettings:
    """peft LoRA settings (paper: r=128, alpha=64, dropout 0.05 on attention + MLP projections).

    Attributes:
        r: LoRA rank.
        alpha: LoRA alpha (scaling = alpha / r).
        dropout: LoRA dropout.
        target_modules: module-name suffixes; ``None`` resolves them from ``config.model_type``.
    """

    r: int = 128
    alpha: int = 64
    dropout: float = 0.05
    target_modules: list[str] | None = None

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"lora.r must be positive, got {self.r}")


def resolve_lora_targets(model: nn.Module, requested: Sequence[str] | None) -> list[str]:
    """Module-name suffixes to adapt, checked against the model's Linear layers.

    ``requested`` wins; otherwise the defaults of ``config.model_type`` (case-insensitive: Dream's
    ``model_type`` is ``"Dream"``). Suffixes that match no Linear layer are dropped; none matching is an error.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    targets = (list(requested) if requested
               else (LORA_TARGETS.get(str(model_type)) or LORA_TARGETS.get(str(model_type).lower())))
    if not targets:
        raise ValueError(
            f"lora.target_modules: no default for model_type={model_type!r}; set it in the config "
            f"(known: {sorted(LORA_TARGETS)})"
        )
    from lit_rl.models.loading import is_linear, lora_excluded_modules

    excluded = set(lora_excluded_modules(model))
    linear_names = [n for n, m in model.named_modules() if is_linear(m) and n not in excluded]
    found = [t for t in targets if any(n == t or n.endswith("." + t) for n in linear_names)]
    if not found:
        raise ValueError(f"lora.target_modules {targets} match no Linear layer of {type(model).__name__}")
    return found


def apply_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters (base weights frozen; the LM head is never adapted)."""
    from peft import LoraConfig, get_peft_model

    from lit_rl.models.loading import lora_excluded_modules

    excluded = lora_excluded_modules(model)
    cfg = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=resolve_lora_targets(model, settings.target_modules),
        exclude_modules=excluded or None,
        bias="none",
    )
    return get_peft_model(model, cfg)


def additive_key_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` 1/0 -> ``(B, 1, 1, T)`` float: 0 on real keys, ``finfo(bfloat16).min`` on padding (finite in
    float32 and bfloat16, so a row that has real keys never turns NaN)."""
    neg = torch.finfo(torch.bfloat16).min
    return ((1.0 - attention_mask.float()) * neg)[:, None, None, :]  # (B, 1, 1, T)


class DiffusionPolicy(TextPolicy, nn.Module):
    """Base class: a masked diffusion LM with its tokenizer.

    Subclasses set ``self.model``, ``self.tokenizer``, ``self.mask_id``, ``self.eos_id``, ``self.pad_id``.
    """

    model: nn.Module
    tokenizer: Any
    mask_id: int
    eos_id: int
    pad_id: int
    #: Dream-style models predict token t at position t-1: shift logits right by one.
    logits_shift: bool = False
    #: whether the underlying forward accepts ``position_ids`` (BERT does; LLaDA does not).
    accepts_position_ids: bool = False
    #: whether ``generation.cache: prefix | dual`` can run (a layer-by-layer KV forward exists; the config
    #: preflight refuses a cache for a class that sets False, and :meth:`kv_stack` checks the built model)
    supports_kv_cache: bool = True
    #: how ``attention_mask`` reaches the model: ``"2d"`` (B, T) as HF models take it, or ``"additive_4d"``
    #: (B, 1, 1, T) with 0 on real keys and a large negative value on padding, which Dream's official code
    #: hands to SDPA as is (a 2-D mask crashes it; a bool one it adds as 0/1)
    mask_format: str = "2d"

    # -- model call --------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, T, V)`` for ``input_ids (B, T)``; ``attention_mask`` 1 on real tokens."""
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = (additive_key_mask(attention_mask) if self.mask_format == "additive_4d"
                                        else attention_mask)
            if self.accepts_position_ids:
                # left padding: positions count real tokens only, so a prompt's positions do not
                # depend on how much padding its batch needed
                kwargs["position_ids"] = position_ids_from_attention_mask(attention_mask)  # (B, T)
        logits = self.model(input_ids=input_ids, **kwargs).logits  # (B, T, V)
        if self.logits_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # (B, T, V)
        return logits

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: "DecodeSettings",
                 seed: int, stats: "DecodeStats | None" = None) -> torch.Tensor:
        """Completions ``(B, L_gen)`` by semi-autoregressive confidence decoding (§1), in eval mode.

        ``prompt_ids``/``prompt_mask`` are left-padded ``(B, P)``; sampling noise comes from a generator
        seeded with ``seed``, so the same weights, prompts and seed give the same completions. ``stats``
        (:class:`~lit_rl.generation.diffusion.DecodeStats`): filled with the decode's forward passes and the
        revealed tokens' confidence, if given.
        """
        from lit_rl.generation.cached import cached_diffusion_generate
        from lit_rl.generation.diffusion import diffusion_generate

        # Gumbel noise is (N, V) per step (~0.8 GB at LLaDA's vocabulary): a generator on the device
        from lit_rl.rng import device_generator

        gen = device_generator(seed, prompt_ids.device)
        common = dict(
            gen_length=settings.gen_length, block_length=settings.block_length, steps=settings.steps,
            temperature=settings.temperature, mask_id=self.mask_id, generator=gen, stats=stats,
        )
        was_training = self.training
        self.eval()
        try:
            if getattr(settings, "exact", True):
                out = diffusion_generate(lambda ids, mask: self(ids, mask), prompt_ids, prompt_mask, **common)
            else:
                out = cached_diffusion_generate(
                    prompt_ids, prompt_mask, model_fn=lambda ids, mask: self(ids, mask),
                    stack=self.kv_stack() if settings.cache != "none" else None, cache=settings.cache,
                    refresh_every=settings.refresh_every, threshold=settings.threshold,
                    threshold_floor=getattr(settings, "threshold_floor", "one"), **common,
                )
        finally:
            self.train(was_training)
        return out[:, prompt_ids.shape[1]:]  # (B, L_gen)


    def kv_stack(self) -> "KVStack":
        """The model's layer-by-layer forward with a KV cache (``generation.cache: prefix | dual``)."""
        from lit_rl.generation.kv_stack import kv_stack_for
        from lit_rl.errors import ConfigError

        stack = kv_stack_for(self.model)
        if stack is None:
            raise ConfigError(
                f"generation.cache: {type(self).__name__} ({type(self.model).__name__}) has no KV-cached forward "
                "(a checkpoint's own remote code, or FSDP2-sharded weights); use cache: none, or NativeLLaDA / "
                "NativeDream / TinyDiffusionLM"
            )
        return stack


def check_tiny_model_args(hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
                          max_positions: int) -> None:
    """The sizes of a tiny transformer built from a config (:class:`TinyDiffusionLM`, ``TinyCausalLM``): each
    positive, and ``hidden_size`` split evenly over the heads; one :class:`~lit_rl.errors.FieldError` each."""
    sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
             "intermediate_size": intermediate_size, "max_positions": max_positions}
    for name, value in sizes.items():
        if value < 1:
            raise FieldError(name, f"must be >= 1, got {value}")
    if hidden_size % num_heads:
        raise FieldError("hidden_size", f"{hidden_size} is not divisible by num_heads = {num_heads}: each head "
                         f"needs hidden_size / num_heads dimensions")


class TinyDiffusionLM(DiffusionPolicy):
    """A tiny bidirectional masked LM built from a config, with the char tokenizer (offline, seconds).

    Two architectures: ``"bert"`` (``BertForMaskedLM``: learned absolute positions, post-LN, GELU) and
    ``"llada"`` (lit_rl's native LLaDA, :class:`~lit_rl.models.llada.NativeLLaDAModel`, at tiny size: RoPE,
    RMSNorm, SwiGLU, untied head, no biases — the paper model's architecture, with its module names).

    Args:
        hidden_size: width of the transformer.
        num_layers: transformer layers.
        num_heads: attention heads.
        intermediate_size: MLP width.
        max_positions: maximum sequence length (prompt + completion).
        seed: seed for the weight initialisation (the model is the same on every machine).
        init_checkpoint: optional weights to start from (``torch.save`` state dict or Lightning ckpt).
        lora: optional LoRA adapters (peft); ``None`` trains all weights.
        architecture: ``"bert"`` or ``"llada"``.
        rope_theta: RoPE base of the ``"llada"`` architecture.
    """

    accepts_position_ids = True
    ARCHITECTURES = ("bert", "llada")

    @staticmethod
    def check_args(hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 512,
                   max_positions: int = 512, architecture: str = "bert") -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        check_tiny_model_args(hidden_size, num_layers, num_heads, intermediate_size, max_positions)
        if architecture not in TinyDiffusionLM.ARCHITECTURES:
            raise FieldError("architecture", f"must be one of {TinyDiffusionLM.ARCHITECTURES}, got {architecture!r}")

    def __init__(
        self,
        hidden_size: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        intermediate_size: int = 512,
        max_positions: int = 512,
        seed: int = 0,
        init_checkpoint: str | None = None,
        lora: LoraSettings | None = None,
        architecture: str = "bert",
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
        TinyDiffusionLM.check_args(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                                   intermediate_size=intermediate_size, max_positions=max_positions,
                                   architecture=architecture)
        self.tokenizer = build_char_tokenizer()
        self.architecture = architecture
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if architecture == "bert":
                self.model = self._bert(hidden_size, num_layers, num_heads, intermediate_size, max_positions)
            else:
                self.model = self._llada(hidden_size, num_layers, num_heads, intermediate_size, max_positions,
                                         rope_theta)
        self.mask_id = int(self.tokenizer.mask_token_id)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.max_positions = max_positions
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)
        if lora is not None:
            self.model = apply_lora(self.model, lora)

    def _bert(self, hidden: int, layers: int, heads: int, mlp: int, positions: int) -> nn.Module:
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(
            vocab_size=len(self.tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=mlp,
            max_position_embeddings=positions,
            type_vocab_size=1,
            pad_token_id=self.tokenizer.pad_token_id,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            is_decoder=False,
        )
        config._attn_implementation = "sdpa"
        return BertForMaskedLM(config)

    def _llada(self, hidden: int, layers: int, heads: int, mlp: int, positions: int, rope_theta: float) -> nn.Module:
        from lit_rl.models.llada import NativeLLaDAConfig, NativeLLaDAModel

        vocab = len(self.tokenizer)
        config = NativeLLaDAConfig(
            d_model=hidden, n_heads=heads, n_layers=layers, mlp_hidden_size=mlp, vocab_size=vocab, embedding_size=vocab,
            max_sequence_length=positions, rope_theta=rope_theta, mask_token_id=self.tokenizer.mask_token_id,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id,
        )
        config._attn_implementation = "sdpa"
        return NativeLLaDAModel(config)


@dataclass
class QuantizationSettings:
    """bitsandbytes 4-bit loading (paper: NF4 base weights, bf16 compute).

    Attributes:
        load_in_4bit: quantise Linear weights to 4 bits (the LM head stays in ``dtype``).
        quant_type: ``"nf4"`` or ``"fp4"``.
        compute_dtype: dtype of the 4-bit matmuls (``"bfloat16"``; ``"float32"`` for exact CPU tests).
        double_quant: nested quantisation of the scales.
        upcast_non_quantized: peft's ``prepare_model_for_kbit_training``: keep the non-quantised weights
            (norms, embeddings, head) in float32 for stable training; ``False`` keeps them in ``dtype``.
    """

    load_in_4bit: bool = True
    quant_type: str = "nf4"
    compute_dtype: str = "bfloat16"
    double_quant: bool = False
    upcast_non_quantized: bool = True

    def __post_init__(self) -> None:
        if self.quant_type not in ("nf4", "fp4"):
            raise ValueError(f"quantization.quant_type must be 'nf4' or 'fp4', got {self.quant_type!r}")
        if self.compute_dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"quantization.compute_dtype must be bfloat16/float16/float32, got {self.compute_dtype!r}")


class PretrainedDiffusionLM(DiffusionPolicy):
    """A LLaDA-style dLLM loaded with ``AutoModel.from_pretrained(path, trust_remote_code=True)``.

    Its forward is the checkpoint's own remote code, opaque to lit_rl: decoding takes ``cache: none`` only.

    The paper's setting (ERILS Table VII): LLaDA-8B-Instruct, 4-bit NF4 base weights with bf16 compute,
    LoRA r=128 α=64 dropout 0.05 on the attention and MLP projections (module names per architecture,
    :data:`LORA_TARGETS`; the LM head is never adapted), gradient checkpointing; bf16 autocast comes from
    ``trainer.precision: bf16-mixed``. Dream-style models (logits at t-1 predict token t) set
    ``logits_shift: true``. 4-bit layers get the CPU packing guard of :mod:`lit_rl.models.quantization`
    before any forward pass.

    Args:
        path: local directory or hub name of the model (LLaDA-8B-Instruct: ``GSAI-ML/LLaDA-8B-Instruct``).
        mask_id: the ``[MASK]`` token id (LLaDA 126336); ``None`` reads ``tokenizer.mask_token_id``.
        eos_id: EOS id (LLaDA 126081); ``None`` reads ``tokenizer.eos_token_id``.
        pad_id: id used for left padding; ``None`` uses the tokenizer's pad id or EOS.
        dtype: weight dtype of what is not quantised (``"bfloat16"``, ``"float32"``).
        trust_remote_code: allow the checkpoint's own modeling code (needed for LLaDA).
        logits_shift: Dream-style models: logits at t-1 predict token t.
        quantization: optional 4-bit loading (bitsandbytes).
        lora: optional LoRA adapters (peft).
        gradient_checkpointing: trade compute for memory during the surrogate's forward passes.
        init_checkpoint: optional weights to start from.
        device: where to load (and quantise) the weights: ``None`` = transformers' default (CPU; Lightning
            moves the model later), ``"cuda"`` = this process's GPU (``cuda:$LOCAL_RANK``), so each DDP rank
            quantises straight onto its own GPU instead of holding a full-precision copy in host memory.
    """

    supports_kv_cache = False

    def __init__(
        self,
        path: str,
        mask_id: int | None = 126336,
        eos_id: int | None = 126081,
        pad_id: int | None = None,
        dtype: str = "bfloat16",
        trust_remote_code: bool = True,
        logits_shift: bool = False,
        quantization: QuantizationSettings | None = None,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        init_checkpoint: str | None = None,
        device: str | None = None,
    ) -> None:
        super().__init__()
        import os

        from transformers import AutoTokenizer

        from lit_rl.models.loading import enable_activation_checkpointing
        from lit_rl.models.quantization import disable_cpu_weight_packing

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.tokenizer.padding_side = "left"
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        quantized = quantization is not None and quantization.load_in_4bit
        if quantized:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type=quantization.quant_type,
                bnb_4bit_compute_dtype=getattr(torch, quantization.compute_dtype),
                bnb_4bit_use_double_quant=quantization.double_quant,
            )
        if device is not None:
            if device == "cuda" and torch.cuda.is_available():
                kwargs["device_map"] = {"": f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"}
            elif device != "cuda":
                kwargs["device_map"] = {"": device}
        self.model = self.load_model(path, trust_remote_code=trust_remote_code, **kwargs)
        # before any forward: eval-mode no-grad passes must not pack 4-bit weights (lit_rl.models.quantization)
        disable_cpu_weight_packing(self.model)
        # left padding: pass position ids from the attention mask when the architecture takes them (Dream does,
        # and its own generation derives them the same way; LLaDA's forward has no position_ids)
        self.accepts_position_ids = "position_ids" in inspect.signature(type(self.model).forward).parameters
        if str(getattr(self.model.config, "model_type", "")).lower() == "dream":
            self.mask_format = "additive_4d"
        if mask_id is not None:
            self.mask_id = check_token_id("policy.mask_id", int(mask_id), self.model.config, path)
        else:
            self.mask_id = mask_token_id(self.tokenizer, self.model.config, path)
        self.eos_id = int(eos_id if eos_id is not None else self.tokenizer.eos_token_id)
        tok_pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_id = int(pad_id if pad_id is not None else (tok_pad if tok_pad is not None else self.eos_id))
        self.logits_shift = logits_shift
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)
        if quantized and quantization.upcast_non_quantized:
            from peft import prepare_model_for_kbit_training

            # checkpointing is enabled below: LLaDA has no HF gradient_checkpointing_enable()
            self.model = prepare_model_for_kbit_training(self.model, use_gradient_checkpointing=False)
        elif quantized:
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.checkpointing = enable_activation_checkpointing(self.model) if gradient_checkpointing else None
        if lora is not None:
            self.model = apply_lora(self.model, lora)
        disable_cpu_weight_packing(self.model)
        # from_pretrained returns eval mode; Lightning keeps module modes, and LoRA dropout needs train mode
        self.model.train()

    def load_model(self, path: str, *, trust_remote_code: bool, **kwargs: Any) -> nn.Module:
        """The network: the checkpoint's own code through the transformers-5 shim
        (:mod:`lit_rl.models.remote_compat`), or ``AutoModel`` for architectures transformers ships."""
        if trust_remote_code:
            from lit_rl.models.remote_compat import load_remote_model

            return load_remote_model(path, **kwargs)
        from transformers import AutoModel

        return AutoModel.from_pretrained(path, **kwargs)
