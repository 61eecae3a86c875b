"""Embedding extraction: the content-addressed cache (incremental, crash-safe, resumable, read-only), grids and
ANLI, and the retrieve → embed stages end to end on a tiny random BERT (2 layers, hidden 32, vocab built here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from medrank.core import layout
from medrank.data.schemas import LIVEQA_QRELS, LIVEQA_QUESTIONS
from medrank.encoders import cache as cache_mod
from medrank.encoders import distributed as distributed_mod
from medrank.encoders import extract as extract_mod
from medrank.encoders.cache import PairCache, existing_precisions, namespace_name, pair_key
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.distributed import RayBackend
from medrank.encoders.extract import cached_extract, choose_precision, open_cache
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.core.errors import MedrankError
from medrank.task3.grids import (
    answer_grids,
    answer_pairs,
    anli_score,
    grid_table,
    nli_grids,
    plan_grids,
    select_columns,
)
from medrank.task3.retrieval import medquad_documents, questions_table, score_candidates
from tests.conftest import write_params
from tests.helpers import FIXTURES as FIXTURES_ROOT
from tests.helpers.models import make_tiny_bert

FIXTURES = FIXTURES_ROOT / "embed"
REPO = Path(__file__).resolve().parents[2]
NLI_LABELS = ["entailment", "neutral", "contradiction"]


pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


def _load_jsonl(name: str) -> pd.DataFrame:
    return pd.read_json(FIXTURES / name, lines=True, dtype={"qid": str})


@pytest.fixture(scope="module")
def fixture_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    answers = _load_jsonl("answers.jsonl")
    answers["question_norm"] = answers["question"]
    answers["answer_norm"] = answers["answer"]
    medquad = _load_jsonl("medquad.jsonl")
    medquad["question_norm"] = medquad["question"]
    medquad["answer_norm"] = medquad["answer"]
    return answers, medquad


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, fixture_tables) -> dict[str, Path]:
    """A random 2-layer hidden-32 BERT base (tokenizer over the fixture words) + NLI/RQE heads saved like finetune."""

    root = tmp_path_factory.mktemp("tiny_models")
    answers, medquad = fixture_tables
    text = (
        " ".join(answers["question"])
        + " "
        + " ".join(answers["answer"])
        + " "
        + " ".join(medquad["question"])
        + " "
        + " ".join(medquad["answer"])
    )
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text.lower())))
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    # dropout as BertConfig's default: the saved config (and so the fingerprints) as before the shared builder
    base = make_tiny_bert(
        root / "base",
        vocab=root / "vocab.txt",
        max_position_embeddings=128,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    out = {"base": base}
    for task, labels in (("nli", NLI_LABELS), ("rqe", ["not_entailed", "entailed"])):
        ce = CrossEncoder.from_base(
            str(base), len(labels), 48, device="cpu", seed=1, label_names=labels, precision="fp32"
        )
        ce.save(root / task, extra_meta={"task": task})
        out[task] = root / task
    return out


@pytest.fixture(scope="module")
def nli_model(tiny_models) -> CrossEncoder:
    return CrossEncoder.load(tiny_models["nli"], device="cpu", precision="fp32")


# ---------------------------------------------------------------------- ANLI and grids


def test_anli_matches_hand_computation():
    p = np.array([[0.1, 0.9], [0.4, 0.2], [0.3, 0.3]])
    assert anli_score(p) == pytest.approx((0.9 + 0.4 + 0.3) / 3)
    assert anli_score(np.zeros((0, 0))) == 0.0


def test_grid_table_anli_and_layout():
    pairs = pd.DataFrame(
        {
            "split": ["val"],
            "qid": ["1"],
            "aid": ["1_Answer1"],
            "entailed_kind": ["rqe"],
            "entailed_rank": [1],
            "entailed_id": ["x"],
            "sentences_a": [["a0", "a1"]],
            "sentences_e": [["e0", "e1", "e2"]],
        }
    )
    plan = plan_grids(pairs, max_sentences=5, top_k=None, sentence_vectors=None)
    # row-major: premise = E sentence, hypothesis = A sentence
    assert plan.cells == [("e0", "a0"), ("e1", "a0"), ("e2", "a0"), ("e0", "a1"), ("e1", "a1"), ("e2", "a1")]
    p_ent = np.array([0.2, 0.7, 0.1, 0.05, 0.3, 0.6], dtype=np.float32)
    probs = np.stack([p_ent, 1 - p_ent, np.zeros(6)], axis=1).astype(np.float32)
    cls = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    row = grid_table(pairs, plan, probs, cls, NLI_LABELS).iloc[0]
    assert (row.n_rows, row.n_cols) == (2, 3)
    assert row.anli == pytest.approx((0.7 + 0.6) / 2)
    assert np.asarray(row.nli_cls).reshape(2, 3, 4)[1, 2].tolist() == [20, 21, 22, 23]
    assert list(row.e_index) == [0, 1, 2, 0, 1, 2]


def test_select_columns_top_k_by_cosine_in_sentence_order():
    emb_a = np.array([[1.0, 0.0], [0.0, 1.0]])
    emb_e = np.array([[0.0, 1.0], [1.0, 0.0], [0.7, 0.7], [0.9, 0.1]])
    assert select_columns(emb_a, emb_e, 2).tolist() == [[1, 3], [0, 2]]
    assert select_columns(emb_a, emb_e, None).tolist() == [[0, 1, 2, 3]] * 2
    assert select_columns(emb_a, emb_e, 10).shape == (2, 4)


def test_answer_pairs_augmentation_train_only(fixture_tables):
    answers, _ = fixture_tables
    ans = answers.rename(columns={"answer_sentences": "sentences"})
    retrieved = pd.DataFrame(
        {
            "split": ["train_liveqa", "val"],
            "qid": ["1", "7"],
            "rank": [1, 1],
            "qa_id": ["m1", "m2"],
            "sentences": [["s1"], ["s2"]],
        }
    )
    pairs = answer_pairs(ans, retrieved, augment_top=2)
    aug = pairs[pairs.entailed_kind == "augment"]
    assert set(aug["split"]) == {"train_liveqa", "train_alexa"}  # never val/test
    # liveqa question 1: 5 candidates ranked 1..5, top-2 as entailed: 0 + 1 + 2 + 2 + 2
    lq = aug[aug.split == "train_liveqa"]
    assert len(lq) == 7
    rank = dict(zip(ans[ans.split == "train_liveqa"]["aid"], ans[ans.split == "train_liveqa"]["reference_rank"]))
    assert all(rank[e] < rank[a] for a, e in zip(lq["aid"], lq["entailed_id"]))
    # alexa question: reference ranks run backwards in the fixture, so Answer3 (rank 1) is entailed for the others
    al = aug[aug.split == "train_alexa"]
    assert sorted(al["entailed_id"]) == ["1_Answer2", "1_Answer3", "1_Answer3"]
    rqe = pairs[pairs.entailed_kind == "rqe"]
    assert len(rqe) == (ans.split == "train_liveqa").sum() + (ans.split == "val").sum()
    assert len(answer_pairs(ans, retrieved, augment_top=0)) == len(rqe)


# ---------------------------------------------------------------------- the cache


def _cols(h: int = 4) -> dict:
    return {"probs": ((3,), np.float32), "cls": ((h,), np.float16)}


def _values(keys: list[bytes], h: int = 4) -> dict[str, np.ndarray]:
    # deterministic per key, so any reader can check what it got
    seed = np.array([int.from_bytes(k[:4], "little") for k in keys], dtype=np.float64)
    probs = np.stack([seed % 7, seed % 11, seed % 13], axis=1).astype(np.float32)
    cls = ((seed[:, None] % 97) + np.arange(h)[None, :]).astype(np.float16)
    return {"probs": probs, "cls": cls}


def test_cache_roundtrip_and_dedup(tmp_path):
    c = PairCache(tmp_path, "ns", _cols(), meta={"kind": "test"})
    keys = [pair_key("a", str(i)) for i in range(10)]
    assert c.put(keys[:6] + keys[:2], {k: np.concatenate([v, v[:2]]) for k, v in _values(keys[:6]).items()}) is not None
    assert c.put(keys[:3], _values(keys[:3])) is None  # nothing new: no empty shard
    c2 = PairCache(tmp_path, "ns", _cols())
    assert len(c2) == 6 and len(c2.shards) == 1
    assert c2.missing(keys + keys) == keys[6:]
    got = c2.get(keys[5::-1])
    exp = _values(keys[5::-1])
    np.testing.assert_array_equal(got["probs"], exp["probs"])
    np.testing.assert_array_equal(got["cls"], exp["cls"])
    assert pq.read_schema(c2.shards[0]).field("cls").type.value_type.bit_width == 16  # float16 on disk
    with pytest.raises(MedrankError):
        c2.get([pair_key("not", "there")])
    assert pair_key("ab", "c") != pair_key("a", "bc")


def test_read_only_cache_keeps_puts_in_memory_and_writes_nothing(tmp_path):
    keys = [pair_key("r", str(i)) for i in range(6)]
    PairCache(tmp_path, "ns", _cols(), meta={"kind": "test"}).put(keys[:3], _values(keys[:3]))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "ns").iterdir())
    ro = PairCache(tmp_path, "ns", _cols(), meta={"kind": "test"}, read_only=True)
    assert ro.missing(keys) == keys[3:]
    assert ro.put(keys, _values(keys)) is None and len(ro) == 6 and len(ro.shards) == 1
    ro.release()  # rows only held in memory survive a release
    got = ro.get(keys[::-1])
    np.testing.assert_array_equal(got["cls"], _values(keys[::-1])["cls"])
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "ns").iterdir()) == before
    PairCache(tmp_path / "absent", "ns", _cols(), read_only=True).put(keys, _values(keys))
    assert not (tmp_path / "absent").exists()


def test_crash_mid_write_leaves_no_shard(tmp_path, monkeypatch):
    c = PairCache(tmp_path, "ns", _cols())
    keys = [pair_key("q", str(i)) for i in range(50)]
    real_write = cache_mod.pq.write_table

    def crashing_write(table, where, **kw):
        real_write(table, where, **kw)
        data = Path(where).read_bytes()
        Path(where).write_bytes(data[: len(data) // 2])  # half a file on disk, then the process "dies"
        raise OSError("simulated crash")

    monkeypatch.setattr(cache_mod.pq, "write_table", crashing_write)
    with pytest.raises(OSError):
        c.put(keys, _values(keys))
    monkeypatch.undo()
    assert list(c.dir.glob("part-*")) == [] and list(c.dir.glob(".part-*")) == []
    reopened = PairCache(tmp_path, "ns", _cols())
    assert len(reopened) == 0 and reopened.missing(keys) == keys
    reopened.put(keys, _values(keys))
    assert len(PairCache(tmp_path, "ns", _cols())) == 50


def test_damaged_or_foreign_shards_are_skipped(tmp_path, caplog):
    c = PairCache(tmp_path, "ns", _cols())
    keys = [pair_key("x", str(i)) for i in range(5)]
    shard = c.put(keys, _values(keys))
    (c.dir / "part-99-truncated.parquet").write_bytes(shard.read_bytes()[:100])
    stale = c.dir / ".part-0.parquet.abc.tmp"
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    reopened = PairCache(tmp_path, "ns", _cols())
    assert len(reopened) == 5
    assert "part-99-truncated.parquet skipped: its pairs are computed again" in caplog.text
    assert reopened.skipped == ["part-99-truncated.parquet"] and reopened.info()["skipped_shards"] == 1
    assert not stale.exists()  # a dead writer's temp file is swept


def _rewrite(shard, table) -> None:
    pq.write_table(table, shard, compression="zstd")


def test_damaged_values_are_skipped_and_recomputed_never_used(tmp_path, monkeypatch, caplog):
    """Issue 36 #3: only the key column was read at open, so a flipped value, bytes flipped mid-shard (ArrowInvalid on
    every re-run), or a shard linked to a file outside the project were used (or fatal)."""
    monkeypatch.chdir(tmp_path)
    keys = [pair_key("x", str(i)) for i in range(50)]
    good = _values(keys)
    shard = PairCache("cache", "ns", _cols()).put(keys, good)
    table = pq.read_table(shard)
    # (a) one value changed, the file otherwise valid (its recorded sha256 kept)
    poisoned = good["probs"].copy()
    poisoned[7, 1] += 1.0
    cols = [
        table.column("key"),
        pa.FixedSizeListArray.from_arrays(pa.array(poisoned.reshape(-1)), 3),
        table.column("cls"),
    ]
    _rewrite(shard, pa.Table.from_arrays(cols, schema=table.schema))
    c = PairCache("cache", "ns", _cols())
    assert len(c) == 0 and c.skipped == [shard.name] and c.missing(keys) == keys  # every pair computed again
    assert "content differs from its sha256" in caplog.text
    c.put(keys, good)
    np.testing.assert_array_equal(PairCache("cache", "ns", _cols()).get(keys)["probs"], good["probs"])
    # (b) bytes flipped in the middle of a shard: skipped, not an exception on every run
    shard.unlink()
    for f in c.dir.glob("part-*.parquet"):
        data = bytearray(f.read_bytes())
        for i in range(len(data) // 3, len(data) // 3 + 40):
            data[i] ^= 0xFF
        f.write_bytes(bytes(data))
    c = PairCache("cache", "ns", _cols())
    assert len(c) == 0 and len(c.skipped) == 1
    # (c) a shard linked to a file outside the project
    for f in c.dir.glob("part-*.parquet"):
        f.unlink()
    outside = tmp_path.parent / f"{tmp_path.name}-planted.parquet"
    PairCache(tmp_path.parent / f"{tmp_path.name}-x", "ns", _cols()).put(keys, good)
    planted = next((tmp_path.parent / f"{tmp_path.name}-x" / "ns").glob("part-*.parquet"))
    planted.rename(outside)
    (c.dir / "part-00000000000000000001-1-000001.parquet").symlink_to(outside)
    c = PairCache("cache", "ns", _cols())
    assert len(c) == 0 and len(c.skipped) == 1 and "outside the project and the DVC cache" in caplog.text


def test_shards_without_a_checksum_are_decoded_whole_and_counted(tmp_path):
    """Shards written before checksums: accepted when they decode, counted as unverified."""
    keys = [pair_key("y", str(i)) for i in range(5)]
    c = PairCache(tmp_path, "ns", _cols())
    shard = c.put(keys, _values(keys))
    table = pq.read_table(shard)
    _rewrite(shard, table.replace_schema_metadata(None))
    again = PairCache(tmp_path, "ns", _cols())
    assert len(again) == 5 and again.unverified == 1 and again.skipped == [] and again.info()["unverified_shards"] == 1


_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
    from test_embed_cache import _values, _cols
    from medrank.encoders.cache import PairCache, pair_key
    c = PairCache({root!r}, "ns", _cols(256))
    for s in range(10_000):
        keys = [pair_key(str(s), str(i)) for i in range(3000)]
        c.put(keys, _values(keys, 256))
    """
)


