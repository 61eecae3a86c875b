"""A small sequence-pair classifier (cross-encoder): from_base / load / fit / predict / save.

Inference is built for CPUs: identical pairs are scored once, pairs are tokenized once and batched by
length with dynamic padding, under torch.inference_mode, at an explicit precision (fp32, bf16 autocast, int8
dynamic quantization of Linear layers, or the OpenVINO path's openvino-bf16 / openvino-fp32); `auto` is the hardware's choice (encoders.hardware.probe_precision: flags, never a
timing), and benchmarks/extraction.py says which precision is fastest on a machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from medrank.encoders.hardware import PRECISIONS, PrecisionReport, probe_precision, resolve_device
from medrank.encoders.cross_encoder_training import (
    CrossEncoderTraining,
    Pair,
    check_pairs,
)
from medrank.encoders.low_precision import PrecisionCopies
from medrank.encoders.openvino_path import PairLogitsAndPooled, is_openvino
from medrank.encoders.weights import (
    ENCODER_META,
    model_fingerprint,
    quiet_transformers,
    read_json,
    resolve_model_path,
    save_checkpoint,
    verify_saved,
)
from medrank.encoders.runtime import set_seed
from medrank.encoders.batching import (
    dedup,
    length_sorted_batches,
    openvino_requests,
    padded_width,
)
from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)

META_FILE = ENCODER_META
PAD_MULTIPLE = 16
SMALL_CALL = 64  # unique pairs below which predict skips the precision probe


def _load_hf(path: Path, saved: bool = False, **kw: Any) -> tuple[torch.nn.Module, Any]:
    """Tokenizer + classifier from `path`. `saved` (a medrank fine-tune): every weight must come from the file, since a
    checkpoint without its classifier head would load with a random one (different outputs on every load)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with quiet_transformers():
        try:
            tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
            model, info = AutoModelForSequenceClassification.from_pretrained(
                str(path), use_safetensors=True, trust_remote_code=False, output_loading_info=True, **kw
            )
        except (OSError, ValueError, KeyError) as e:
            raise MedrankError(
                f"{path}: cannot load a sequence-pair classifier ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
            ) from None
    missing = sorted(info.get("missing_keys") or [])
    if saved and missing:
        raise MedrankError(
            f"{path}: {len(missing)} weights missing from the checkpoint (e.g. {missing[0]}): it would load with random ones"
        )
    return model.float(), tok


def label_index(label_names: Sequence[str], wanted: str, fallback: int) -> int:
    """Index of a label by name (case-insensitive prefix), else `fallback` (models saved with generic names)."""
    for i, n in enumerate(label_names):
        if str(n).lower().startswith(wanted):
            return i
    if fallback >= len(label_names):
        raise MedrankError(f"model labels {list(label_names)} have no '{wanted}'")
    return fallback


