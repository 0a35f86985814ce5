"""lit_rl/models/loading.py: which Linear is the LM head (LoRA leaves it out), and activation checkpointing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from lit_rl.models import TinyDiffusionLM
from lit_rl.models.loading import enable_activation_checkpointing, lora_excluded_modules


def _tiny(architecture: str) -> nn.Module:
    return TinyDiffusionLM(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=64,
                           architecture=architecture).model


def test_the_head_is_the_models_own_output_embedding_when_it_names_one():
    bert = _tiny("bert")  # transformers' BertForMaskedLM: get_output_embeddings() is the decoder
    assert lora_excluded_modules(bert) == ["cls.predictions.decoder"]
    llada = _tiny("llada")  # lit_rl's native LLaDA: one Linear out to the vocabulary
    (name,) = lora_excluded_modules(llada)
    assert dict(llada.named_modules())[name] is llada.get_output_embeddings()


def test_without_an_output_embedding_the_head_is_every_linear_out_to_the_vocabulary():
    class RemoteCode(nn.Module):  # a model that does not say which module is its head
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(vocab_size=11, embedding_size=12)  # LLaDA pads its embedding
            self.up, self.head, self.padded = nn.Linear(4, 8), nn.Linear(8, 11), nn.Linear(8, 12)

    assert lora_excluded_modules(RemoteCode()) == ["head", "padded"]


def test_activation_checkpointing_uses_hf_where_declared_and_names_the_field_otherwise():
    import warnings

    bert = _tiny("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers' current name, not its deprecated alias
        assert enable_activation_checkpointing(bert) == "hf"
    assert any(getattr(m, "gradient_checkpointing", False) for m in bert.modules())
    with pytest.raises(ValueError, match="policy.gradient_checkpointing: Linear supports neither"):
        enable_activation_checkpointing(nn.Linear(2, 2))
