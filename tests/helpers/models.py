"""Tiny models for the tests: one BERT builder (randomly initialised, seconds to build) for every test that needs a base."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers import FIXTURES as ROOT

FIXTURES = ROOT / "finetune"  # vocab.txt, pairs.tsv


def tiny_bert_config(vocab_size: int, **over):
    """A 2-layer, hidden-32 BERT config without dropout (`over` replaces any key)."""
    from transformers import BertConfig

    keys = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertConfig(vocab_size=vocab_size, **{**keys, **over})


def make_tiny_bert(path: Path, seed: int = 0, vocab: Path = FIXTURES / "vocab.txt", **over) -> Path:
    """A randomly initialised tiny BERT (`tiny_bert_config`) + a tokenizer over `vocab`, saved as safetensors."""
    from transformers import BertModel, BertTokenizerFast

    torch.manual_seed(seed)
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    BertModel(tiny_bert_config(tok.vocab_size, **over)).save_pretrained(str(path), safe_serialization=True)
    tok.save_pretrained(str(path))
    return path
