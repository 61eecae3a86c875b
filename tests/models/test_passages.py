"""Group passage: an answer's windows, the best window's cosine, stage passages' file and the feature group."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from medrank.core import layout
from medrank.task3.answer_scores import PASSAGE_SCORES, answer_passages, passage_scores
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.task3.features import FeatureBuilder, answer_table, read_answer_scores
from tests.conftest import write_params


def words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize(
    "sentences, window, cap, expected",
    [
        (["a b c", "d e", "f g h i", "j"], 5, 8, ["a b c d e", "f g h i j"]),
        (["a b c", "d e", "f g h i", "j"], 5, 1, ["a b c d e"]),  # only the first windows
        (["a b c d e f g", "h"], 5, 8, ["a b c d e f g", "h"]),  # a longer sentence is a window alone
        (["a b", "c d e f"], 5, 8, ["a b", "c d e f"]),  # whole sentences: none split to fill a window
        ([], 5, 8, [""]),
    ],
)
def test_answer_passages_packs_whole_sentences(sentences, window, cap, expected):
    assert answer_passages(sentences, words, window, cap) == expected


LONG = "Medicines such as steroids and rest help a lot of the people who live with lupus every single day."
ANSWERS = pd.DataFrame(
    {
        "split": ["train_liveqa", "train_liveqa", "val"],
        "qid": ["1", "1", "2"],
        "aid": ["1_Answer1", "1_Answer2", "2_Answer1"],
        "question_norm": ["How is lupus treated?", "How is lupus treated?", "What causes anemia?"],
        "answer_norm": ["Lupus (Treatment): rest. Medicines help.", "Lupus (Causes): unknown.", "Iron deficiency."],
        "answer_sentences": [
            ["Lupus (Treatment): rest.", LONG],
            ["Lupus (Causes): unknown."],
            None,  # no sentences: the text is one window
        ],
        "source": "medlineplus",
        "system_rank": [1, 2, 1],
        "answer_pos": [1, 2, 1],
        "reference_rank": [1, 2, 1],
        "reference_score": [4, 1, 3],
        "label": [1, 0, 1],
    }
)


def test_passage_scores_take_the_best_window(tmp_path, tiny_base):
    bi = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    pp, bp = SimpleNamespace(window_tokens=6, max_passages=8), SimpleNamespace(batch_size=4, precision="fp32")
    table, stats = passage_scores(ANSWERS, bi, cache_root=tmp_path, pp=pp, bp=bp)
    assert table["n_passages"].tolist() == [2, 1, 1]
    assert stats["windows"] == 4
    # the max over the answer's windows of cos(question, window), encoded directly (uncached, fp32)
    q = bi.encode(ANSWERS["question_norm"].tolist(), "fp32")
    first = bi.encode(["Lupus (Treatment): rest.", LONG], "fp32")
    expected0 = max(float(first[0] @ q[0]), float(first[1] @ q[0]))
    assert table["passage_max_cos"].iloc[0] == pytest.approx(expected0, abs=2e-3)  # the cache stores float16
    alone = bi.encode(["Iron deficiency."], "fp32")
    assert table["passage_max_cos"].iloc[2] == pytest.approx(float(alone[0] @ q[2]), abs=2e-3)
    again, stats = passage_scores(ANSWERS, bi, cache_root=tmp_path, pp=pp, bp=bp)
    assert stats["computed"] == 0  # a re-run encodes nothing
    pd.testing.assert_frame_equal(again, table)


def test_stage_passages_writes_group_passage(tmp_path, monkeypatch, tiny_base):
    from stages import passages as stage

    (tmp_path / layout.NORMALIZED).mkdir(parents=True)
    (tmp_path / layout.PROCESSED).mkdir(parents=True)
    ANSWERS.to_parquet(tmp_path / layout.ANSWERS)
    ANSWERS[["split", "qid", "aid"]].assign(bienc_cos=[0.5, 0.2, 0.4]).to_parquet(tmp_path / layout.BIENC)
    write_params(
        tmp_path,
        {
            "encoders": {"zero_shot": {"model": str(tiny_base), "max_length": 32, "precision": "fp32"}},
            "passages": {"window_tokens": 16, "max_passages": 2},
        },
    )
    monkeypatch.chdir(tmp_path)
    stage.main()
    table = pq.read_table(tmp_path / layout.PASSAGE_SCORES)
    assert table.schema.equals(PASSAGE_SCORES, check_metadata=False)
    metrics = json.loads((tmp_path / layout.metrics_file("passages")).read_text())
    assert metrics["windows"] == 4 and metrics["answers_read_past_the_first_window"] == 1
    assert set(metrics["auc"]) == {"bienc_cos", "passage_max_cos"}
    # the baseline / mtl / nested stages read the group back from the stage's file
    scores = read_answer_scores(ANSWERS, {"passage"})
    np.testing.assert_array_equal(scores["passage_max_cos"], table.column("passage_max_cos").to_numpy())
    rows = answer_table(ANSWERS.assign(answer_sentences=ANSWERS["answer_sentences"].map(lambda s: s or [])), **scores)
    feats = FeatureBuilder(("passage",)).fit(rows)
    assert feats.feature_names == [
        "passage_max_cos",
        "passage_max_cos_minus_max",
        "passage_max_cos_minus_mean",
        "passage_rank_frac",
    ]
    assert feats.transform(rows).shape == (3, 4)


def test_medrank_rank_scores_passages_as_the_stage_did(tmp_path, tiny_base):
    from medrank.params import Params, step_params
    from medrank.steps import save_step
    from medrank.steps.score_step import AnswerScores

    p = Params.model_validate(
        {
            # the passage group's own encoder (one owner per encoder): bienc keeps the default entry
            "encoders": {
                "zero_shot": {},
                "windows": {"model": str(tiny_base), "max_length": 32, "precision": "fp32", "batch_size": 4},
            },
            "passages": {"encoder": "windows", "window_tokens": 16, "max_passages": 2},
        }
    )
    stage_cache = tmp_path / "cache"
    stage, _ = passage_scores(
        ANSWERS,
        SentenceEncoder(str(tiny_base), device="cpu", max_length=32),
        cache_root=stage_cache,
        pp=p.passages,
        bp=p.encoder_of("passages"),
    )
    save_step("passages", step_params(p, "passages"), {}, models_dir=tmp_path / "models")
    scores = AnswerScores.load({"passage"}, tmp_path / "models", device="cpu")
    # the saved step's params, not params.yaml's: the encoder's values (the step names no table entry)
    assert scores.p.passages.model_dump(exclude={"encoder"}) == p.passages.model_dump(exclude={"encoder"})
    assert scores.p.encoder_of("passages") == p.encoders["windows"]
    # with the stage's cache (read only) and without any (a machine holding only models/): the stage's values
    for cache in (stage_cache, tmp_path / "absent"):
        scores.caches["passages"] = cache
        got = scores.scores(ANSWERS)
        np.testing.assert_allclose(got["passage_max_cos"], stage["passage_max_cos"], atol=2e-3)
    assert not (tmp_path / "absent").exists()


def test_agreement_is_the_best_and_mean_cosine_with_the_questions_entailed_answers():
    """Group agree: an answer's unit vector against its own question's entailed answers only; none entailed -> 0."""
    import numpy as np
    import pandas as pd

    from medrank.task3.answer_scores import agreement_from_vectors

    answers = pd.DataFrame({"split": ["val", "val", "test"], "qid": ["1", "1", "2"], "aid": ["a", "b", "c"]})
    vec = lambda *x: np.array(x, dtype=float) / np.linalg.norm(x)
    answer_vecs = np.stack([vec(1, 0), vec(0, 1), vec(1, 1)])
    # question 1 entails two MedQuAD answers; question 2 (test) none; a row of another question must not count
    entailed = pd.DataFrame({"split": ["val", "val", "train_alexa"], "qid": [1, 1, 2]})
    entailed_vecs = np.stack([vec(1, 0), vec(1, 1), vec(0, 1)])
    got = agreement_from_vectors(answers, answer_vecs, entailed, entailed_vecs)
    r = np.sqrt(0.5)
    assert got["agree_max_cos"].tolist() == pytest.approx([1.0, r, 0.0])
    assert got["agree_mean_cos"].tolist() == pytest.approx([(1 + r) / 2, r / 2, 0.0])
    assert got["n_entailed"].tolist() == [2, 2, 0] and got["aid"].tolist() == ["a", "b", "c"]
