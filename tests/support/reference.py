"""Tiny random checkpoints built from the OFFICIAL LLaDA / Dream remote code in ``../shared/reference_models``.

These are the real clients: the modeling files users load with ``trust_remote_code=True``, only shrunk
(d_model 64, 2 layers, 4 heads, a ~128-token character vocabulary). ``tiny_official_llada(out)`` copies
``modeling_llada.py`` / ``configuration_llada.py``, shrinks the official ``config.json`` (``mask_token_id``
remapped into the tiny vocabulary), writes a character tokenizer with LLaDA's special token strings and
the official chat template (from ``tokenizer_config.json``; like the official tokenizer it has NO mask
token), and random weights through the remote code's own ``save_pretrained``. ``tiny_official_dream``
does the same for Dream from ``DreamConfig`` with small sizes. Tests skip when the folder is absent (a
user's clone has no ``../shared``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT.parent / "shared" / "reference_models"
LLADA_DIR = REFERENCE / "llada-8b-instruct"
DREAM_DIR = REFERENCE / "dream-v0-instruct-7b"

# LLaDA's special token strings, in tiny ids 0..6 (official: 126081, 126080, 126336, 126348, 126346, 126347)
LLADA_SPECIALS = ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|unk|>"]
# Dream's (Qwen2) special strings (official: mask 151666, eos <|endoftext|> 151643, im_start/im_end)
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|beginoftext|>", "<|unk|>"]
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
VOCAB = 128
DREAM_ROPE_THETA = 1_000_000.0  # Dream-v0-Instruct-7B's (DreamConfig's default is 10,000)


def require(folder: Path) -> None:
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (the official remote code lives in ../shared, not in a user's clone)")


def _char_tokenizer(specials: list[str], *, mask: str | None, chat_template: str, bos: str, extra: list[str]):
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    try:
        from remote_code_fixture import char_tokenizer
    finally:
        sys.path.pop(0)
    return char_tokenizer(
        specials, vocab_size=VOCAB, bos=bos, eos="<|endoftext|>", pad="<|endoftext|>", unk="<|unk|>", mask=mask,
        additional=extra, chat_template=chat_template,
    )


def _save_random(out: Path, seed: int) -> Path:
    from lit_rl.models.remote_compat import (
        compat_class, default_rope_registered, prepare_config, remote_config, remote_model_class)

    config = prepare_config(remote_config(str(out)))
    cls = compat_class(remote_model_class(config, str(out)))
    with torch.random.fork_rng(devices=[]), default_rope_registered():
        torch.manual_seed(seed)
        model = cls(config)
        with torch.no_grad():  # matrices N(0, 0.1), norms and biases 1 + N(0, 0.1): inputs change logits visibly
            for p in model.parameters():
                noise = 0.1 * torch.randn(p.shape)
                p.copy_(noise if p.dim() > 1 else 1.0 + noise)
    model.save_pretrained(out, safe_serialization=True)
    return out


def tiny_official_llada(out: Path, seed: int = 0) -> Path:
    """Write a tiny random LLaDA-8B-Instruct look-alike built from the official files to ``out``."""
    require(LLADA_DIR)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("modeling_llada.py", "configuration_llada.py"):
        shutil.copy(LLADA_DIR / name, out / name)
    config = json.loads((LLADA_DIR / "config.json").read_text())
    # rope_theta / eps / n_kv_heads differ from both the 8B's and the config classes' defaults, so a native
    # implementation that ignored one of them would fail the parity tests
    config.update(
        d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=96, vocab_size=VOCAB, embedding_size=VOCAB,
        max_sequence_length=512, rope_theta=12345.0, rms_norm_eps=1e-6,
        mask_token_id=LLADA_SPECIALS.index("<|mdm_mask|>"),
        eos_token_id=LLADA_SPECIALS.index("<|endoftext|>"), pad_token_id=LLADA_SPECIALS.index("<|endoftext|>"),
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    official = json.loads((LLADA_DIR / "tokenizer_config.json").read_text())
    tok = _char_tokenizer(
        LLADA_SPECIALS, mask=None, chat_template=official["chat_template"], bos="<|startoftext|>",
        extra=["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
    )
    tok.save_pretrained(out)
    return _save_random(out, seed)


def tiny_official_dream(out: Path, seed: int = 0) -> Path:
    """Write a tiny random Dream-v0-Instruct look-alike built from the official files to ``out``."""
    require(DREAM_DIR)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("modeling_dream.py", "configuration_dream.py", "generation_utils.py"):
        shutil.copy(DREAM_DIR / name, out / name)
    config = {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rope_theta": DREAM_ROPE_THETA,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "use_cache": False, "use_sliding_window": False,
        "mask_token_id": DREAM_SPECIALS.index("<|mask|>"), "pad_token_id": 0, "eos_token_id": 0, "bos_token_id": 4,
        "attention_dropout": 0.0, "hidden_act": "silu", "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok = _char_tokenizer(
        DREAM_SPECIALS, mask="<|mask|>", chat_template=DREAM_CHAT_TEMPLATE, bos="<|beginoftext|>",
        extra=["<|im_start|>", "<|im_end|>"],
    )
    tok.save_pretrained(out)
    return _save_random(out, seed)


def left_padded(seed: int = 0, lens=(11, 7, 4), vocab: int = 128):
    """Rows of ``lens`` random tokens, left-padded to the longest: ``(rows, ids (B, T), mask (B, T))``."""
    g = torch.Generator().manual_seed(seed)
    T = max(lens)
    rows = [torch.randint(7, vocab, (L,), generator=g) for L in lens]
    ids = torch.zeros(len(lens), T, dtype=torch.long)
    mask = torch.zeros(len(lens), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return rows, ids, mask
