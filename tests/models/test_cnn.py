"""Severyn & Moschitti CNN re-ranker: sentence-selection data, lexical features, the network, training, MEDIQA use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from medrank.data import squad_sentences as ss
from medrank.data.schemas import SQUAD
from medrank.selection.decision import best_cut_threshold, relative_to_question_best
from medrank.selection.metrics import rank_metrics
from medrank.core.errors import MedrankError
from medrank.models.cnn import (
    CnnConfig,
    CnnRanker,
    Encoder,
    SeverynMoschittiCNN,
    TrainConfig,
    cnn_answer_scores,
    make_batch,
    make_optimizer,
)
from medrank.models.word2vec import WordVectors, train_word2vec, training_texts
from tests.helpers import FIXTURES

FIXTURE = FIXTURES / "cnn" / "squad_tiny.json"

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def squad() -> pd.DataFrame:
    rows = []
    for pi, p in enumerate(json.loads(FIXTURE.read_text())):
        pid = f"{p['article']}#{pi}"
        for qi, (q, answers) in enumerate(p["questions"]):
            rows.append(
                {
                    "split": p["split"],
                    "article": p["article"],
                    "paragraph_id": pid,
                    "paragraph": p["paragraph"],
                    "question_id": f"{pid}#{qi}",
                    "question": q,
                    "answers": answers,
                }
            )
    df = pd.DataFrame(rows)
    assert list(df.columns) == SQUAD.names
    return df


@pytest.fixture(scope="module")
def pairs(squad: pd.DataFrame) -> pd.DataFrame:
    return ss.build_sentence_pairs(squad)[0]


def _tiny_model(overlap_dim: int = 3, dropout: float = 0.0, seed: int = 0) -> SeverynMoschittiCNN:
    cfg = CnnConfig(
        vocab_size=12, emb_dim=6, overlap_dim=overlap_dim, conv_width=3, n_filters=4, hidden_size=5, dropout=dropout
    )
    emb = np.random.default_rng(seed).normal(size=(12, 6)).astype(np.float32)
    emb[0] = 0.0
    return SeverynMoschittiCNN(cfg, emb, seed=seed)


# ---------------------------------------------------------------- relevance labelling


def test_label_contains_gold_answer_case_insensitive_whitespace_collapsed():
    sents = ["The river rises in the BLACK   Forest.", "It flows east.", "Nothing here."]
    assert ss.relevance_labels(sents, ["black forest"]) == [1, 0, 0]


def test_label_needs_word_boundaries():
    # "1" must not match inside "1990", nor "art" inside "party"
    assert ss.relevance_labels(["It ended in 1990.", "There was 1 winner."], ["1"]) == [0, 1]
    assert ss.relevance_labels(["A party was held.", "Modern art."], ["art"]) == [0, 1]


def test_label_strips_answer_punctuation():
    # annotators sometimes include the sentence-final period or quotes in the answer span
    assert ss.relevance_labels(
        ["They used primary law, secondary law and supplementary law."], ['"supplementary law."']
    ) == [1]


def test_label_multiple_matches_all_relevant():
    # without character offsets a repeated answer string cannot be pinned down: every containing sentence counts
    sents = ["Paris is large.", "Berlin is old.", "Many visit Paris."]
    assert ss.relevance_labels(sents, ["Paris"]) == [1, 0, 1]
    # several gold answers (dev has up to 3+): a sentence matching any of them is relevant
    assert ss.relevance_labels(sents, ["Berlin", "Paris"]) == [1, 1, 1]
    # a longer answer that also contains a shorter one does not hide the shorter match elsewhere
    assert ss.relevance_labels(["in the Black Forest", "the Black Sea"], ["the Black Forest", "Black"]) == [1, 1]


def test_label_no_answers():
    assert ss.relevance_labels(["a", "b"], []) == [0, 0]
    assert ss.relevance_labels(["a", "b"], [" . "]) == [0, 0]


def test_build_pairs_drops_unanswerable_and_all_relevant_questions():
    squad = pd.DataFrame(
        [
            {
                "split": "train",
                "article": "A",
                "paragraph_id": "A#0",
                "paragraph": "Cats purr. Dogs bark. Cows moo.",
                "question_id": "A#0#0",
                "question": "What do dogs do?",
                "answers": ["bark"],
            },
            # answer crosses a sentence boundary: no sentence contains it
            {
                "split": "train",
                "article": "A",
                "paragraph_id": "A#0",
                "paragraph": "Cats purr. Dogs bark. Cows moo.",
                "question_id": "A#0#1",
                "question": "What then?",
                "answers": ["purr. Dogs"],
            },
            # one-sentence paragraph: every candidate relevant, cannot separate rankings
            {
                "split": "train",
                "article": "A",
                "paragraph_id": "A#1",
                "paragraph": "Birds sing.",
                "question_id": "A#1#0",
                "question": "What do birds do?",
                "answers": ["sing"],
            },
        ]
    )
    df, stats = ss.build_sentence_pairs(squad)
    assert df["question_id"].unique().tolist() == ["A#0#0"]
    assert df["label"].tolist() == [0, 1, 0]
    assert df["sent_idx"].tolist() == [0, 1, 2]
    assert stats["train"]["dropped_no_match"] == 1 and stats["train"]["dropped_all_relevant"] == 1
    assert stats["train"]["kept"] == 1 and stats["train"]["mean_candidates"] == 3.0


def test_fixture_pairs(pairs: pd.DataFrame):
    assert list(pairs.columns) == ss.SENTENCE_PAIRS.names
    per_q = pairs.groupby("question_id")["label"].agg(["sum", "size"])
    assert (per_q["sum"] >= 1).all() and (per_q["sum"] < per_q["size"]).all()
    q = pairs[pairs["question"] == "When was the Aswan Dam completed?"]
    assert q.loc[q["label"] == 1, "sentence"].tolist() == ["The Aswan Dam was completed in 1970."]


# ---------------------------------------------------------------- lexical features and baselines


def test_overlap_features_manual():
    idf = ss.Idf({"dam": 1, "aswan": 2, "the": 10}, n_docs=10)
    q = ss.tokenize("When was the Aswan Dam built?")  # when was the aswan dam built
    s = ss.tokenize("The Aswan Dam opened.")
    f = ss.overlap_features(q, s, idf)
    # all words: 3 of 6 question words in the sentence
    assert f[0] == pytest.approx(3 / 6)
    w = {t: idf(t) for t in set(q)}
    assert f[1] == pytest.approx((w["the"] + w["aswan"] + w["dam"]) / sum(w.values()))
    # without stopwords (when, was, the): aswan, dam, built -> 2 of 3
    assert f[2] == pytest.approx(2 / 3)
    assert f[3] == pytest.approx((w["aswan"] + w["dam"]) / (w["aswan"] + w["dam"] + w["built"]))
    assert idf("unseen") == pytest.approx(np.log(11)) and idf("dam") == pytest.approx(np.log(11 / 1))


def test_baselines_and_ranx_metrics(pairs: pd.DataFrame):
    dev = pairs[pairs["split"] == "dev"].reset_index(drop=True)
    wo = ss.word_overlap_scores(dev)
    bm = ss.bm25_scores(dev)
    assert wo.shape == bm.shape == (len(dev),)
    # a perfect run scores 1, the reversed run less
    perfect = rank_metrics(dev, dev["label"].to_numpy(dtype=float))
    assert perfect == {"mrr": 1.0, "map": 1.0, "precision@1": 1.0}
    worst = rank_metrics(dev, -dev["label"].to_numpy(dtype=float))
    assert worst["mrr"] < 0.5
    m = rank_metrics(dev, ss.tie_break(wo, 0))
    assert m["mrr"] > worst["mrr"]


def test_tie_break_keeps_order_of_distinct_scores():
    s = np.array([3.0, 1.0, 2.0, 2.0])
    t = ss.tie_break(s, 1)
    assert np.argsort(-t)[0] == 0 and np.argsort(-t)[-1] == 1
    assert np.array_equal(t, ss.tie_break(s, 1))


def test_sampling_is_seeded_and_row_order_free(pairs: pd.DataFrame):
    a = set(ss.sample_questions(pairs, 5, 3)["question_id"])
    b = set(ss.sample_questions(pairs.iloc[::-1], 5, 3)["question_id"])
    assert a == b and len(a) == 5
    assert len(ss.sample_questions(pairs, None, 3)) == len(pairs)
    train, held = ss.hold_out_articles(pairs, 10, 0)
    assert held["article"].nunique() == pairs["article"].nunique() // 2
    assert not set(train["article"]) & set(held["article"])
    some = ss.sample_pairs(pairs, 7, 0)
    sizes = pairs.groupby("question_id").size()
    assert len(some) >= 7 and len(some) - sizes[some["question_id"].iloc[-1]] < 7  # whole questions, minimal count


# ---------------------------------------------------------------- the network


def test_theta_is_the_papers_parameter_set():
    model = _tiny_model()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"F_q", "b_q", "F_d", "b_d", "M", "w_h", "b_h", "w_s", "b_s", "overlap_embedding.weight"}
    assert not model.embedding.weight.requires_grad  # skip-gram vectors stay fixed by default


@pytest.mark.parametrize("n", [1, 4, 9])
def test_wide_conv_output_length_and_values(n: int):
    model = _tiny_model()
    m, d_in = model.cfg.conv_width, model.cfg.emb_dim + model.cfg.overlap_dim
    x = torch.randn(2, d_in, n)
    y = model.wide_conv(x, model.F_q, model.b_q)
    assert y.shape == (2, model.cfg.n_filters, n + m - 1)
    # manual wide convolution: zero-pad m-1 on both sides, y[t] = sum_k F[:, :, k] . xpad[t + k] + b
    xp = np.concatenate([np.zeros((2, d_in, m - 1)), x.numpy(), np.zeros((2, d_in, m - 1))], axis=2)
    F_, b_ = model.F_q.detach().numpy(), model.b_q.detach().numpy()
    manual = np.stack([np.einsum("fdk,bdk->bf", F_, xp[:, :, t : t + m]) + b_ for t in range(n + m - 1)], axis=2)
    np.testing.assert_allclose(y.detach().numpy(), manual, rtol=1e-5, atol=1e-5)


def test_shapes_through_the_network():
    model = _tiny_model().eval()
    q_ids = torch.tensor([[2, 3, 4, 0], [5, 6, 7, 8]])
    d_ids = torch.tensor([[2, 9, 10, 11, 0, 0], [3, 3, 3, 4, 5, 6]])
    q_len, d_len = torch.tensor([3, 4]), torch.tensor([4, 6])
    q_ov = (q_ids > 0).long() + (q_ids == 2).long()
    d_ov = (d_ids > 0).long()
    emb = model.embed(q_ids, q_ov)
    assert emb.shape == (2, 6 + 3, 4)
    x_q = model.pool(model.wide_conv(emb, model.F_q, model.b_q), q_len)
    assert x_q.shape == (2, 4) and (x_q >= 0).all()
    feats = torch.zeros(2, model.cfg.n_features)
    logits = model(q_ids, q_ov, q_len, d_ids, d_ov, d_len, feats)
    assert logits.shape == (2, 2)


def test_pooling_ignores_batch_padding():
    model = _tiny_model().eval()
    words = [f"w{i}" for i in range(10)]
    enc = Encoder(words, ss.Idf({}, 1), max_tokens=20)
    ranker = CnnRanker(model, enc)
    alone = ranker.predict(["w0 w1"], ["w0 w2 w3"])
    batched = ranker.predict(["w0 w1", "w4 w5 w6 w7 w8 w9 w1"], ["w0 w2 w3", "w1 w2 w3 w4 w5 w6 w7 w8 w9"])
    assert batched[0] == pytest.approx(alone[0], abs=1e-6)


def test_bilinear_similarity_matches_manual():
    model = _tiny_model()
    with torch.no_grad():
        model.M.copy_(torch.randn(4, 4))
    x_q, x_d = torch.randn(3, 4), torch.randn(3, 4)
    sim = model.similarity(x_q, x_d)
    assert sim.shape == (3, 1)
    M = model.M.detach().numpy().astype(np.float64)
    for i in range(3):
        q, d = x_q[i].numpy().astype(np.float64), x_d[i].numpy().astype(np.float64)
        manual = sum(q[a] * M[a, b] * d[b] for a in range(4) for b in range(4))
        assert float(sim[i, 0].detach()) == pytest.approx(manual, rel=1e-5, abs=1e-6)


def test_one_optimisation_step_lowers_the_loss(pairs: pd.DataFrame):
    words = sorted({w for t in pd.concat([pairs["question"], pairs["sentence"]]) for w in ss.tokenize(t)})
    vectors = WordVectors(words, np.random.default_rng(0).normal(size=(len(words), 8)).astype(np.float32))
    idf = ss.Idf.fit(ss.tokenize(s) for s in pairs["sentence"])
    ranker = CnnRanker.create(
        vectors, idf, {"dropout": 0.0, "n_filters": 10, "hidden_size": 12, "conv_width": 3}, seed=0
    )
    data = ranker.encoder.encode(pairs["question"].tolist(), pairs["sentence"].tolist())
    batch = make_batch(data, np.arange(len(pairs)))
    y = torch.tensor(pairs["label"].to_numpy(dtype=np.int64))
    for optimizer, lr in (("sgd", 0.05), ("adadelta", 1.0)):
        r = CnnRanker.create(
            vectors, idf, {"dropout": 0.0, "n_filters": 10, "hidden_size": 12, "conv_width": 3}, seed=0
        )
        opt = make_optimizer(r.model, TrainConfig(optimizer=optimizer, lr=lr, l2=1e-4))
        before = r.loss(batch, y)
        opt.zero_grad()
        before.backward()
        opt.step()
        with torch.no_grad():
            after = r.loss(batch, y)
        assert after.item() < before.item(), optimizer
    with pytest.raises(MedrankError):
        make_optimizer(ranker.model, TrainConfig(optimizer="adam"))


def test_train_save_load_roundtrip_and_beats_chance(pairs: pd.DataFrame, tmp_path: Path):
    corpus = pairs["sentence"].drop_duplicates().tolist() * 5
    vectors = train_word2vec(corpus, dim=10, window=3, min_count=1, epochs=2, seed=1)
    again = train_word2vec(corpus, dim=10, window=3, min_count=1, epochs=2, seed=1)
    assert vectors.words == again.words and np.array_equal(vectors.vectors, again.vectors)  # reproducible
    vectors.save(tmp_path / "w2v")
    loaded = WordVectors.load(tmp_path / "w2v")
    assert loaded.words == vectors.words and np.array_equal(loaded.vectors, vectors.vectors)
    saved = (tmp_path / "w2v" / "vectors.npy").read_bytes()
    flipped = bytearray(saved)
    flipped[-2] ^= 0x01  # a valid .npy with one other number
    (tmp_path / "w2v" / "vectors.npy").write_bytes(bytes(flipped))
    with pytest.raises(MedrankError, match="vectors.npy: no sha256 recorded in meta.json, or the file differs from it"):
        WordVectors.load(tmp_path / "w2v")
    (tmp_path / "w2v" / "vectors.npy").write_bytes(saved)

    train = pairs[pairs["split"] == "train"].reset_index(drop=True)
    dev = pairs[pairs["split"] == "dev"].reset_index(drop=True)
    idf = ss.Idf.fit(ss.tokenize(s) for s in train["sentence"].drop_duplicates())
    ranker = CnnRanker.create(loaded, idf, {"n_filters": 8, "hidden_size": 8, "conv_width": 3, "dropout": 0.0}, seed=0)
    enc = ranker.encoder.encode(train["question"].tolist(), train["sentence"].tolist())
    seen = []
    history = ranker.fit(
        enc,
        train["label"].to_numpy(),
        TrainConfig(epochs=3, batch_size=4, lr=1.0),
        seed=0,
        on_epoch=lambda e, loss: seen.append(loss) or -loss,
    )
    assert [h["epoch"] for h in history] == [1, 2, 3] and len(seen) == 3
    # patience: training stops after `patience` epochs without a better score; the best epoch's weights are kept
    scores_by_epoch = iter([0.5, 0.7, 0.6, 0.65, 0.9])
    stopped = CnnRanker.create(loaded, idf, {"n_filters": 8, "hidden_size": 8, "conv_width": 3, "dropout": 0.0}, seed=0)
    hist = stopped.fit(
        enc,
        train["label"].to_numpy(),
        TrainConfig(epochs=5, batch_size=4, lr=1.0, patience=2),
        seed=0,
        on_epoch=lambda e, loss: next(scores_by_epoch),
    )
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    scores = ranker.predict(dev["question"].tolist(), dev["sentence"].tolist())
    assert ((scores > 0) & (scores < 1)).all()
    # overlap features carry most of the signal: even this tiny model ranks dev above chance
    assert rank_metrics(dev, scores)["mrr"] > 0.6

    ranker.save(tmp_path / "cnn")
    back = CnnRanker.load(tmp_path / "cnn")
    np.testing.assert_allclose(back.predict(dev["question"].tolist(), dev["sentence"].tolist()), scores, rtol=1e-6)
    with pytest.raises(MedrankError):
        CnnRanker.load(tmp_path / "missing")
    # flipped tensor bytes (a valid safetensors file with other weights) are refused, not used
    w = tmp_path / "cnn" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-3] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(
        MedrankError, match="model.safetensors: no sha256 recorded in config.json, or the file differs from it"
    ):
        CnnRanker.load(tmp_path / "cnn")


def _edit_json(edit):
    return lambda path: path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    "name, damage, message",
    [
        ("config.json", _truncate, r"config.json: cannot read \(JSONDecodeError\)"),
        (
            "config.json",
            _edit_json(lambda c: {**c, "max_tokens": 3}),
            "config.json: edited or damaged since it was saved",
        ),
        ("vocab.json", _truncate, "vocab.json: no sha256 recorded in config.json, or the file differs from it"),
        (
            "vocab.json",
            _edit_json(lambda w: w[1:] + w[:1]),
            "vocab.json: no sha256 recorded in config.json, or the file",
        ),
        ("idf.json", _truncate, "idf.json: no sha256 recorded in config.json, or the file differs from it"),
        ("idf.json", _edit_json(lambda d: {**d, "n_docs": d["n_docs"] + 1}), "idf.json: no sha256 recorded in config"),
        ("idf.json", lambda path: path.unlink(), "idf.json: no sha256 recorded in config.json, or the file differs"),
    ],
    ids=[
        "config_truncated",
        "config_edited",
        "vocab_truncated",
        "vocab_edited",
        "idf_truncated",
        "idf_edited",
        "idf_gone",
    ],
)
def test_a_damaged_or_edited_cnn_side_file_is_one_error_line(tmp_path: Path, name, damage, message):
    """Issue 46 #4: a truncated models/cnn/config.json, vocab.json or idf.json was a traceback; a vocabulary or IDF table
    edited into other valid JSON was used silently (other scores). Each is one line naming the file and the way back."""
    vectors = WordVectors(
        ["what", "is", "flu", "a", "virus"], np.random.default_rng(0).normal(size=(5, 4)).astype("f4")
    )
    idf = ss.Idf({"flu": 2, "virus": 1, "what": 3}, 4)
    ranker = CnnRanker.create(vectors, idf, {"n_filters": 4, "hidden_size": 4, "conv_width": 3, "dropout": 0.0}, seed=0)
    ranker.save(tmp_path / "cnn")
    assert CnnRanker.load(tmp_path / "cnn").encoder.words == ranker.encoder.words
    damage(tmp_path / "cnn" / name)
    with pytest.raises(MedrankError, match=message) as e:
        CnnRanker.load(tmp_path / "cnn")
    assert "dvc checkout" in str(e.value) and "dvc repro cnn_train" in str(e.value)


# ---------------------------------------------------------------- MEDIQA use


class _LengthRanker:
    """Stub ranker: a sentence's score is its word count / 10."""

    def predict(self, questions, documents):
        return np.array([len(d.split()) / 10 for d in documents])


