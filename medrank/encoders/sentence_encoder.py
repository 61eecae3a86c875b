"""A bi-encoder: mean-pooled, L2-normalised sentence vectors (the sentence-transformers recipe) from a transformers
checkpoint, for the NLI grid prefilter and the zero-shot question-answer cosines."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from medrank.encoders.base import (
    LazyInt8,
    model_fingerprint,
    quiet_transformers,
    resolve_device,
    resolve_model_path,
)
from medrank.encoders.batching import length_sorted_batches, padded_width


class SentenceEncoder(LazyInt8):
    """Mean-pooled, L2-normalised sentence embeddings; `encode(texts, precision)` -> (n, H) float32."""

    def __init__(self, name_or_path: str, device: str = "auto", max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = resolve_model_path(name_or_path)
        self.device = resolve_device(device)
        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModel.from_pretrained(str(path), use_safetensors=True).float().to(self.device).eval()
        self.max_length = int(max_length)
        self.fingerprint = model_fingerprint(path)
        self.hidden = int(self.model.config.hidden_size)
        self._int8_model: torch.nn.Module | None = None

    def encode(self, texts: Sequence[str], precision: str = "fp32", batch_size: int = 128) -> np.ndarray:
        """(n, H) float32 unit vectors, in input order; length-sorted batches under inference_mode."""
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False)
        ids = enc["input_ids"]
        model = self.inference_model(precision)
        cast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
        with torch.inference_mode(), cast:
            for idx in length_sorted_batches([len(x) for x in ids], batch_size, max_tokens=16384):
                width = padded_width(max(len(ids[i]) for i in idx), self.max_length)
                input_ids = np.zeros((len(idx), width), dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for r, i in enumerate(idx):
                    input_ids[r, : len(ids[i])] = ids[i]
                    mask[r, : len(ids[i])] = 1
                t_ids = torch.from_numpy(input_ids).to(self.device)
                t_mask = torch.from_numpy(mask).to(self.device)
                hidden = model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.float()
                m = t_mask.unsqueeze(-1).float()
                emb = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
                out[idx] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out
