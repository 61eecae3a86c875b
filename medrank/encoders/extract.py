"""Cached, batched extraction of cross-encoder outputs, and the NLI sentence grids of the paper (Section 4.5).

`extract_pairs` is a pure function over a batch of text pairs (in: pairs + a loaded model; out: arrays), so the
same code can run inside a distributed map (e.g. Ray Data with an actor per GPU); `cached_extract` wraps it
with the content-addressed parquet cache so an experiment computes only pairs it has not seen.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from medrank.encoders.base import cpu_flags, model_fingerprint, resolve_device, resolve_model_path
from medrank.encoders.batching import dedup, length_sorted_batches
from medrank.encoders.cache import PairCache, existing_precisions, namespace_name, pair_key
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.errors import MedrankError

log = logging.getLogger(__name__)

Pair = tuple[str, str]
TRAIN_SPLITS = ("train_liveqa", "train_alexa")

# data/processed/embeddings/nli_grid.parquet: one row per (candidate answer A, entailed answer E).
# Cell (i, j) of the n_rows x n_cols grid pairs sentence i of A (hypothesis) with sentence e_index[i, j] of E
# (premise): "does the entailed answer support this sentence of the candidate". Lists are row-major flat.
NLI_GRID = pa.schema(
    [
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("entailed_kind", pa.string()),  # rqe (MedQuAD answer of an entailed question) | augment (higher-ranked candidate)
        ("entailed_rank", pa.int16()),  # rqe: retrieval rank 1..N; augment: reference rank of the entailed candidate
        ("entailed_id", pa.string()),  # rqe: MedQuAD qa_id; augment: aid
        ("n_sentences_a", pa.int16()),  # sentences in A before the max_sentences cap
        ("n_sentences_e", pa.int16()),
        ("n_rows", pa.int16()),  # sentences of A in the grid (<= max_sentences)
        ("n_cols", pa.int16()),  # sentences of E per row (<= prefilter_top_k, <= max_sentences)
        ("e_index", pa.list_(pa.int16())),  # n_rows*n_cols: which sentence of E each cell holds (ascending per row)
        ("p_entail", pa.list_(pa.float32())),  # n_rows*n_cols NLI probabilities
        ("p_neutral", pa.list_(pa.float32())),
        ("p_contradiction", pa.list_(pa.float32())),
        ("nli_cls", pa.list_(pa.float16())),  # n_rows*n_cols*hidden pooled [CLS] vectors
        ("anli", pa.float32()),  # mean over rows of max over the row of p_entail (0 when A has no sentence)
    ]
)


def embeddings_rqe_schema(hidden: int) -> pa.Schema:
    """data/processed/embeddings/rqe.parquet: one row per retrieved (question, entailed MedQuAD question)."""
    return pa.schema(
        [
            ("split", pa.string()),
            ("qid", pa.string()),
            ("rank", pa.int16()),
            ("qa_id", pa.string()),
            ("rqe_score", pa.float32()),
            ("rqe_cls", pa.list_(pa.float16(), hidden)),
        ]
    )


# ---------------------------------------------------------------------- pure batch function
def extract_pairs(encoder: CrossEncoder, pairs: Sequence[Pair], precision: str, batch_size: int = 64) -> dict[str, np.ndarray]:
    """Probabilities (n, num_labels) float32 and pooled [CLS] vectors (n, H) float16 for a batch of pairs."""
    probs, cls = encoder.predict(pairs, batch_size=batch_size, return_embeddings=True, show_progress=False, precision=precision)
    return {"probs": probs.astype(np.float32), "cls": cls.astype(np.float16)}


@dataclass
class ExtractStats:
    """What one cached extraction did: requested pairs, unique, found in cache, computed, speed."""

    kind: str
    namespace: str
    precision: str
    pairs: int = 0
    unique: int = 0
    cached: int = 0
    computed: int = 0
    seconds: float = 0.0
    pairs_per_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_precision(
    encoder: CrossEncoder | "SentenceEncoder", requested: str, cache_root: str | os.PathLike, kind: str, sample_pairs: Sequence[Pair]
) -> str:
    """'auto' reuses the precision of an existing cache for this model (no recompute), else probes."""
    chosen = requested
    if requested == "auto":
        have = [p for p in existing_precisions(cache_root, kind, encoder.fingerprint, encoder.max_length)
                if p != "int8" or encoder.device.type == "cpu"]  # fmt: skip
        if not have:
            return encoder.resolve_precision(list(sample_pairs)[:256]) if isinstance(encoder, CrossEncoder) else "fp32"
        chosen = have[0]
        log.info("%s: reusing the cached precision %s (no probe)", kind, chosen)
    return chosen


def open_cache(encoder: CrossEncoder, kind: str, cache_root: str | os.PathLike, precision: str) -> PairCache:
    """The cache namespace of this model at this precision: probs (num_labels) float32 + cls (H) float16."""
    hidden = int(encoder.model.config.hidden_size)
    ns = namespace_name(kind, encoder.fingerprint, precision, encoder.max_length)
    meta = {"kind": kind, "fingerprint": encoder.fingerprint, "precision": precision, "max_length": encoder.max_length,
            "label_names": list(encoder.label_names)}  # fmt: skip
    return PairCache(cache_root, ns, {"probs": ((encoder.num_labels,), np.float32), "cls": ((hidden,), np.float16)}, meta)


def cached_extract(
    encoder: CrossEncoder,
    pairs: Sequence[Pair],
    cache: PairCache,
    precision: str,
    *,
    batch_size: int = 64,
    shard_size: int = 4096,
    desc: str = "extract",
    show_progress: bool = True,
) -> tuple[dict[str, np.ndarray], ExtractStats]:
    """Outputs for `pairs` in input order; only pairs missing from `cache` are computed, one shard per chunk."""
    stats = ExtractStats(kind=desc, namespace=cache.dir.name, precision=precision, pairs=len(pairs))
    unique, inverse = dedup([(a, b) for a, b in pairs])
    keys = [pair_key(a, b) for a, b in unique]
    stats.unique = len(unique)
    todo_keys = set(cache.missing(keys))
    todo = [i for i, k in enumerate(keys) if k in todo_keys]
    stats.cached = len(unique) - len(todo)
    # chunks of similar length (longest first): each shard's batches pad little, and the bar's rate is honest
    todo.sort(key=lambda i: -(len(unique[i][0]) + len(unique[i][1])))
    t0 = time.perf_counter()
    with tqdm(total=len(todo), unit="pair", desc=desc, disable=not show_progress or not todo, smoothing=0.1) as bar:
        for s in range(0, len(todo), shard_size):
            chunk = todo[s : s + shard_size]
            out = extract_pairs(encoder, [unique[i] for i in chunk], precision, batch_size)
            cache.put([keys[i] for i in chunk], out)
            stats.computed += len(chunk)
            bar.update(len(chunk))
    stats.seconds = round(time.perf_counter() - t0, 2)
    stats.pairs_per_s = round(stats.computed / stats.seconds, 1) if stats.computed and stats.seconds > 0 else 0.0
    log.info(
        "%s: %d pairs, %d unique, %d cached, %d computed (%.1f pairs/s, %s)",
        desc, stats.pairs, stats.unique, stats.cached, stats.computed, stats.pairs_per_s, precision,
    )  # fmt: skip
    got = cache.get(keys) if keys else {k: np.zeros((0, *s), d) for k, (s, d) in cache.columns.items()}
    return {k: v[inverse] for k, v in got.items()}, stats


def precision_check(encoder: CrossEncoder, pairs: Sequence[Pair], precision: str, batch_size: int = 64) -> dict[str, float]:
    """max |Δp| (and max |Δcls|) of `precision` against fp32 on a sample of real pairs."""
    if precision == "fp32" or not pairs:
        return {"pairs": 0, "max_abs_prob_diff": 0.0, "max_abs_cls_diff": 0.0}
    ref = extract_pairs(encoder, pairs, "fp32", batch_size)
    got = extract_pairs(encoder, pairs, precision, batch_size)
    return {
        "pairs": len(pairs),
        "max_abs_prob_diff": round(float(np.abs(ref["probs"] - got["probs"]).max()), 6),
        "max_abs_cls_diff": round(float(np.abs(ref["cls"].astype(np.float32) - got["cls"].astype(np.float32)).max()), 6),
    }


def bf16_is_fast(device: torch.device) -> bool:
    """bf16 has native kernels here (CUDA, or a CPU with AVX-512-BF16/AMX); elsewhere it is emulated and slow."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


