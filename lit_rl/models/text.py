"""Text <-> token ids for policies (shared by the dLLM and the causal LM policies).

:class:`TextPolicy` is a mixin: the class using it sets ``self.tokenizer`` (a transformers tokenizer with a
chat template), ``self.eos_id``, ``self.pad_id`` and ``self.model``. Prompts are rendered with the chat
template and left-padded; completions are cut at their first EOS, and "completion length" counts the tokens
up to and including it (ERILS §2, the completion mask).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["TextPolicy"]


class TextPolicy:
    """Prompt/completion encoding, decoding and checkpoint loading (mixin; see the module docstring)."""

    tokenizer: Any
    eos_id: int
    pad_id: int

    def encode_prompts(self, messages: Sequence[list[dict[str, str]]], max_prompt_len: int | None = None,
                       truncated: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Render chat prompts and left-pad them: ``(ids (B, P), mask (B, P))``.

        Prompts longer than ``max_prompt_len`` keep their last ``max_prompt_len`` tokens (as TRL does); the
        index of each such prompt is appended to ``truncated`` when given (the data modules count and warn).
        """
        rows: list[list[int]] = []
        for i, msgs in enumerate(messages):
            text = self.tokenizer.apply_chat_template(list(msgs), tokenize=False, add_generation_prompt=True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if max_prompt_len is not None and len(ids) > max_prompt_len:
                ids = ids[-max_prompt_len:]
                if truncated is not None:
                    truncated.append(i)
            rows.append(ids)
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                out[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
                mask[i, width - len(r):] = 1
        return out, mask

    def encode_completions(self, texts: Sequence[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise completions, append EOS, cut to ``length`` and fill the rest with EOS.

        Returns ``(ids (B, length), lengths (B,))`` where ``lengths`` counts tokens up to and including
        the first EOS (or ``length`` for a completion cut before its EOS).
        """
        ids = torch.full((len(texts), length), self.eos_id, dtype=torch.long)
        lengths = torch.zeros(len(texts), dtype=torch.long)
        for i, t in enumerate(texts):
            toks = self.tokenizer(t, add_special_tokens=False)["input_ids"][: length - 1] + [self.eos_id]
            toks = toks[:length]
            ids[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            lengths[i] = len(toks)
        return ids, lengths

    def completion_lengths(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """Tokens up to and including the first EOS, ``(B,)``; no EOS → full width."""
        is_eos = completion_ids == self.eos_id  # (B, L)
        L = completion_ids.shape[1]
        first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1),
                            torch.full_like(is_eos[:, 0], L - 1, dtype=torch.long))
        return first + 1  # (B,)

    def decode_completions(self, completion_ids: torch.Tensor) -> list[str]:
        """Text of each completion up to (excluding) its first EOS; special tokens dropped."""
        lengths = self.completion_lengths(completion_ids)
        out = []
        for row, n in zip(completion_ids.tolist(), lengths.tolist()):
            cut = row[:n]
            if cut and cut[-1] == self.eos_id:
                cut = cut[:-1]
            out.append(self.tokenizer.decode(cut, skip_special_tokens=True))
        return out

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", type(self.tokenizer).__name__))

    def load_init_checkpoint(self, path: str | Path) -> None:
        """Load model weights from a ``torch.save``'d state dict or a Lightning checkpoint."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if "state_dict" in state:  # Lightning checkpoint: keys prefixed "policy."
            state = {k.removeprefix("policy."): v for k, v in state["state_dict"].items() if k.startswith("policy.")}
            missing, unexpected = self.load_state_dict(state, strict=False)
        else:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(f"init_checkpoint {path}: unexpected keys {unexpected[:5]}")