def test_answer_scores_max_and_mean():
    answers = pd.DataFrame(
        {"question": ["q", "q"], "answer": ["One two. One two three four.", "Single sentence here."]}
    )
    split = lambda t: [s for s in t.split(". ") if s]
    mx = cnn_answer_scores(_LengthRanker(), answers, "max", split)
    mean = cnn_answer_scores(_LengthRanker(), answers, "mean", split)
    assert mx["cnn_score"].tolist() == pytest.approx([0.4, 0.3])
    assert mean["cnn_score"].tolist() == pytest.approx([0.3, 0.3])
    assert mx["n_sentences"].tolist() == [2, 1]
    with pytest.raises(MedrankError):
        cnn_answer_scores(_LengthRanker(), answers, "median", split)


def test_word2vec_training_texts_are_squad_train_paragraphs_then_medquad_answers():
    squad = pd.DataFrame(
        {
            "split": ["train", "train", "dev", "train"],
            "paragraph_id": ["p1", "p1", "d1", "p2"],
            "paragraph": ["first para", "first para", "dev para", "second para"],
        }
    )
    medquad = pd.DataFrame({"answer": ["an answer", None, "  ", "another"]})
    assert training_texts(squad, None) == (["first para", "second para"], 2)
    assert training_texts(squad, medquad) == (["first para", "second para", "an answer", "another"], 2)


def test_best_cut_threshold():
    scores = np.array([0.1, 0.2, 0.6, 0.7, 0.4])
    labels = np.array([0, 0, 1, 1, 0])
    t = best_cut_threshold(scores, labels)
    assert 0.4 < t <= 0.6
    assert ((scores >= t) == labels).all()


def test_relative_to_question_best():
    scores = pd.Series([0.2, 0.1, 0.8, 0.4])
    qids = pd.Series(["a", "a", "b", "b"])
    np.testing.assert_allclose(relative_to_question_best(scores, qids), [1.0, 0.5, 1.0, 0.5])
