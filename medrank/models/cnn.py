"""Severyn & Moschitti (SIGIR 2015) convolutional re-ranker for short text pairs.

Question and document each go through their own wide convolution (width m, n filters, ReLU) and
max pooling → x_q, x_d; their similarity is the bilinear x_qᵀ M x_d; the join
[x_q; sim; x_d; extra features] feeds a hidden layer and a 2-way softmax trained with cross-entropy.
Trainable set θ = {F_q, b_q, F_d, b_d, M, w_h, b_h, w_s, b_s} plus the word-overlap indicator
embedding (the paper's extra per-word dimension marking words that occur in the other text); the
pre-trained word embeddings stay fixed unless `train_embeddings`.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from medrank.data import squad_sentences as ss
from medrank.data.squad_sentences import FEATURE_NAMES, Idf, overlap_features, tokenize
from medrank.selection.metrics import rank_metrics
from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, atomic_path, read_sealed_json, sha256_file, write_json, write_sealed_json
from medrank.models.word2vec import WordVectors

log = logging.getLogger(__name__)

PAD, UNK = 0, 1


@dataclass(frozen=True)
class CnnConfig:
    """Architecture hyper-parameters (saved with the model)."""

    vocab_size: int
    emb_dim: int = 50
    overlap_dim: int = 5  # 0 = no overlap indicator embedding
    conv_width: int = 5
    n_filters: int = 100
    hidden_size: int = 200
    dropout: float = 0.5
    n_features: int = len(FEATURE_NAMES)
    max_tokens: int = 80
    train_embeddings: bool = False


# the CnnConfig fields params.yaml's `cnn` section sets (vocab_size and emb_dim come from the word vectors)
ARCH_KNOBS = ("overlap_dim", "conv_width", "n_filters", "hidden_size", "dropout", "max_tokens", "train_embeddings")


def architecture(c) -> dict:
    """The architecture knobs of a `cnn` params section (CnnRanker.create's `cfg_kwargs`)."""
    return {k: getattr(c, k) for k in ARCH_KNOBS}


def pin_threads() -> None:
    """One torch thread for the CNN stages: the network is small, and on 2 shared cores one thread was 10x faster than
    two (thread sync dominates)."""
    torch.set_num_threads(1)


class SeverynMoschittiCNN(nn.Module):
    """The network; inputs are padded id/overlap tensors (B, L) and features (B, k); output logits (B, 2)."""

    def __init__(self, cfg: CnnConfig, embeddings: np.ndarray | None = None, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)
        emb = torch.zeros(cfg.vocab_size, cfg.emb_dim)
        if embeddings is not None:
            if embeddings.shape != (cfg.vocab_size, cfg.emb_dim):
                raise MedrankError(f"embedding matrix {embeddings.shape} != ({cfg.vocab_size}, {cfg.emb_dim})")
            emb = torch.as_tensor(embeddings, dtype=torch.float32).clone()
        self.embedding = nn.Embedding.from_pretrained(emb, freeze=not cfg.train_embeddings, padding_idx=PAD)
        d_in = cfg.emb_dim + cfg.overlap_dim
        if cfg.overlap_dim:
            # index 0 = padding (zero, as wide-conv zero padding), 1 = word absent from the other text, 2 = present
            self.overlap_embedding = nn.Embedding(3, cfg.overlap_dim, padding_idx=0)
            nn.init.uniform_(self.overlap_embedding.weight, -0.25, 0.25, generator=g)
            with torch.no_grad():
                self.overlap_embedding.weight[0].zero_()
        n, m = cfg.n_filters, cfg.conv_width
        bound = 1.0 / math.sqrt(d_in * m)
        self.F_q = nn.Parameter(torch.empty(n, d_in, m).uniform_(-bound, bound, generator=g))
        self.b_q = nn.Parameter(torch.zeros(n))
        self.F_d = nn.Parameter(torch.empty(n, d_in, m).uniform_(-bound, bound, generator=g))
        self.b_d = nn.Parameter(torch.zeros(n))
        self.M = nn.Parameter(torch.empty(n, n).normal_(0.0, 0.01, generator=g))
        join = 2 * n + 1 + cfg.n_features
        self.w_h = nn.Parameter(torch.empty(cfg.hidden_size, join).uniform_(-1, 1, generator=g) / math.sqrt(join))
        self.b_h = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.w_s = nn.Parameter(
            torch.empty(2, cfg.hidden_size).uniform_(-1, 1, generator=g) / math.sqrt(cfg.hidden_size)
        )
        self.b_s = nn.Parameter(torch.zeros(2))
        self.dropout = nn.Dropout(cfg.dropout)

    def embed(self, ids: torch.Tensor, overlap: torch.Tensor) -> torch.Tensor:
        """(B, L) ids and overlap flags -> (B, d_in, L) conv input."""
        x = self.embedding(ids)
        if self.cfg.overlap_dim:
            x = torch.cat([x, self.overlap_embedding(overlap)], dim=-1)
        return x.transpose(1, 2)

    def wide_conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Wide convolution: zero padding m-1 on both sides, so (B, d, n) -> (B, filters, n + m - 1)."""
        return F.conv1d(x, weight, bias, padding=self.cfg.conv_width - 1)

    def pool(self, conv: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ReLU + max over the n + m - 1 valid positions of each row (batch padding excluded)."""
        valid = torch.arange(conv.shape[-1], device=conv.device)[None, :] < (lengths + self.cfg.conv_width - 1)[:, None]
        conv = conv.masked_fill(~valid[:, None, :], float("-inf"))
        return F.relu(conv.max(dim=-1).values)  # relu and max commute

    def similarity(self, x_q: torch.Tensor, x_d: torch.Tensor) -> torch.Tensor:
        """Bilinear x_qᵀ M x_d per row: (B, n), (B, n) -> (B, 1)."""
        return ((x_q @ self.M) * x_d).sum(dim=-1, keepdim=True)

    def forward(
        self,
        q_ids: torch.Tensor,
        q_overlap: torch.Tensor,
        q_len: torch.Tensor,
        d_ids: torch.Tensor,
        d_overlap: torch.Tensor,
        d_len: torch.Tensor,
        features: torch.Tensor,
    ) -> torch.Tensor:
        x_q = self.pool(self.wide_conv(self.embed(q_ids, q_overlap), self.F_q, self.b_q), q_len)
        x_d = self.pool(self.wide_conv(self.embed(d_ids, d_overlap), self.F_d, self.b_d), d_len)
        x_join = torch.cat([x_q, self.similarity(x_q, x_d), x_d, features], dim=-1)
        h = F.relu(F.linear(self.dropout(x_join), self.w_h, self.b_h))
        return F.linear(self.dropout(h), self.w_s, self.b_s)


# ---------------------------------------------------------------- encoding text pairs


@dataclass
class EncodedPairs:
    """Token ids, overlap flags, lengths and extra features of n (question, document) pairs."""

    q_ids: list[np.ndarray]
    q_overlap: list[np.ndarray]
    d_ids: list[np.ndarray]
    d_overlap: list[np.ndarray]
    features: np.ndarray  # (n, k) float32

    def __len__(self) -> int:
        return len(self.q_ids)


class Encoder:
    """Maps text pairs to model inputs: vocabulary lookup, overlap flags, lexical features."""

    def __init__(self, words: Sequence[str], idf: Idf, max_tokens: int):
        self.words = list(words)  # row i + 2 of the embedding matrix (0 = PAD, 1 = UNK)
        self.index = {w: i + 2 for i, w in enumerate(self.words)}
        self.idf = idf
        self.max_tokens = max_tokens

    @property
    def vocab_size(self) -> int:
        return len(self.words) + 2

    def encode(self, questions: Sequence[str], documents: Sequence[str]) -> EncodedPairs:
        tok_cache: dict[str, list[str]] = {}

        def toks(t: str) -> list[str]:
            r = tok_cache.get(t)
            if r is None:
                r = tok_cache[t] = tokenize(t)
            return r

        out = EncodedPairs([], [], [], [], np.zeros((len(questions), len(FEATURE_NAMES)), dtype=np.float32))
        for i, (q, d) in enumerate(zip(questions, documents)):
            qt, dt = toks(q), toks(d)
            qs, ds = set(qt), set(dt)
            qt, dt = qt[: self.max_tokens], dt[: self.max_tokens]
            out.q_ids.append(np.array([self.index.get(w, UNK) for w in qt], dtype=np.int64))
            out.d_ids.append(np.array([self.index.get(w, UNK) for w in dt], dtype=np.int64))
            out.q_overlap.append(np.array([2 if w in ds else 1 for w in qt], dtype=np.int64))
            out.d_overlap.append(np.array([2 if w in qs else 1 for w in dt], dtype=np.int64))
            out.features[i] = overlap_features(qs, ds, self.idf)
        return out


def _pad(seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    out = np.zeros((len(seqs), max(int(lengths.max(initial=0)), 1)), dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out), torch.from_numpy(lengths)


def make_batch(data: EncodedPairs, idx: Sequence[int]) -> dict[str, torch.Tensor]:
    """Padded tensors for the rows `idx` (keyword arguments of SeverynMoschittiCNN.forward)."""
    q_ids, q_len = _pad([data.q_ids[i] for i in idx])
    d_ids, d_len = _pad([data.d_ids[i] for i in idx])
    q_ov, _ = _pad([data.q_overlap[i] for i in idx])
    d_ov, _ = _pad([data.d_overlap[i] for i in idx])
    return {
        "q_ids": q_ids,
        "q_overlap": q_ov,
        "q_len": q_len,
        "d_ids": d_ids,
        "d_overlap": d_ov,
        "d_len": d_len,
        "features": torch.from_numpy(data.features[np.asarray(idx)]),
    }


def length_batches(data: EncodedPairs, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Batches of similar document length (less padding); shuffled when `rng` is given, else in order of length."""
    n = len(data)
    d_len = np.fromiter((len(s) for s in data.d_ids), dtype=np.int64, count=n)
    if rng is None:
        order = np.argsort(d_len, kind="stable")
        return [order[i : i + batch_size] for i in range(0, n, batch_size)]
    perm = rng.permutation(n)
    chunk = batch_size * 50
    batches = []
    for c in range(0, n, chunk):
        part = perm[c : c + chunk]
        part = part[np.argsort(d_len[part], kind="stable")]
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


# ---------------------------------------------------------------- ranker: train / predict / save / load


@dataclass(frozen=True)
class TrainConfig:
    optimizer: str = "adadelta"  # adadelta | sgd
    lr: float = 1.0
    l2: float = 1e-5
    epochs: int = 3
    batch_size: int = 50
    patience: int | None = None  # stop after this many epochs without a better validation score; None = all epochs

    @classmethod
    def of(cls, c) -> "TrainConfig":
        """The training knobs of a `cnn` params section (each field by its name)."""
        return cls(**{f.name: getattr(c, f.name) for f in fields(cls)})


def make_optimizer(model: nn.Module, tc: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if tc.optimizer == "adadelta":
        return torch.optim.Adadelta(params, lr=tc.lr, rho=0.95, eps=1e-6, weight_decay=tc.l2)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tc.lr, weight_decay=tc.l2)
    raise MedrankError(f"cnn optimizer must be adadelta or sgd, got {tc.optimizer!r}")


class CnnRanker:
    """Encoder + network: score (question, document) pairs with P(relevant)."""

    def __init__(self, model: SeverynMoschittiCNN, encoder: Encoder):
        self.model = model
        self.encoder = encoder

    @classmethod
    def create(cls, vectors: WordVectors, idf: Idf, cfg_kwargs: dict, seed: int) -> "CnnRanker":
        encoder = Encoder(vectors.words, idf, cfg_kwargs.get("max_tokens", 80))
        rng = np.random.default_rng(seed)
        emb = np.zeros((encoder.vocab_size, vectors.dim), dtype=np.float32)
        # UNK gets a small random vector (as in the paper's unknown words), PAD stays zero
        emb[UNK] = rng.uniform(-0.25, 0.25, vectors.dim)
        emb[2:] = vectors.vectors
        cfg = CnnConfig(vocab_size=encoder.vocab_size, emb_dim=vectors.dim, **cfg_kwargs)
        return cls(SeverynMoschittiCNN(cfg, emb, seed=seed), encoder)

    def loss(self, batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(**batch), labels)

    def fit(
        self,
        train: EncodedPairs,
        labels: np.ndarray,
        tc: TrainConfig,
        seed: int,
        on_epoch: Callable[[int, float], float | None] | None = None,
    ) -> list[dict]:
        """Train with cross-entropy; `on_epoch(epoch, mean_loss)` may return a validation score to keep the best epoch
        (and, with `tc.patience`, to stop once that many epochs in a row did not beat it: the kept weights are the same)."""
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        opt = make_optimizer(self.model, tc)
        y = torch.tensor(np.asarray(labels, dtype=np.int64))
        history, best, best_state, stale = [], -math.inf, None, 0
        from tqdm import tqdm

        for epoch in range(1, tc.epochs + 1):
            self.model.train()
            total, count = 0.0, 0
            for idx in tqdm(length_batches(train, tc.batch_size, rng), desc=f"cnn epoch {epoch}", mininterval=10):
                opt.zero_grad()
                loss = self.loss(make_batch(train, idx), y[idx])
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
                count += len(idx)
            mean_loss = total / max(count, 1)
            score = on_epoch(epoch, mean_loss) if on_epoch else None
            history.append({"epoch": epoch, "train_loss": mean_loss, "val_score": score})
            log.info("cnn epoch %d: loss %.4f val %s", epoch, mean_loss, score)
            if score is not None and score > best:
                best, stale = score, 0
                best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            elif score is not None:
                stale += 1
                if tc.patience is not None and stale >= tc.patience:
                    break
        if best_state is not None:
            self.model.load_state_dict(best_state)
        return history

    @torch.no_grad()
    def predict_encoded(self, data: EncodedPairs, batch_size: int = 256) -> np.ndarray:
        """P(relevant) for each encoded pair, in input order."""
        self.model.eval()
        out = np.empty(len(data), dtype=np.float64)
        for idx in length_batches(data, batch_size, None):
            out[idx] = torch.softmax(self.model(**make_batch(data, idx)), dim=-1)[:, 1].double().numpy()
        return out

    def predict(self, questions: Sequence[str], documents: Sequence[str], batch_size: int = 256) -> np.ndarray:
        return self.predict_encoded(self.encoder.encode(questions, documents), batch_size)

    def save(self, out_dir: str | Path) -> None:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        state = {k: v.contiguous() for k, v in self.model.state_dict().items()}
        with atomic_path(out_dir / "model.safetensors") as tmp:
            save_file(state, str(tmp))
        write_json(out_dir / "vocab.json", self.encoder.words)
        write_json(out_dir / "idf.json", {"n_docs": self.encoder.idf.n_docs, "doc_freq": self.encoder.idf.doc_freq})
        # last, and sealed: the sha256 of every file the model reads, checked at every load (flipped weight bytes, or
        # a vocabulary or IDF table edited into other valid JSON, change the scores otherwise)
        sums = {name: sha256_file(out_dir / name) for name in CNN_FILES}
        write_sealed_json(out_dir / "config.json", {**asdict(self.model.cfg), "sha256": sums})

    @classmethod
    def load(cls, out_dir: str | Path) -> "CnnRanker":
        from safetensors.torch import load_file

        out_dir = Path(out_dir)
        if not (out_dir / "model.safetensors").exists():
            raise MedrankError(f"{out_dir}: no trained CNN (run the cnn_train stage)")
        restore = (
            f"restore the folder with `dvc checkout {out_dir}` (or `dvc pull`), or re-run the stage that trained it "
            "(`dvc repro cnn_train`)"
        )
        raw = read_sealed_json(out_dir / "config.json", restore)
        raw.pop(RECORD_SHA256)
        sums = raw.pop("sha256", None)
        for name in CNN_FILES:
            path = out_dir / name
            if not isinstance(sums, dict) or not path.is_file() or sums.get(name) != sha256_file(path):
                raise MedrankError(f"{path}: no sha256 recorded in config.json, or the file differs from it; {restore}")
        try:
            cfg = CnnConfig(**raw)
        except TypeError as e:  # a record sealed by another version of this class
            raise MedrankError(f"{out_dir}/config.json: not a CNN config ({e}); {restore}") from None
        words = json.loads((out_dir / "vocab.json").read_text(encoding="utf-8"))
        idf_raw = json.loads((out_dir / "idf.json").read_text(encoding="utf-8"))
        model = SeverynMoschittiCNN(cfg)
        model.load_state_dict(load_file(str(out_dir / "model.safetensors")))
        model.eval()
        return cls(model, Encoder(words, Idf(idf_raw["doc_freq"], idf_raw["n_docs"]), cfg.max_tokens))


CNN_FILES = ("model.safetensors", "vocab.json", "idf.json")  # what a saved CNN reads besides its config.json


# ---------------------------------------------------------------- MEDIQA Task 3: answers as sentence bags

# data/processed/cnn_mediqa_scores.parquet: one row per Task 3 answer, every split (optional ranking feature)
CNN_MEDIQA_SCORES = pa.schema(
    [
        ("split", pa.string()),
        ("qid", pa.string()),
        ("aid", pa.string()),
        ("cnn_score", pa.float64()),  # max or mean (cnn.mediqa_aggregation) of P(relevant | question, sentence)
        ("n_sentences", pa.int32()),
    ]
)


def cnn_answer_scores(
    ranker: CnnRanker, answers: pd.DataFrame, aggregation: str, split_sentences: Callable[[str], list[str]]
) -> pd.DataFrame:
    """Score each (question, answer) row as max or mean of the CNN scores of (question, answer sentence)."""
    if aggregation not in ("max", "mean"):
        raise MedrankError(f"cnn.mediqa_aggregation must be max or mean, got {aggregation!r}")
    row_of, questions, sentences = [], [], []
    for i, (q, a) in enumerate(zip(answers["question"], answers["answer"])):
        sents = split_sentences(a or "") or [a or ""]
        row_of += [i] * len(sents)
        questions += [q] * len(sents)
        sentences += sents
    scores = ranker.predict(questions, sentences)
    per = pd.DataFrame({"row": row_of, "score": scores}).groupby("row")["score"]
    agg = per.max() if aggregation == "max" else per.mean()
    return pd.DataFrame(
        {
            "cnn_score": agg.reindex(range(len(answers))).to_numpy(dtype=np.float64),
            "n_sentences": per.size().reindex(range(len(answers))).to_numpy(dtype=np.int32),
        }
    )


# ---------------------------------------------------------------- SQuAD dev: the CNN beside lexical rankers


def squad_comparison(dev: pd.DataFrame, ranker: CnnRanker, sample_size: int, seed: int) -> dict[str, dict]:
    """MRR, MAP, P@1 on SQuAD dev of word overlap, IDF overlap, BM25 and the CNN: every dev question, and the seeded
    sample of `sample_size` questions the fine-tuned cross-encoder (analysis stage cnn_crossenc) is scored on."""
    scores = {
        "word_overlap": ss.tie_break(ss.word_overlap_scores(dev), seed),
        "idf_overlap": ss.tie_break(ss.idf_overlap_scores(dev, ranker.encoder.idf), seed),
        "bm25": ss.tie_break(ss.bm25_scores(dev), seed),
        "cnn": ranker.predict(dev["question"].tolist(), dev["sentence"].tolist()),
    }
    full = {"n_questions": int(dev["question_id"].nunique())}
    full.update({name: rank_metrics(dev, s) for name, s in scores.items()})
    sample_ids = set(ss.sample_questions(dev, sample_size, seed)["question_id"])
    mask = dev["question_id"].isin(sample_ids).to_numpy()
    sample_rows = dev[mask].reset_index(drop=True)
    sample = {"n_questions": len(sample_ids)}
    sample.update({name: rank_metrics(sample_rows, s[mask]) for name, s in scores.items()})
    return {"dev": full, "dev_sample": sample}


def cnn_scorer(ctx):
    """Group cnn served (params.groups.REGISTRY's `serve`): models/cnn and stage cnn_mediqa's saved step (ctx:
    medrank.steps.score_step.AnswerScores); `score(answers, groups)` -> {"cnn_score": ...}."""
    from medrank.core import layout
    from medrank.text.sentences import split_rule

    path = ctx.saved_model(layout.CNN_MODEL.name, "cnn", "cnn_train")
    cnn = ctx.shared("cnn", lambda: CnnRanker.load(path))
    aggregation = ctx.p.cnn.mediqa_aggregation

    def score(answers, groups: set[str]) -> dict:
        return {"cnn_score": cnn_answer_scores(cnn, answers, aggregation, split_rule)["cnn_score"].to_numpy()}

    return score