def test_kill9_during_writes_leaves_only_whole_shards(tmp_path):
    code = _WRITER.format(repo=str(REPO), tests=str(REPO / "tests" / "encoders"), root=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"})
    ns = tmp_path / "ns"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(ns.glob("part-*.parquet"))) < 3:
        time.sleep(0.05)
    time.sleep(0.13)  # most likely mid-way through the next shard
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(ns.glob("part-*.parquet"))) >= 3, "writer made no progress"
    c = PairCache(tmp_path, "ns", _cols(256))
    assert len(c) == 3000 * len(c.shards)  # every visible shard is whole
    keys = [k for k in c._index]
    got = c.get(keys)
    exp = _values(keys, 256)
    np.testing.assert_array_equal(got["probs"], exp["probs"])
    np.testing.assert_array_equal(got["cls"], exp["cls"])


def test_resume_after_a_crash_computes_only_the_rest(tmp_path, nli_model, monkeypatch):
    pairs = [(f"premise number {i}", f"hypothesis {i % 7}") for i in range(40)]
    cache = open_cache(nli_model, "nli", tmp_path, "fp32")
    real = extract_mod.extract_pairs
    calls = {"n": 0}

    def dies_on_second_chunk(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # killed while computing the second shard
        return real(*a, **kw)

    monkeypatch.setattr(distributed_mod, "extract_pairs", dies_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        cached_extract(nli_model, pairs, cache, "fp32", shard_size=16, show_progress=False)
    monkeypatch.undo()
    cache = open_cache(nli_model, "nli", tmp_path, "fp32")
    assert len(cache) == 16
    out, stats = cached_extract(nli_model, pairs, cache, "fp32", shard_size=16, show_progress=False)
    assert (stats.cached, stats.computed) == (16, 24)
    fresh = extract_mod.extract_pairs(nli_model, pairs, "fp32")
    np.testing.assert_allclose(out["probs"], fresh["probs"], atol=1e-6)


def test_auto_precision_reuses_the_cached_namespace(tmp_path, nli_model):
    pairs = [("a b", "c d"), ("e f", "g h")]
    cached_extract(nli_model, pairs, open_cache(nli_model, "nli", tmp_path, "bf16"), "bf16", show_progress=False)
    assert existing_precisions(tmp_path, "nli", nli_model.fingerprint, nli_model.max_length) == ["bf16"]
    assert choose_precision(nli_model, "auto", tmp_path, "nli", pairs) == "bf16"  # no probe, no recompute
    assert choose_precision(nli_model, "fp32", tmp_path, "nli", pairs) == "fp32"
    assert namespace_name("nli", nli_model.fingerprint, "fp32", 48) != namespace_name(
        "nli", nli_model.fingerprint, "bf16", 48
    )


def test_a_lazy_encoder_reads_its_weights_only_when_a_pair_is_missing(tmp_path, tiny_models):
    """Stage retrieve in an experiment: every RQE pair is cached, so the model (and transformers' code) is never loaded."""
    pairs = [("a b", "c d"), ("e f", "g h")]
    eager = CrossEncoder.load(tiny_models["nli"], device="cpu", precision="fp32")
    want, _ = cached_extract(eager, pairs, open_cache(eager, "nli", tmp_path, "fp32"), "fp32", show_progress=False)
    lazy = CrossEncoder.load(tiny_models["nli"], device="cpu", precision="fp32", lazy=True)
    assert lazy.fingerprint == eager.fingerprint and lazy.hidden_size == eager.hidden_size
    got, stats = cached_extract(lazy, pairs, open_cache(lazy, "nli", tmp_path, "fp32"), "fp32", show_progress=False)
    assert stats.computed == 0 and lazy._model is None  # all cached: never loaded
    np.testing.assert_array_equal(got["probs"], want["probs"])
    more = [*pairs, ("i j", "k l")]
    got, stats = cached_extract(lazy, more, open_cache(lazy, "nli", tmp_path, "fp32"), "fp32", show_progress=False)
    assert stats.computed == 1 and lazy._model is not None
    np.testing.assert_array_equal(got["probs"], eager.predict(more, precision="fp32"))
    bi = SentenceEncoder(str(tiny_models["base"]), device="cpu")
    assert bi._model is None and bi.hidden == 32
    np.testing.assert_array_equal(bi.encode(["a b"]), SentenceEncoder(str(tiny_models["base"])).encode(["a b"]))


def test_the_precision_check_is_read_back_for_the_same_sample(tmp_path, nli_model, monkeypatch):
    pairs = [("a b", "c d"), ("e f", "g h")]
    first = extract_mod.cached_precision_check(nli_model, pairs, "bf16", tmp_path)
    assert first["pairs"] == 2 and len(list((tmp_path / "checks").glob("precision-*.json"))) == 1
    monkeypatch.setattr(extract_mod, "precision_check", lambda *a, **k: pytest.fail("recomputed"))
    assert extract_mod.cached_precision_check(nli_model, pairs, "bf16", tmp_path) == first
    monkeypatch.undo()
    stored = next((tmp_path / "checks").glob("precision-*.json"))
    stored.write_text('{"pairs": 2, "max_abs_p')  # a torn file is recomputed, never read
    assert extract_mod.cached_precision_check(nli_model, pairs, "bf16", tmp_path) == first
    other = extract_mod.cached_precision_check(nli_model, pairs[:1], "bf16", tmp_path)  # another sample: computed
    assert other["pairs"] == 1 and len(list((tmp_path / "checks").glob("precision-*.json"))) == 2
    assert extract_mod.cached_precision_check(nli_model, pairs, "fp32", tmp_path)["pairs"] == 0  # nothing to check


def test_prefilter_grids_are_cached_and_follow_cosine(tmp_path, tiny_models, nli_model, fixture_tables):
    answers, _ = fixture_tables
    ans = answers.rename(columns={"answer_sentences": "sentences"})
    retrieved = pd.DataFrame(
        {
            "split": ["val", "test"],
            "qid": ["7", "1"],
            "rank": [1, 1],
            "qa_id": ["m1", "m2"],
            "sentences": [list(ans.sentences.iloc[0]), list(ans.sentences.iloc[5])],
        }
    )
    pairs = answer_pairs(ans, retrieved, augment_top=2)
    bi = SentenceEncoder(str(tiny_models["base"]), device="cpu")
    kw = dict(max_sentences=3, top_k=1, bi=bi, shard_size=8, show_progress=False)
    grid, plan, stats = nli_grids(pairs, nli_model, "fp32", tmp_path, **kw)
    assert (grid.n_cols <= 1).all() and (grid.n_rows <= 3).all()
    assert stats["nli"].computed == stats["nli"].unique == len(set(plan.cells))
    # the kept E sentence is the most cosine-similar one
    r = grid.index[grid.n_sentences_e >= 2][0]
    sa, se = list(pairs.sentences_a[r])[:3], list(pairs.sentences_e[r])[:3]
    ea, ee = bi.encode(sa), bi.encode(se)
    assert list(grid.e_index[r]) == list((ea @ ee.T).argmax(1))
    grid2, _, stats2 = nli_grids(pairs, nli_model, "fp32", tmp_path, **kw)
    assert stats2["nli"].computed == 0 and stats2["bi_encoder"].computed == 0
    np.testing.assert_array_equal(np.concatenate(grid.p_entail), np.concatenate(grid2.p_entail))


def test_bienc_cosines_one_pass_per_named_text_list(tmp_path, tiny_models):
    from medrank.task3.answer_scores import answer_heading, bienc_cosines

    questions = ["what causes anemia", "is leg pain serious"]
    answers = ["What causes Anemia?: blood loss and low iron.", "Leg pain (Symptoms): a cramp or an injury."]
    texts = {"bienc_cos": answers, "heading_cos": [answer_heading(a) for a in answers]}
    cos, stats = bienc_cosines(questions, texts, str(tiny_models["base"]), cache_root=tmp_path, device="cpu")
    bi = SentenceEncoder(str(tiny_models["base"]), device="cpu", max_length=256)
    q = bi.encode(questions)
    for name, values in texts.items():
        np.testing.assert_allclose(
            cos[name], np.einsum("ij,ij->i", q, bi.encode(values)), atol=2e-3
        )  # cached as float16
    assert stats["computed"] == stats["unique"] == 6
    again, stats2 = bienc_cosines(questions, texts, str(tiny_models["base"]), cache_root=tmp_path, device="cpu")
    assert stats2["computed"] == 0 and all(np.array_equal(cos[k], again[k]) for k in cos)
    with pytest.raises(MedrankError, match="2 questions for 1 heading_cos"):
        bienc_cosines(questions, {"heading_cos": ["x"]}, str(tiny_models["base"]), cache_root=tmp_path, device="cpu")
    # bienc.precision: bf16 vectors live in their own namespace (a precision change never reads the other's vectors)
    b16, stats3 = bienc_cosines(
        questions, texts, str(tiny_models["base"]), cache_root=tmp_path, device="cpu", precision="bf16"
    )
    assert stats3["computed"] == 6 and "-bf16-" in stats3["namespace"] and "-fp32-" in stats["namespace"]
    assert all(np.abs(b16[k] - cos[k]).max() < 0.05 for k in cos)


def test_hardware_precision_is_the_hardware_not_a_timing(monkeypatch):
    from medrank.encoders import hardware

    assert hardware.hardware_precision("cpu", "fp32") == "fp32" and hardware.hardware_precision("cpu", "bf16") == "bf16"
    monkeypatch.setattr(hardware, "native_bf16", lambda device: True)
    assert hardware.hardware_precision("cpu") == "bf16"
    monkeypatch.setattr(hardware, "native_bf16", lambda device: False)
    assert hardware.hardware_precision("cpu") == "fp32"
    with pytest.raises(
        MedrankError, match="precision .int8.: expected auto, fp32, bf16, openvino-auto, openvino-bf16 or openvino-fp32"
    ):
        hardware.hardware_precision("cpu", "int8")


# ---------------------------------------------------------------------- the stages, N = 3 -> 5 -> 5


def _write_inputs(work: Path, tables, models: dict[str, Path], n_candidates: int) -> None:
    """Inputs at their layout paths under `work` (the stages run with `work` as the repository root)."""
    answers, medquad = tables
    (work / layout.NORMALIZED).mkdir(parents=True, exist_ok=True)
    answers.to_parquet(work / layout.ANSWERS)
    medquad.to_parquet(work / layout.MEDQUAD)
    # no LiveQA judgments for the fixture questions: retrieve's `judged` block is empty
    for path, schema in ((layout.CLEAN_LIVEQA_QRELS, LIVEQA_QRELS), (layout.CLEAN_LIVEQA_QUESTIONS, LIVEQA_QUESTIONS)):
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(schema.empty_table(), work / path)
    for task, model in ((layout.RQE_MODEL, models["rqe"]), (layout.NLI_MODEL, models["nli"])):
        if not (work / task).exists():
            shutil.copytree(model, work / task)
    params = {
        "device": "cpu",
        "n_candidates": n_candidates,
        "rqe_threshold": None,
        "retrieve": {"bm25_top_k": 6, "precision": "fp32", "shard_size": 16},
        "embed": {
            "bi_encoder": str(models["base"]),
            "max_sentences": 3,
            "prefilter_top_k": None,
            "augment_top": 2,
            "precision": "fp32",
            "precision_check_pairs": 0,
            "shard_size": 32,
        },
    }
    write_params(work, params)


def _cells(work: Path) -> set[tuple[str, str]]:
    answers = pd.read_parquet(work / layout.ANSWERS).rename(columns={"answer_sentences": "sentences"})
    retrieved = pd.read_parquet(work / layout.RETRIEVED).rename(columns={"entailed_sentences": "sentences"})
    return set(plan_grids(answer_pairs(answers, retrieved, 2), 3, None, None).cells)


def test_stages_compute_only_new_pairs_when_n_grows(tmp_path, monkeypatch, tiny_models, fixture_tables):
    import stages.embed
    import stages.retrieve

    monkeypatch.chdir(tmp_path)
    runs = {}
    for label, n in (("n3", 3), ("n5", 5), ("n5_again", 5)):
        _write_inputs(tmp_path, fixture_tables, tiny_models, n)
        stages.retrieve.main("params.yaml")
        stages.embed.main("params.yaml")
        runs[label] = {
            "retrieve": json.loads(layout.metrics_file("retrieve").read_text()),
            "embed": json.loads(layout.metrics_file("embed").read_text()),
            "cells": _cells(tmp_path),
            "grid": pd.read_parquet(layout.NLI_GRID),
            "retrieved": pd.read_parquet(layout.RETRIEVED),
        }
    n_questions = 4
    r3, r5, r5b = runs["n3"], runs["n5"], runs["n5_again"]
    assert len(r3["retrieved"]) == 3 * n_questions and len(r5["retrieved"]) == 5 * n_questions
    # retrieval: every BM25 candidate was scored on the first run; later runs only re-select
    assert r3["retrieve"]["extract"]["computed"] == r3["retrieve"]["extract"]["unique"] > 0
    assert r5["retrieve"]["extract"]["computed"] == 0 and r5b["retrieve"]["extract"]["computed"] == 0
    # embed: N=5 computes exactly the sentence pairs N=3 had not seen; a repeated run computes none
    assert r3["embed"]["extract"]["nli"]["computed"] == len(r3["cells"])
    new = r5["cells"] - r3["cells"]
    assert len(new) > 0
    assert r5["embed"]["extract"]["nli"]["computed"] == len(new)
    assert r5b["embed"]["extract"]["nli"]["computed"] == 0
    # cached values are the values: the N=3 grids reappear unchanged inside the N=5 output
    key = ["split", "qid", "aid", "entailed_kind", "entailed_rank"]
    both = r3["grid"].merge(r5["grid"], on=key, suffixes=("_3", "_5"))
    assert len(both) == len(r3["grid"])
    same_e = both["entailed_id_3"] == both["entailed_id_5"]
    assert same_e.all()
    for a, b in zip(both["p_entail_3"], both["p_entail_5"]):
        np.testing.assert_array_equal(a, b)
    assert len(r5["retrieved"]["rqe_cls"].iloc[0]) == 32  # the RQE [CLS] vector travels with the retrieved rows
    assert sorted(p.name for p in layout.EMBEDDINGS.iterdir()) == ["nli_grid.parquet"]
    cov = r5["retrieve"]["coverage"]["all"]
    assert set(cov) == {"T=0.5", "T=0.7", "T=0.9"} and cov["T=0.5"]["questions"] == n_questions


def test_retrieve_rejects_n_larger_than_bm25_top_k(tmp_path, monkeypatch, tiny_models, fixture_tables):
    import stages.retrieve

    monkeypatch.chdir(tmp_path)
    _write_inputs(tmp_path, fixture_tables, tiny_models, 7)
    with pytest.raises(MedrankError, match="bm25_top_k"):
        stages.retrieve.main("params.yaml")


# ---------------------------------------------------------------------- read-only caches (the `medrank rank` path)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return (
        {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}
        if root.exists()
        else {}
    )


def test_read_only_retrieval_and_grids_match_and_write_nothing(tmp_path, tiny_models, nli_model, fixture_tables):
    answers, medquad = fixture_tables
    rqe = CrossEncoder.load(tiny_models["rqe"], device="cpu", precision="fp32")
    bi = SentenceEncoder(str(tiny_models["base"]), device="cpu")
    questions = questions_table(answers, "question_norm", None)
    docs = medquad_documents(medquad, "question_norm", "answer_norm")
    kw = dict(question_col="question_norm", bm25_top_k=4, precision="auto", show_progress=False)
    ans = answers.rename(columns={"answer_sentences": "sentences"})
    grid_kw = dict(max_sentences=3, prefilter_top_k=1, bi=bi, augment_top=0, precision="auto", show_progress=False)

    def run(root: Path, read_only: bool):
        scored = score_candidates(questions, docs, rqe, root / "rqe", read_only=read_only, **kw)
        retrieved = scored.table.groupby(["split", "qid"]).head(2).rename(columns={"bm25_rank": "rank"})
        retrieved = retrieved.assign(sentences=[list(s) for s in docs["answer_sentences"].iloc[retrieved["doc"]]])
        return scored, answer_grids(ans, retrieved, nli_model, root / "embed", read_only=read_only, **grid_kw)

    # nothing cached: computed in memory, no folder appears
    scored, grids = run(tmp_path / "none", read_only=True)
    assert not (tmp_path / "none").exists() and scored.extract.computed == scored.extract.unique > 0
    assert (
        grids.stats["nli"].computed == grids.stats["nli"].unique > 0 and scored.precision == grids.precision == "fp32"
    )
    # a writable run fills the cache; a read-only run over it computes nothing, touches nothing, gives the same rows
    w_scored, w_grids = run(tmp_path / "cache", read_only=False)
    before = _tree(tmp_path / "cache")
    r_scored, r_grids = run(tmp_path / "cache", read_only=True)
    assert _tree(tmp_path / "cache") == before
    assert (
        r_scored.extract.computed == 0
        and r_grids.stats["nli"].computed == 0
        and r_grids.stats["bi_encoder"].computed == 0
    )
    for a, b in ((scored, w_scored), (r_scored, w_scored)):
        np.testing.assert_array_equal(a.table["rqe_score"], b.table["rqe_score"])
        np.testing.assert_array_equal(np.stack(a.table["rqe_cls"]), np.stack(b.table["rqe_cls"]))
    for g in (grids, r_grids):
        pd.testing.assert_frame_equal(g.rows, w_grids.rows)


@pytest.mark.checkout
def test_ray_backend_names_an_address_without_a_cluster():
    """`ray.address: auto` with no Ray running: one error line naming the address, exit 2. Runs before `local_ray`
    below starts this module's Ray (`auto` would join that one)."""
    code = (
        "from medrank.stage.runner import run\nfrom medrank.encoders.distributed import RayBackend, ray_session\n"
        "def main():\n    with ray_session(RayBackend(address='auto')):\n        pass\nrun(main)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert r.returncode == 2 and len(lines) == 1 and "cannot start or join Ray at address 'auto'" in lines[0], r.stderr[
        -2000:
    ]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module's Ray tests: starting one costs seconds."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()


def _cache_content(root: Path, kind: str, model: CrossEncoder, precision: str) -> dict[bytes, tuple]:
    cache = open_cache(model, kind, root, precision, read_only=True)
    got = cache.get(cache.keys())
    return {k: tuple(got[c][i].tobytes() for c in sorted(got)) for i, k in enumerate(cache.keys())}


def _both_passes(root: Path, tables, models: dict, nli_model: CrossEncoder, backend) -> tuple:
    """The RQE pass and the NLI grid cells with small shards (several each) under `backend`: (scored, grids, rqe model)."""
    answers, medquad = tables
    rqe = CrossEncoder.load(models["rqe"], device="cpu", precision="fp32")
    questions = questions_table(answers, "question_norm", None)
    docs = medquad_documents(medquad, "question_norm", "answer_norm")
    scored = score_candidates(
        questions,
        docs,
        rqe,
        root / "rqe",
        question_col="question_norm",
        bm25_top_k=4,
        precision="fp32",
        shard_size=7,
        show_progress=False,
        backend=backend,
    )
    retrieved = scored.table.groupby(["split", "qid"]).head(2).rename(columns={"bm25_rank": "rank"})
    retrieved = retrieved.assign(sentences=[list(s) for s in docs["answer_sentences"].iloc[retrieved["doc"]]])
    grids = answer_grids(
        answers.rename(columns={"answer_sentences": "sentences"}),
        retrieved,
        nli_model,
        root / "embed",
        max_sentences=3,
        prefilter_top_k=None,
        augment_top=1,
        precision="fp32",
        shard_size=16,
        show_progress=False,
        backend=backend,
    )
    return scored, grids, rqe


def _assert_same_passes(tmp_path: Path, local: tuple, other: tuple, name: str, nli_model: CrossEncoder) -> None:
    """Byte-identical cache content, candidate scores and grid rows (what every downstream stage reads)."""
    assert (
        other[0].extract.computed == local[0].extract.computed > 7
        and other[1].stats["nli"].computed == local[1].stats["nli"].computed > 16
    )
    pd.testing.assert_frame_equal(other[0].table.drop(columns="rqe_cls"), local[0].table.drop(columns="rqe_cls"))
    np.testing.assert_array_equal(np.stack(other[0].table["rqe_cls"]), np.stack(local[0].table["rqe_cls"]))
    pd.testing.assert_frame_equal(other[1].rows, local[1].rows)
    for kind, model in (("rqe", local[2]), ("embed", nli_model)):
        ns_kind = "rqe" if kind == "rqe" else "nli"
        assert _cache_content(tmp_path / name / kind, ns_kind, model, "fp32") == _cache_content(
            tmp_path / "local" / kind, ns_kind, model, "fp32"
        )


def test_ray_backend_fills_the_same_cache_and_rows_as_local(
    tmp_path, tiny_models, nli_model, fixture_tables, local_ray
):
    """backend ray: the RQE pass and the NLI grid cells on a 2-actor pool, several shards each → byte-identical cache
    content, candidate scores and grid rows (what every downstream stage reads)."""
    backend = RayBackend(actors=2, cpus_per_actor=1)
    local = _both_passes(tmp_path / "local", fixture_tables, tiny_models, nli_model, None)
    ray = _both_passes(tmp_path / "ray", fixture_tables, tiny_models, nli_model, backend)
    _assert_same_passes(tmp_path, local, ray, "ray", nli_model)
    # a rerun finds everything cached: no actor is started
    answers, medquad = fixture_tables
    again = score_candidates(
        questions_table(answers, "question_norm", None),
        medquad_documents(medquad, "question_norm", "answer_norm"),
        ray[2],
        tmp_path / "ray" / "rqe",
        question_col="question_norm",
        bm25_top_k=4,
        precision="fp32",
        show_progress=False,
        backend=backend,
    )
    assert again.extract.computed == 0


def test_local_pool_fills_the_same_cache_and_rows_as_one_process(
    tmp_path, tiny_models, nli_model, fixture_tables, monkeypatch
):
    """backend local with 2 workers: whole shards on 2 forked one-thread processes → byte-identical cache content,
    candidate scores and grid rows to the in-process pass on 2 threads."""

    from medrank.encoders import distributed

    real = distributed._pool_shard
    pids = tmp_path / "pids"
    pids.mkdir()

    def spy(i: int):  # runs in the forked workers: leaves its process id
        (pids / str(os.getpid())).touch()
        return real(i)

    spy.__module__, spy.__qualname__ = distributed.__name__, "_pool_shard"  # the pool pickles it by module and name
    monkeypatch.setattr(distributed, "_pool_shard", spy)
    torch.set_num_threads(2)  # the one_thread fixture restores the count
    local = _both_passes(tmp_path / "local", fixture_tables, tiny_models, nli_model, None)
    pool = _both_passes(tmp_path / "pool", fixture_tables, tiny_models, nli_model, distributed.LocalPool(2))
    _assert_same_passes(tmp_path, local, pool, "pool", nli_model)
    workers = {int(f.name) for f in pids.iterdir()}
    assert len(workers) == 4 and os.getpid() not in workers  # each pass (RQE, NLI) forked its own two
    assert torch.get_num_threads() == 2  # the caller's threads are untouched


def test_extraction_backend_from_params():
    from medrank.encoders.distributed import LocalPool, extraction_backend
    from medrank.params import RayParams

    assert extraction_backend("local", RayParams(), 3) == LocalPool(3)
    assert extraction_backend("local", RayParams(), "auto") == LocalPool(len(os.sched_getaffinity(0)))
    assert extraction_backend("ray", RayParams(actors=4), "auto") == RayBackend(actors=4)


def test_ray_backend_needs_a_saved_model_and_the_extra(tmp_path, nli_model, monkeypatch):
    unsaved = CrossEncoder(
        nli_model.model, nli_model.tokenizer, max_length=48, label_names=NLI_LABELS, device="cpu", precision="fp32"
    )
    cache = open_cache(unsaved, "nli", tmp_path, "fp32")
    with pytest.raises(MedrankError, match="backend ray loads the model from its folder"):
        cached_extract(unsaved, [("a", "b")], cache, "fp32", show_progress=False, backend=RayBackend())
    monkeypatch.setitem(sys.modules, "ray", None)  # the optional extra not installed
    with pytest.raises(MedrankError, match=r"Ray is not installed \(pip install -e \"\.\[ray\]\"\)"):
        cached_extract(
            nli_model,
            [("a", "b")],
            open_cache(nli_model, "nli", tmp_path, "fp32"),
            "fp32",
            show_progress=False,
            backend=RayBackend(),
        )


def test_stacked_rqe_recipe_rescores_candidates_with_its_bi_encoder(tmp_path, tiny_models, fixture_tables):
    """A cross-encoder saved with a stacked recipe (stage finetune_rqe) and a fine-tuned bi-encoder inside its folder:
    score_candidates keeps the cross-encoder's P as rqe_ce and gives the stack's P as rqe_score."""
    answers, medquad = fixture_tables
    rqe_dir = tmp_path / "rqe"
    ce = CrossEncoder.load(tiny_models["rqe"], device="cpu", precision="fp32")
    stack = {
        "features": ["ce", "cosine"],
        "coef": [0.5, 3.0],
        "intercept": -1.0,
        "bi_encoder": "bi_encoder",
        "bi_encoder_local": True,
        "max_length": 64,
        "seed": 0,
    }
    ce.save(rqe_dir, extra_meta={"recipe": {"stack": stack}})
    bi = SentenceEncoder(str(tiny_models["base"]), device="cpu", max_length=64)
    bi.fit(
        [("what is asthma", "asthma info"), ("what is gout", "acne treatment")],
        [1, 0],
        epochs=1,
        lr=1e-3,
        batch_size=2,
        seed=0,
        precision="fp32",
        show_progress=False,
    )
    bi.save(rqe_dir / "bi_encoder")
    model = CrossEncoder.load(rqe_dir, device="cpu", precision="fp32")
    assert model.fingerprint == ce.fingerprint  # the bi-encoder inside does not change the cross-encoder's fingerprint
    questions = questions_table(answers, "question_norm", None)
    docs = medquad_documents(medquad, "question_norm", "answer_norm")
    t = score_candidates(
        questions, docs, model, tmp_path / "cache", question_col="question_norm", bm25_top_k=4, show_progress=False
    ).table
    tuned = SentenceEncoder(str(rqe_dir / "bi_encoder"), device="cpu", max_length=64)
    cos = np.array(
        [
            float((tuned.encode([q]) * tuned.encode([d])).sum())
            for q, d in zip(t["question"], docs["question_norm"].to_numpy()[t["doc"]])
        ]
    )
    p = np.clip(t["rqe_ce"].to_numpy(), 1e-4, 1 - 1e-4)
    expected = 1 / (1 + np.exp(-(0.5 * np.log(p / (1 - p)) + 3.0 * cos - 1.0)))
    np.testing.assert_allclose(t["rqe_score"].to_numpy(), expected, atol=1e-4)
    assert not np.allclose(t["rqe_score"], t["rqe_ce"])


def test_stacked_rqe_cosines_are_cached_with_the_bits_of_the_uncached_call(tmp_path, tiny_models, fixture_tables):
    """retrieve's stacked RQE scorer: the bi-encoder vectors go to the cache (float32, questions and MedQuAD questions in
    namespaces of their own); a fresh cache gives the uncached call's bits, a second run encodes nothing, and a
    read-only cache (`medrank rank`) writes nothing."""
    from medrank.task3.retrieval import stacked_rqe_scores

    answers, medquad = fixture_tables
    docs = pd.DataFrame({"question": medquad["question"].astype(str)})
    qs = answers["question"].astype(str).drop_duplicates().tolist()
    cands = pd.DataFrame(
        {"question": [q for q in qs for _ in range(len(docs))], "doc": list(range(len(docs))) * len(qs)}
    )
    cands["rqe_ce"] = np.linspace(-2, 2, len(cands))
    stack = {
        "features": ["ce", "cosine"],
        "coef": [0.5, 3.0],
        "intercept": -1.0,
        "bi_encoder": str(tiny_models["base"]),
        "bi_encoder_local": False,
        "max_length": 32,
    }
    plain = stacked_rqe_scores(cands, docs, "question", stack, tmp_path, device="cpu")
    ro = stacked_rqe_scores(
        cands, docs, "question", stack, tmp_path, device="cpu", cache_root=tmp_path / "ro", read_only=True
    )
    assert not (tmp_path / "ro").exists() or not any((tmp_path / "ro").rglob("*.parquet"))
    fresh = stacked_rqe_scores(cands, docs, "question", stack, tmp_path, device="cpu", cache_root=tmp_path / "cache")
    spaces = sorted(p.name.split("-")[1] for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert spaces == ["doc", "q"]
    files = sorted((tmp_path / "cache").rglob("*"))
    again = stacked_rqe_scores(cands, docs, "question", stack, tmp_path, device="cpu", cache_root=tmp_path / "cache")
    assert sorted((tmp_path / "cache").rglob("*")) == files  # nothing new encoded or written
    np.testing.assert_array_equal(fresh, plain)
    np.testing.assert_array_equal(again, plain)
    np.testing.assert_array_equal(ro, plain)