# ---------------------------------------------------------------------- bi-encoder (prefilter)
class SentenceEncoder:
    """Mean-pooled, L2-normalised sentence embeddings (sentence-transformers bi-encoder recipe), for the prefilter."""

    def __init__(self, name_or_path: str, device: str = "auto", max_length: int = 128) -> None:
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as tlog

        path = resolve_model_path(name_or_path)
        self.device = resolve_device(device)
        level, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModel.from_pretrained(str(path), use_safetensors=True).float().to(self.device).eval()
        finally:
            tlog.set_verbosity(level)
            if bars:
                tlog.enable_progress_bar()
        self.max_length = int(max_length)
        self.fingerprint = model_fingerprint(path)
        self.hidden = int(self.model.config.hidden_size)
        self._int8: torch.nn.Module | None = None

    def _module(self, precision: str) -> torch.nn.Module:
        if precision != "int8":
            return self.model
        if self._int8 is None:
            import copy
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao deprecation notice
                self._int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(self.model).cpu().eval(), {torch.nn.Linear}, dtype=torch.qint8)
        return self._int8

    def encode(self, texts: Sequence[str], precision: str = "fp32", batch_size: int = 128) -> np.ndarray:
        """(n, H) float32 unit vectors, in input order; length-sorted batches under inference_mode."""
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False)
        ids = enc["input_ids"]
        model = self._module(precision)
        cast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
        with torch.inference_mode(), cast:
            for idx in length_sorted_batches([len(x) for x in ids], batch_size, max_tokens=16384):
                # widths rounded up to a multiple of 16: few distinct shapes, so oneDNN reuses its kernels
                width = max(len(ids[i]) for i in idx)
                width = min(-(-width // 16) * 16, max(width, self.max_length))
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


def cached_sentence_embeddings(
    bi: SentenceEncoder, texts: Sequence[str], cache_root: str | os.PathLike, precision: str, batch_size: int = 128, shard_size: int = 16384
) -> tuple[np.ndarray, ExtractStats]:
    """Bi-encoder vectors (n, H) float32 for `texts`, cached content-addressed like the pairs."""
    ns = namespace_name("bi", bi.fingerprint, precision, bi.max_length)
    cache = PairCache(cache_root, ns, {"emb": ((bi.hidden,), np.float16)}, {"kind": "bi", "fingerprint": bi.fingerprint, "precision": precision})
    unique, inverse = dedup(list(texts))
    keys = [pair_key(t, "") for t in unique]
    todo = [i for i, k in enumerate(keys) if k not in cache]
    stats = ExtractStats("bi-encoder", ns, precision, len(texts), len(unique), len(unique) - len(todo))
    t0 = time.perf_counter()
    with tqdm(total=len(todo), unit="sent", desc="bi-encoder", disable=not todo, smoothing=0.1) as bar:
        for s in range(0, len(todo), shard_size):
            chunk = todo[s : s + shard_size]
            emb = bi.encode([unique[i] for i in chunk], precision, batch_size)
            cache.put([keys[i] for i in chunk], {"emb": emb.astype(np.float16)})
            stats.computed += len(chunk)
            bar.update(len(chunk))
    stats.seconds = round(time.perf_counter() - t0, 2)
    stats.pairs_per_s = round(stats.computed / stats.seconds, 1) if stats.computed and stats.seconds > 0 else 0.0
    if not keys:
        return np.zeros((len(texts), bi.hidden), dtype=np.float32), stats
    emb = cache.get(keys)["emb"].astype(np.float32)
    return emb[inverse], stats


# ---------------------------------------------------------------------- grids
def select_columns(emb_a: np.ndarray, emb_e: np.ndarray, top_k: int | None) -> np.ndarray:
    """For each sentence of A, the indices (ascending) of its `top_k` most cosine-similar sentences of E.

    top_k None (or >= |E|) keeps every sentence of E: the full grid. Ties go to the earlier sentence.
    """
    a, e = len(emb_a), len(emb_e)
    k = e if top_k is None else min(int(top_k), e)
    if a == 0 or k == 0:
        return np.zeros((a, k), dtype=np.int64)
    if k == e:
        return np.tile(np.arange(e), (a, 1))
    sim = emb_a @ emb_e.T
    top = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return np.sort(top, axis=1)


def anli_score(p_entail: np.ndarray) -> float:
    """ANLI(A, E) = mean over sentences of A of the max over (selected) sentences of E of P(entail)."""
    p = np.asarray(p_entail, dtype=np.float64)
    if p.size == 0:
        return 0.0
    return float(p.max(axis=1).mean())


def answer_pairs(answers: pd.DataFrame, retrieved: pd.DataFrame, augment_top: int) -> pd.DataFrame:
    """Every (candidate answer, entailed answer) pair: each candidate with each retrieved MedQuAD answer of its
    question, plus (train splits only) the paper's augmentation: each of a question's `augment_top` best
    reference-ranked candidates as the entailed answer of every lower-ranked candidate.

    `answers` needs split, qid, aid, sentences (+ reference_rank); `retrieved` split, qid, rank, qa_id, sentences.
    """
    cols = ["split", "qid", "aid", "entailed_kind", "entailed_rank", "entailed_id", "sentences_a", "sentences_e"]
    cand = answers[["split", "qid", "aid", "sentences"]].rename(columns={"sentences": "sentences_a"})
    ret = retrieved[["split", "qid", "rank", "qa_id", "sentences"]].rename(
        columns={"rank": "entailed_rank", "qa_id": "entailed_id", "sentences": "sentences_e"}
    )
    rqe = cand.merge(ret, on=["split", "qid"], how="inner", sort=False)
    rqe["entailed_kind"] = "rqe"
    parts = [rqe[cols]]
    if augment_top > 0:
        train = answers[answers["split"].isin(TRAIN_SPLITS)]
        rows = []
        for (split, qid), g in train.groupby(["split", "qid"], sort=True):
            g = g.sort_values(["reference_rank", "aid"], kind="stable")
            aids, sents, ranks = g["aid"].tolist(), g["sentences"].tolist(), g["reference_rank"].tolist()
            for lo in range(1, len(g)):
                for hi in range(min(lo, augment_top)):
                    rows.append((split, qid, aids[lo], "augment", int(ranks[hi]), aids[hi], sents[lo], sents[hi]))
        parts.append(pd.DataFrame(rows, columns=cols))
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["split", "qid", "aid", "entailed_kind", "entailed_rank"], kind="stable", ignore_index=True)


@dataclass
class GridPlan:
    """The cells of every answer pair's grid: (premise, hypothesis) texts and where each grid starts."""

    cells: list[Pair]  # premise = sentence of E, hypothesis = sentence of A
    offsets: np.ndarray  # grid r's cells are cells[offsets[r]:offsets[r+1]]
    shapes: np.ndarray  # (n_pairs, 2): n_rows, n_cols
    e_index: list[np.ndarray]


def plan_grids(
    pairs: pd.DataFrame, max_sentences: int, top_k: int | None, sentence_vectors: dict[str, np.ndarray] | None
) -> GridPlan:
    """Cap both sides at `max_sentences` (leading sentences) and keep each A-sentence's top_k E-sentences."""
    cells: list[Pair] = []
    offsets = [0]
    shapes = np.zeros((len(pairs), 2), dtype=np.int64)
    e_index: list[np.ndarray] = []
    for r, (sa, se) in enumerate(zip(pairs["sentences_a"], pairs["sentences_e"])):
        sa, se = list(sa)[:max_sentences], list(se)[:max_sentences]
        if top_k is not None and top_k < len(se) and sa:
            if sentence_vectors is None:
                raise MedrankError("plan_grids: prefilter_top_k needs sentence vectors")
            sel = select_columns(np.stack([sentence_vectors[s] for s in sa]), np.stack([sentence_vectors[s] for s in se]), top_k)
        else:
            sel = select_columns(np.zeros((len(sa), 1)), np.zeros((len(se), 1)), None)
        for i, row in enumerate(sel):
            cells.extend((se[j], sa[i]) for j in row)
        shapes[r] = sel.shape
        e_index.append(sel)
        offsets.append(len(cells))
    return GridPlan(cells, np.asarray(offsets, dtype=np.int64), shapes, e_index)


def label_index(label_names: Sequence[str], wanted: str, fallback: int) -> int:
    """Index of a label by name (case-insensitive prefix), else `fallback` (models saved with generic names)."""
    for i, n in enumerate(label_names):
        if str(n).lower().startswith(wanted):
            return i
    if fallback >= len(label_names):
        raise MedrankError(f"model labels {list(label_names)} have no '{wanted}'")
    return fallback


def grid_table(pairs: pd.DataFrame, plan: GridPlan, probs: np.ndarray, cls: np.ndarray, label_names: Sequence[str]) -> pd.DataFrame:
    """Assemble NLI_GRID rows from the plan and the per-cell outputs (probs (n_cells, 3), cls (n_cells, H))."""
    ie = label_index(label_names, "entail", 0)
    ine = label_index(label_names, "neutral", 1)
    ic = label_index(label_names, "contradict", 2)
    rows: dict[str, list] = {k: [] for k in ("e_index", "p_entail", "p_neutral", "p_contradiction", "nli_cls", "anli")}
    for r in range(len(pairs)):
        s, e = plan.offsets[r], plan.offsets[r + 1]
        n_rows, n_cols = plan.shapes[r]
        pe = probs[s:e, ie]
        rows["e_index"].append(plan.e_index[r].reshape(-1).astype(np.int16))
        rows["p_entail"].append(pe)
        rows["p_neutral"].append(probs[s:e, ine])
        rows["p_contradiction"].append(probs[s:e, ic])
        rows["nli_cls"].append(cls[s:e].reshape(-1))
        rows["anli"].append(anli_score(pe.reshape(n_rows, n_cols)) if e > s else 0.0)
    out = pairs[["split", "qid", "aid", "entailed_kind", "entailed_rank", "entailed_id"]].copy()
    out["n_sentences_a"] = pairs["sentences_a"].map(len).astype(np.int16)
    out["n_sentences_e"] = pairs["sentences_e"].map(len).astype(np.int16)
    out["n_rows"] = plan.shapes[:, 0].astype(np.int16)
    out["n_cols"] = plan.shapes[:, 1].astype(np.int16)
    for k, v in rows.items():
        out[k] = v
    out["anli"] = out["anli"].astype(np.float32)
    return out.reset_index(drop=True)


def nli_grids(
    pairs: pd.DataFrame,
    model: CrossEncoder,
    precision: str,
    cache_root: str | os.PathLike,
    *,
    max_sentences: int,
    top_k: int | None,
    bi: SentenceEncoder | None = None,
    batch_size: int = 64,
    bi_batch_size: int = 128,
    shard_size: int = 4096,
    show_progress: bool = True,
) -> tuple[pd.DataFrame, GridPlan, dict[str, ExtractStats]]:
    """NLI_GRID rows for answer pairs (from `answer_pairs`): prefilter, plan, cached extraction, assembly."""
    stats: dict[str, ExtractStats] = {}
    vectors = None
    if top_k is not None:
        if bi is None:
            raise MedrankError("nli_grids: prefilter_top_k needs a bi-encoder")
        sents = sorted({s for col in ("sentences_a", "sentences_e") for ss in pairs[col] for s in list(ss)[:max_sentences]})
        # the prefilter only ranks sentences, so the cross-encoder's precision is good enough for it
        emb, stats["bi_encoder"] = cached_sentence_embeddings(bi, sents, cache_root, precision, bi_batch_size)
        vectors = dict(zip(sents, emb))
    plan = plan_grids(pairs, max_sentences, top_k, vectors)
    log.info("%d grid cells (%.1f per answer pair)", len(plan.cells), len(plan.cells) / max(len(pairs), 1))
    cache = open_cache(model, "nli", cache_root, precision)
    out, stats["nli"] = cached_extract(
        model, plan.cells, cache, precision, batch_size=batch_size, shard_size=shard_size, desc="nli", show_progress=show_progress
    )
    cache.release()
    return grid_table(pairs, plan, out["probs"], out["cls"], model.label_names), plan, stats
