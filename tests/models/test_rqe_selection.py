"""RQE for consumer questions (medrank.models.rqe): pair sources, question types, slices, CV rows and the choice."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrank.selection.experiment import grouped_folds
from medrank.core.errors import MedrankError
from medrank.models import rqe
from medrank.models import rqe_choice
from tests.helpers.tables import MEDQUAD


@pytest.fixture(scope="module")
def qtypes() -> rqe.QuestionTypes:
    return rqe.QuestionTypes(MEDQUAD, seed=0)


def test_question_types_learn_the_asking_words_not_the_topic(qtypes):
    # foci never seen in training, consumer wordings
    got = qtypes.predict(["How can I treat my eczema?", "What causes psoriasis?", "What are the signs of lupus?"])
    assert got.tolist() == ["treatment", "causes", "symptoms"]
    same, other = qtypes.agreement(
        ["How is lupus treated?"] * 2, ["What are the treatments for lupus?", "What causes lupus?"]
    )
    assert same > 0.5 > other


def test_pair_slices_same_focus_and_overlap_buckets():
    s = rqe.pair_slices(
        ["Asthma. My son wheezes at night, what medicine helps?", "Asthma. My son wheezes", "I have gout"],
        ["What are the treatments for asthma?", "What is acne?", "What is gout and what causes gout attacks?"],
    )
    assert s["same_focus"].tolist() == [True, False, True]
    assert s["bucket"].tolist() == ["low", "none", "low"] and s["overlap"].iloc[1] == 0.0
    assert rqe.content_tokens("What are the treatments for Asthma?") == {"treatment", "asthma"}


def test_cv_folds_never_split_a_chq():
    chq = np.array([f"q{i // 3}" for i in range(60)])  # 20 CHQs, 3 FAQs each
    folds = grouped_folds(chq, 5, seed=1)
    assert all(len(set(folds[chq == q])) == 1 for q in set(chq))
    assert sorted(set(folds)) == [0, 1, 2, 3, 4]


def test_summary_pairs_positives_hard_and_easy_negatives(qtypes):
    chqs = [
        "Asthma. my son wheezes, what medicine can he take?",
        "Asthma. why did my son get asthma?",
        "Gout. my toe hurts, how do I treat gout?",
    ]
    summaries = ["What are the treatments for asthma?", "What causes asthma?", "What are the treatments for gout?"]
    pairs, y = rqe.summary_pairs(
        chqs,
        [[s] for s in summaries],
        qtypes,
        np.random.default_rng(0),
        hard=1,
        easy=0,
        focus_vocab=rqe.focus_vocabulary(MEDQUAD.assign(focus=MEDQUAD["focus"])),
    )
    pos = [p for p, lab in zip(pairs, y) if lab == 1]
    neg = dict(p for p, lab in zip(pairs, y) if lab == 0)
    assert pos == list(zip(chqs, summaries))
    # the hard negative shares the topic and asks another type: never a paraphrase of the CHQ's own ask
    assert neg[chqs[0]] == "What causes asthma?" and neg[chqs[1]] == "What are the treatments for asthma?"
    # gout's only other-type summaries are about asthma with no shared topic word: no hard negative for it
    assert chqs[2] not in neg
    with pytest.raises(MedrankError, match="at least 2"):
        rqe.summary_pairs(chqs[:1], [summaries[:1]], qtypes, np.random.default_rng(0))


def test_pair_sources_cap_and_unknown_source(qtypes):
    amia = pd.DataFrame({"chq": [f"c{i}" for i in range(10)], "faq": [f"f{i}" for i in range(10)], "label": [0, 1] * 5})
    src = rqe.PairSources(
        amia, pd.DataFrame(columns=["chq", "summary"]), pd.DataFrame(), MEDQUAD, medquad_pairs=8, max_pairs=4
    )
    pairs, y = src.pairs("amia", qtypes, seed=3)
    assert len(pairs) == 4 and y.sum() == 2 and src.pairs("amia", qtypes, seed=3)[0] == pairs  # stratified, seeded
    assert len(src.pairs("medquad", qtypes, seed=3)[0]) == 4
    with pytest.raises(MedrankError, match="unknown RQE training source 'icliniq'"):
        src.pairs("icliniq", qtypes, seed=3)
    with pytest.raises(MedrankError, match="unknown source"):
        rqe.check_row_sources([["meqsum", "icliniq"]])


def test_select_measures_every_row_and_keeps_the_best_on_the_cv(qtypes):
    """Stand-in trainers: a 'model' is a skill; its score separates the classes more the more it saw."""
    rng = np.random.default_rng(0)
    n = 40
    y = np.array([0, 1] * (n // 2))
    chq = [f"Asthma. question {i // 2}" for i in range(n)]
    data = rqe.CvData(
        chq,
        [f"What are the treatments for asthma {i}?" for i in range(n)],
        y,
        grouped_folds(np.asarray(chq), 4, seed=0),
    )
    noise = rng.normal(0, 2.5, n)
    src = rqe.PairSources(
        pd.DataFrame({"chq": ["a", "b"], "faq": ["c", "d"], "label": [0, 1]}),
        pd.DataFrame({"chq": ["x", "y"], "summary": ["What causes asthma?", "What is gout?"]}),
        pd.DataFrame(),
        MEDQUAD,
        medquad_pairs=4,
    )
    index = {p: i for i, p in enumerate(data.pairs)}

    def family(kind: str, skill_of_set: float, cosine: bool) -> rqe_choice.Family:
        def pretrain(pairs, labels, name):
            return {"skill": skill_of_set if "meqsum" in name else 0.2}

        def train_val(pairs, labels, init):
            return {"skill": (init or {"skill": 0.0})["skill"] + 0.5}

        def predict(model, pairs):
            idx = np.array([index[p] for p in pairs])
            z = model["skill"] * 4 * (y[idx] - 0.5) + noise[idx]
            return np.tanh(z / 8) if cosine else 1 / (1 + np.exp(-z))

        return rqe_choice.Family(
            kind, [["amia"], ["meqsum"]] if kind == "cross_encoder" else [["meqsum"]], pretrain, train_val, predict
        )

    families = [family("cross_encoder", 1.0, False), family("bi_encoder", 2.0, True)]
    sel = rqe_choice.select(data, src, qtypes, families, rng.random(n), seed=0)
    names = {
        rqe_choice.ZERO_SHOT,
        "ce: val",
        "ce: amia",
        "ce: amia > val",
        "ce: meqsum",
        "ce: meqsum > val",
        "bi: val",
        "bi: meqsum",
        "bi: meqsum > val",
    }
    assert names <= set(sel.rows)
    assert {r["kind"] for r in sel.rows.values()} == {"cosine", "cross_encoder", "bi_encoder", "stack"}
    best = max(r["accuracy"] for r in sel.rows.values())
    assert sel.rows[sel.chosen]["accuracy"] == best
    assert sel.best_ce == (("meqsum",), True)  # the best cross-encoder row, for retrieval
    if sel.recipe.bi:
        assert ("bi_encoder", sel.recipe.bi[0]) in sel.pretrained or sel.recipe.bi[0] == ()
    assert ("cross_encoder", ("meqsum",)) in sel.pretrained and ("cross_encoder", ("amia",)) not in sel.pretrained
    assert len(sel.oof) == n and sel.pretrain_pairs["amia"] == 2
    diffs = rqe_choice.paired_differences(sel, data)
    assert set(diffs) == {"ce: amia", rqe_choice.ZERO_SHOT}
    assert diffs["ce: amia"]["accuracy_diff"] == pytest.approx(
        np.mean(np.subtract(sel.rows[sel.chosen]["accuracy_folds"], sel.rows["ce: amia"]["accuracy_folds"])), abs=1e-4
    )


def test_a_family_without_val_stage_fine_tunes_no_fold_model_and_the_report_names_what_the_default_lacks(qtypes):
    """finetune.rqe.val_stages: a family left out trains its pretrained rows only (no fold fine-tune runs);
    missing_from_default compares analysis rqe_selection's choice with the rows the default trains."""
    rng = np.random.default_rng(1)
    n = 60
    chq = [f"Asthma. question {i // 2}" for i in range(n)]
    y = np.array([0, 1] * (n // 2))
    data = rqe.CvData(
        chq,
        [f"What are the treatments for asthma {i}?" for i in range(n)],
        y,
        grouped_folds(np.asarray(chq), 3, seed=0),
    )
    calls = []

    def train_val(pairs, labels, init):
        calls.append(len(pairs))
        return init

    fam = rqe_choice.Family(
        "cross_encoder",
        [["meqsum"]],
        lambda pairs, labels, name: {"m": 1},
        train_val,
        lambda model, pairs: np.full(len(pairs), 0.5),
        val_stage=False,
    )
    src = rqe.PairSources(
        pd.DataFrame({"chq": ["a", "b"], "faq": ["c", "d"], "label": [0, 1]}),
        pd.DataFrame({"chq": ["x", "y"], "summary": ["What causes asthma?", "What is gout?"]}),
        pd.DataFrame(),
        MEDQUAD,
        medquad_pairs=4,
    )
    sel = rqe_choice.select(data, src, qtypes, [fam], rng.random(n), seed=0, val_only=False)
    assert calls == [] and "ce: meqsum" in sel.rows and "ce: meqsum > val" not in sel.rows
    recipe = {
        "best_cross_encoder": {"extras": ["meqsum"], "val_stage": False},
        "bi_encoder": {"extras": ["meqsum", "liveqa"], "val_stage": True},
    }
    held = {"extra_sets": [["meqsum"]], "bi_encoder_sets": [["meqsum", "liveqa"]], "val_stages": ["bi_encoder"]}
    assert rqe_choice.missing_from_default(recipe, held) == {}
    assert rqe_choice.missing_from_default(recipe, {**held, "val_stages": []}) == {"val_stages": ["bi_encoder"]}
    assert rqe_choice.missing_from_default(recipe, {**held, "extra_sets": [["amia"]]}) == {"extra_sets": [["meqsum"]]}


def test_stack_linear_form_reproduces_the_pipeline_and_does_not_starve_a_small_spread_column():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    cos = 0.5 + 0.08 * (y - 0.5) + rng.normal(0, 0.03, 400)  # informative, small spread
    logit = rng.normal(0, 5, 400)  # noise, large spread
    x = rqe.stack_features({"ce": 1 / (1 + np.exp(-logit)), "cosine": cos}, ["ce", "cosine"])
    stack = rqe.fit_stack(x, y, seed=0)
    coef, intercept = rqe.linear_form(stack)
    np.testing.assert_allclose(1 / (1 + np.exp(-(x @ coef + intercept))), stack.predict_proba(x)[:, 1], atol=1e-8)
    assert np.mean((stack.predict_proba(x)[:, 1] >= 0.5) == y) > 0.9
