"""A character-level tokenizer built in code (no download), for tiny offline models.

Every printable ASCII character is one token; the format tags ``<reasoning>``, ``</reasoning>``,
``<answer>``, ``</answer>`` are single tokens so short completions stay short. Special tokens:
``[PAD] [UNK] [MASK] [EOS] [BOS]``. The chat template renders the system and user messages as plain
lines, so the same ``apply_chat_template`` path serves tiny and real models.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[MASK]", "[EOS]", "[BOS]"]
FORMAT_TAGS = ["<reasoning>", "</reasoning>", "<answer>", "</answer>"]
_CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]

# system (if any) and user contents, one per line; the completion starts right after.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny character tokenizer (deterministic: same ids on every machine)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + FORMAT_TAGS + _CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        eos_token="[EOS]",
        bos_token="[BOS]",
    )
    tok.add_tokens(FORMAT_TAGS)  # already in the vocab: makes them atomic in the pre-tokenizer
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    tok.name_or_path = "lit_rl/char"
    return tok
