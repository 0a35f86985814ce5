"""A tiny chat model folder that vLLM serves offline: a byte-level BPE tokenizer trained on task prompts (with a
chat template, saved as a HF tokenizer) and a random ``LlamaForCausalLM`` (head_dim 32: vLLM's CPU attention
refuses 16), written with ``save_pretrained`` (safetensors). Nothing is downloaded.

Its text is noise by design, but noise of a known shape: every token's embedding carries the same constant in
dimension 0, which dominates the final RMS norm, so the next-token distribution is nearly the same at every
step: uniform over the vocabulary except EOS, whose logit is raised by ``eos_logit``. Completion lengths are
then geometric (mean ~ ``1 / P(EOS)`` tokens, cut at ``max_tokens``), so a length limit rejects some
candidates and not others, which is what the pool builder's filter and statistics need to measure.
"""

from __future__ import annotations

import math
from pathlib import Path

#: role markers and the end of a turn; EOS ends every completion
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus() -> list[str]:
    """Task prompts and length-control texts: what the tokenizer's merges are learnt from."""
    from lit_rl.pools.length_control import DEFAULT_INSTRUCTION, DEFAULT_REWRITE_PROMPT
    from lit_rl.tasks import CountdownTask, SudokuTask

    texts = [DEFAULT_INSTRUCTION, DEFAULT_REWRITE_PROMPT]
    for task in (SudokuTask(num_train=64), CountdownTask(num_train=64)):
        texts += [m["content"] for ex in task.train_examples() for m in task.messages(ex)]
    return texts


def build_tokenizer(vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with EOS/pad and the chat template (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                  additional_special_tokens=SPECIALS[2:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_tiny_chat_model(out: str | Path, *, mean_tokens: float = 20.0, seed: int = 0) -> Path:
    """Write the model folder to ``out`` (config, safetensors weights, tokenizer with chat template).

    ``mean_tokens``: the mean completion length without a ``max_tokens`` cut (sets EOS's probability).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tok = build_tokenizer()
    vocab = len(tok)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        # dimension 0 of the residual stream is ~1 everywhere (the rest ~0.02): after the final RMS norm it is
        # ~sqrt(hidden) and the logits are ~lm_head[:, 0] * sqrt(hidden), the same at every step
        model.model.embed_tokens.weight[:, 0] = 1.0
        h0 = math.sqrt(config.hidden_size)
        p_eos = 1.0 / mean_tokens
        eos_logit = math.log(p_eos * (vocab - 1) / (1.0 - p_eos))  # e^b / (e^b + V - 1) = p_eos
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tok.eos_token_id, 0] = eos_logit / h0
        model.lm_head.weight[tok.pad_token_id] = 0.0
        model.lm_head.weight[tok.pad_token_id, 0] = -30.0 / h0  # never sampled: it would vanish from the text
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