class CrossEncoder(PrecisionCopies, CrossEncoderTraining):
    """Sequence-pair classifier over a transformers checkpoint; probabilities (n, num_labels)."""

    def __init__(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any,
        *,
        max_length: int,
        label_names: Sequence[str],
        device: str | torch.device = "auto",
        precision: str = "auto",
        base_fingerprint: str | None = None,
        fingerprint: str | None = None,
        loader: Callable[[], tuple[torch.nn.Module, Any]] | None = None,
    ) -> None:
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        if model is None and loader is None:
            raise MedrankError("CrossEncoder needs a model or a loader")
        self._model = None if model is None else model.to(self.device).eval()
        self._tokenizer = tokenizer
        self._loader = loader  # `load(lazy=True)`: weights read at the first use of .model / .tokenizer
        self.max_length = int(max_length)
        self.label_names = list(label_names)
        self.requested_precision = precision
        self.precision_report: PrecisionReport | None = None
        self.base_fingerprint = base_fingerprint
        self._fingerprint = fingerprint  # of saved/loaded weights; None after training until saved
        self._int8_model: torch.nn.Module | None = None
        self.last_predict_stats: dict[str, float] = {}
        self.train_precision: str | None = None
        self.threads: int | None = None  # CPU threads chosen by fit's probe (None: torch's default)
        self.meta: dict[str, Any] = {}  # the saved metadata, when loaded
        self.path: Path | None = None  # the folder it was loaded from

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_base(
        cls,
        base_model: str,
        num_labels: int,
        max_length: int,
        device: str = "auto",
        seed: int = 13,
        label_names: Sequence[str] | None = None,
        precision: str = "auto",
    ) -> "CrossEncoder":
        """A fresh classifier head (seeded) on top of a base checkpoint (packaged default, folder, hub id)."""
        path = resolve_model_path(base_model)
        labels = list(label_names) if label_names else [str(i) for i in range(num_labels)]
        if len(labels) != num_labels:
            raise MedrankError(f"{len(labels)} label names for num_labels={num_labels}")
        set_seed(seed)  # the new head's init
        model, tok = _load_hf(
            path,
            num_labels=num_labels,
            id2label=dict(enumerate(labels)),
            label2id={n: i for i, n in enumerate(labels)},
            ignore_mismatched_sizes=True,  # a base with another head (e.g. NLI → RQE) gets a new one
        )
        fp = model_fingerprint(path)
        log.info(
            "cross-encoder from %s (fingerprint %s), %d labels, max_length %d", path, fp[:12], num_labels, max_length
        )
        return cls(
            model,
            tok,
            max_length=max_length,
            label_names=labels,
            device=device,
            precision=precision,
            base_fingerprint=fp,
        )

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        device: str = "auto",
        precision: str = "auto",
        lazy: bool = False,
        task: str | None = None,
    ) -> "CrossEncoder":
        """Load a model saved by `save` (its metadata and weights verified: `verify_saved`; `task`, e.g. "rqe", the
        role it must have been trained for). `lazy`: the weights (and transformers' model code, ~4 s) are read at the
        first use of `.model` / `.tokenizer`, so a caller whose pairs are all in a cache never pays for them; the
        fingerprint is checked here either way."""
        path = resolve_model_path(path)
        meta = verify_saved(path, task)
        fp = meta["fingerprint"]
        model, tok = (None, None) if lazy else _load_hf(path, saved=True)
        out = cls(
            model,
            tok,
            loader=(lambda: _load_hf(path, saved=True)) if lazy else None,
            max_length=meta["max_length"],
            label_names=meta["label_names"],
            device=device,
            precision=precision,
            base_fingerprint=meta.get("base_fingerprint"),
            fingerprint=fp,
        )
        out.meta = meta  # what `save(extra_meta=...)` added, e.g. the RQE recipe
        out.path = path
        return out

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            self._materialize()
        return self._model

    @model.setter
    def model(self, model: torch.nn.Module) -> None:
        self._model = model

    @property
    def tokenizer(self) -> Any:
        if self._model is None:
            self._materialize()
        return self._tokenizer

    def _materialize(self) -> None:
        model, self._tokenizer = self._loader()
        self._model = model.to(self.device).eval()
        log.info("loaded %s on first use", self.path)

    @property
    def hidden_size(self) -> int:
        """The encoder's width, from the loaded model or (lazy) its config.json."""
        if self._model is None and self.path is not None:
            return int(read_json(self.path / "config.json")["hidden_size"])
        return int(self.model.config.hidden_size)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def fingerprint(self) -> str:
        """Content id of the current weights (for caches): the saved fingerprint, else a hash of the tensors."""
        if self._fingerprint is None:
            import hashlib

            h = hashlib.sha256()
            for name, t in sorted(self.model.state_dict().items()):
                h.update(name.encode())
                h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
            h.update(repr((self.max_length, self.label_names)).encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------ tokenization / batching
    def _encode(self, pairs: Sequence[Pair]) -> dict[str, list[list[int]]]:
        a = [p[0] for p in pairs]
        b = [p[1] for p in pairs]
        enc = self.tokenizer(a, b, truncation="longest_first", max_length=self.max_length, padding=False)
        return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}

    def _width(self, enc: dict[str, list[list[int]]], idx: np.ndarray) -> int:
        # round widths up to a multiple of PAD_MULTIPLE: a few distinct shapes let oneDNN reuse its kernels
        # (bf16 on CPU re-JITs per new shape: 2.2 s/step with free widths vs 0.29 s/step with fixed ones)
        return padded_width(max(len(enc["input_ids"][i]) for i in idx), self.max_length, PAD_MULTIPLE)

    def _collate(
        self, enc: dict[str, list[list[int]]], idx: np.ndarray, width: int | None = None
    ) -> dict[str, torch.Tensor]:
        """The rows `idx` padded to `width` (default: theirs, _width)."""
        width = width or self._width(enc, idx)
        pad_id = self.tokenizer.pad_token_id or 0
        out: dict[str, torch.Tensor] = {}
        for key, fill in (("input_ids", pad_id), ("attention_mask", 0), ("token_type_ids", 0)):
            if key not in enc:
                continue
            arr = np.full((len(idx), width), fill, dtype=np.int64)
            for j, i in enumerate(idx):
                seq = enc[key][i]
                arr[j, : len(seq)] = seq
            out[key] = torch.from_numpy(arr).to(self.device)
        return out

    # ------------------------------------------------------------------ precision
    def _autocast(self, precision: str) -> contextlib.AbstractContextManager:
        if precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return torch.sigmoid(logits) if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)

    def resolve_precision(self, sample_pairs: Sequence[Pair] | None = None) -> str:
        """Decide (once) the inference precision; 'auto' probes a small batch of real pairs."""
        if self.precision_report is not None:
            return self.precision_report.choice
        forward = None
        if self.requested_precision == "auto" and sample_pairs:
            enc = self._encode(list(sample_pairs)[:16])
            batch = self._collate(enc, np.arange(len(enc["input_ids"])))

            def forward(p: str) -> torch.Tensor:
                m = self.inference_model(p)
                with torch.inference_mode(), self._autocast(p):
                    return self._probs(m(**batch).logits)

        self.model.eval()
        self.precision_report = probe_precision(self.device, self.requested_precision, forward=forward)
        if self.precision_report.choice != "int8":
            self._int8_model = None  # free the probe's quantized copy
        return self.precision_report.choice

    # ------------------------------------------------------------------ predict
    def _classifier_input_hook(self, model: torch.nn.Module, sink: list[torch.Tensor]):
        head = getattr(model, "classifier", None)
        if head is None:
            raise MedrankError(f"{type(model).__name__}: no `classifier` module to read pooled vectors from")

        def hook(_mod: torch.nn.Module, args: tuple) -> None:
            x = args[0]
            sink.append(x[:, 0] if x.dim() == 3 else x)  # RoBERTa-style heads take the sequence

        return head.register_forward_pre_hook(hook)

    def predict(
        self,
        pairs: Sequence[Pair],
        batch_size: int = 64,
        return_embeddings: bool = False,
        show_progress: bool = True,
        max_tokens: int | None = 16384,
        precision: str | None = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Probabilities (n, num_labels) in input order [+ pooled vectors (n, H) with return_embeddings].

        `precision` overrides the instance's (probed once on the first call with enough pairs).
        """
        pairs = check_pairs(pairs, "pairs")
        n = len(pairs)
        hidden = int(getattr(self.model.config, "hidden_size", 0))
        if n == 0:
            empty = np.zeros((0, self.num_labels), dtype=np.float32)
            return (empty, np.zeros((0, hidden), dtype=np.float32)) if return_embeddings else empty
        unique, inverse = dedup(pairs)
        enc = self._encode(unique)
        lengths = [len(x) for x in enc["input_ids"]]
        batches = length_sorted_batches(lengths, batch_size, max_tokens=max_tokens)
        if precision is not None and precision not in PRECISIONS:
            raise MedrankError(f"precision '{precision}': expected one of {', '.join(PRECISIONS)}")
        if precision is None:
            if self.requested_precision == "auto" and self.precision_report is None and len(unique) < SMALL_CALL:
                precision = "fp32"  # probing would cost more than it could save; probe on a larger call
            else:
                mid = batches[len(batches) // 2]
                precision = self.resolve_precision([unique[i] for i in mid])
        sink: list[torch.Tensor] = []
        handle = None
        requests = [(b, None) for b in batches]
        if is_openvino(precision):  # (logits, pooled) from one compiled graph, a batch per stream at once
            example = lambda: (PairLogitsAndPooled(self.model.eval()), self._collate(enc, batches[0][:2]))
            run = self.openvino_model(precision, example).map
            # a request per stream holds at most OPENVINO_REQUEST_TOKENS, each chunk at its batch's width (memory)
            requests = openvino_requests(batches, lambda b: self._width(enc, b))
        else:
            model = self.inference_model(precision)
            model.eval()
            handle = self._classifier_input_hook(model, sink) if return_embeddings else None
            run = lambda keyed: ((idx, (model(**batch).logits, sink[-1] if sink else None)) for idx, batch in keyed)
        t0 = time.perf_counter()  # after the one-off probe and conversion: pairs/s is the steady rate
        probs = np.zeros((len(unique), self.num_labels), dtype=np.float32)
        embs = np.zeros((len(unique), hidden), dtype=np.float32) if return_embeddings else None
        try:
            # one autocast region for every batch: it casts each fp32 weight to bf16 once and keeps the copy (a region
            # per batch re-cast all ~22M weights every batch); the casts are the same, so are the outputs' bits
            with (
                torch.inference_mode(),
                self._autocast(precision),
                tqdm(total=len(unique), unit="pair", desc="predict", disable=not show_progress, leave=False) as bar,
            ):
                for idx, (logits, pooled) in run((idx, self._collate(enc, idx, w)) for idx, w in requests):
                    probs[idx] = self._probs(logits).cpu().numpy()
                    if embs is not None:
                        embs[idx] = pooled.float().cpu().numpy()
                    sink.clear()
                    bar.update(len(idx))
        finally:
            if handle is not None:
                handle.remove()
        dt = time.perf_counter() - t0
        self.last_predict_stats = {
            "pairs": n,
            "unique_pairs": len(unique),
            "seconds": round(dt, 3),
            "pairs_per_s": round(len(unique) / dt, 1) if dt > 0 else float("inf"),
            "precision": precision,
        }
        log.info(
            "predicted %d pairs (%d unique) in %.1fs: %.1f pairs/s at %s",
            n,
            len(unique),
            dt,
            len(unique) / max(dt, 1e-9),
            precision,
        )
        if embs is not None:
            return probs[inverse], embs[inverse]
        return probs[inverse]

    # ------------------------------------------------------------------ save
    def save(self, path: str | os.PathLike, extra_meta: dict[str, Any] | None = None) -> str:
        """Write safetensors weights + tokenizer + medrank_encoder.json atomically; return the fingerprint."""
        meta = lambda fp: (
            META_FILE,
            {
                "label_names": self.label_names,
                "max_length": self.max_length,
                "fingerprint": fp,
                "base_fingerprint": self.base_fingerprint,
                "train_precision": self.train_precision,
                **(extra_meta or {}),
            },
        )
        fp = save_checkpoint(self.model, self.tokenizer, path, meta)
        self._fingerprint = fp
        log.info("saved cross-encoder to %s (fingerprint %s)", path, fp[:12])
        return fp
