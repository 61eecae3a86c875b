"""medrank.models.baseline: rank SVM, threshold choice, EM prior shift, grouped CV, the full recipe."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from medrank.selection.decision import em_prior_shift, keep_labels, select_threshold, submission_score
from medrank.selection.experiment import grouped_folds
from medrank.core.errors import MedrankError
from medrank.core.io import write_sealed_json
from medrank.selection.evaluation import evaluate, ranked_rows
from medrank.models.baseline import (
    BaselineConfig,
    FittedBaseline,
    RankSVM,
    fit_baseline,
    pairwise_differences,
)
from medrank.models.baseline_protocols import protocols
from medrank.params import BaselineParams, Params


def config(groups=None, seed=13, ranker="svm", **params) -> BaselineConfig:
    """A baseline run: `params` are params.yaml `baseline` keys, the rest what the run fixes."""
    return BaselineConfig(BaselineParams(**params), tuple(groups or GROUPS), seed=seed, ranker=ranker)


def synthetic_table(n_questions: int = 40, seed: int = 0, split: str = "train_liveqa") -> pd.DataFrame:
    """Answer table (features.answer_table columns) whose bi-encoder cosine carries the relevance signal."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_questions):
        n = int(rng.integers(5, 9))
        quality = rng.normal(size=n)
        ref_rank = np.argsort(np.argsort(-quality)) + 1
        for i in range(n):
            score = 4 if quality[i] > 0.8 else 3 if quality[i] > 0.0 else 2 if quality[i] > -0.8 else 1
            rows.append(
                {
                    "gid": f"{split}:{q}",
                    "split": split,
                    "qid": str(q),
                    "aid": f"{q}_Answer{i + 1}",
                    "source": rng.choice(["medlineplus", "mayoclinic", "gard"]),
                    "n_sentences": float(rng.integers(1, 30)),
                    "chiqa_rank": float(i + 1),
                    "answer_text": "",
                    "label": float(score >= 3),
                    "reference_rank": float(ref_rank[i]),
                    "reference_score": float(score),
                    "bienc_cos": 0.5 + 0.15 * quality[i] + 0.05 * rng.normal(),
                }
            )
    return pd.DataFrame(rows)


GROUPS = ("metadata", "bienc")


def test_grouped_folds_keep_questions_together_and_are_seeded():
    gid = np.repeat([f"q{i}" for i in range(10)], 3)
    f1 = grouped_folds(gid, 5, seed=1)
    assert (pd.Series(f1).groupby(gid).nunique() == 1).all()
    assert sorted(np.bincount(f1)) == [6] * 5  # 2 questions (6 rows) per fold
    np.testing.assert_array_equal(f1, grouped_folds(gid, 5, seed=1))
    assert not np.array_equal(f1, grouped_folds(gid, 5, seed=2))
    with pytest.raises(MedrankError):
        grouped_folds(gid, 11, seed=1)


def test_pairwise_differences_within_questions_only():
    X = sp.csr_matrix(np.arange(10, dtype=float).reshape(5, 2))
    rel = np.array([3, 1, 2, 2, 5])
    gid = np.array(["a", "a", "a", "a", "b"])
    Xd, yd, _ = pairwise_differences(X, rel, gid, seed=0)
    # question a: 6 pairs minus the tie (2, 2) = 5; question b has one answer: no pair
    assert Xd.shape == (5, 2)
    assert set(yd) <= {-1, 1}
    # every row, sign-corrected, is better - worse
    pairs = {(0, 1), (0, 2), (0, 3), (2, 1), (3, 1)}
    got = {tuple((Xd[k].toarray().ravel() * yd[k])) for k in range(5)}
    assert got == {tuple(X[i].toarray().ravel() - X[j].toarray().ravel()) for i, j in pairs}


def test_rank_svm_orders_a_separable_question():
    rng = np.random.default_rng(3)
    # relevance is a linear function of feature 0; feature 1 is noise
    X = np.column_stack([np.arange(8, dtype=float), rng.normal(size=8)])
    perm = rng.permutation(8)
    X = X[perm]
    rel = X[:, 0].copy()
    gid = np.array(["q"] * 8)
    svm = RankSVM(c=1.0, seed=0).fit(sp.csr_matrix(X), rel, gid)
    score = svm.decision_function(sp.csr_matrix(X))
    assert list(np.argsort(-score)) == list(np.argsort(-rel))
    # unseen question on the same scale: ordered by feature 0 too
    Z = np.column_stack([[5.0, 1.0, 3.0], [0.0, 0.0, 0.0]])
    assert list(np.argsort(-svm.decision_function(sp.csr_matrix(Z)))) == [0, 2, 1]


def test_select_threshold_maximises_accuracy_and_breaks_ties_in_the_middle():
    y = np.array([0, 0, 0, 1, 1, 1])
    p = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.8])
    t = select_threshold(y, p)
    assert 0.3 < t <= 0.6
    assert t == pytest.approx(0.45, abs=0.011)  # middle of the perfect plateau (0.31..0.60)
    # imbalanced, overlapping: the best threshold is not 0.5
    y2 = np.array([0] * 8 + [1] * 2)
    p2 = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.55, 0.58, 0.6, 0.7, 0.9])
    t2 = select_threshold(y2, p2)
    assert 0.6 < t2 <= 0.7


def test_em_prior_shift_recovers_a_shifted_positive_rate():
    rng = np.random.default_rng(0)
    # calibrated posteriors under a training prior of 0.5; the target set has 20% positives
    n = 4000
    y = rng.random(n) < 0.2
    x = rng.normal(loc=np.where(y, 1.0, -1.0))
    p_train = 1 / (1 + np.exp(-2 * x))  # exact posterior for N(+-1, 1) classes at prior 0.5
    prior, adj = em_prior_shift(p_train, train_prior=0.5)
    assert prior == pytest.approx(0.2, abs=0.03)
    assert adj.mean() == pytest.approx(prior, abs=1e-4)
    assert ((adj >= 0.5) == y).mean() > ((p_train >= 0.5) == y).mean()  # better accuracy after the shift
    same, same_adj = em_prior_shift(np.full(10, 0.3), train_prior=0.3)
    assert same == pytest.approx(0.3) and np.allclose(same_adj, 0.3)


def test_keep_labels_and_submission_order():
    p = np.array([0.2, 0.6, 0.1, 0.3])
    gid = np.array(["a", "a", "b", "b"])
    assert keep_labels(p, 0.5, gid).tolist() == [0, 1, 0, 0]
    assert keep_labels(p, 0.5, gid, min_keep=1).tolist() == [0, 1, 0, 1]
    labels = np.array([1, 0, 1, 1])
    rank_score = np.array([-5.0, 9.0, 1.0, 2.0])
    s = submission_score(labels, rank_score, gid)
    assert s[0] > s[1]  # kept answers come before dropped ones whatever their rank score
    assert s[3] > s[2]
    pred = pd.DataFrame({"gid": gid, "aid": ["x", "y", "z", "w"], "score": s})
    assert ranked_rows(pred)["aid"].tolist() == ["x", "y", "w", "z"]


def test_fit_predict_beats_keep_all_and_is_deterministic():
    train = synthetic_table(60, seed=1)
    test = synthetic_table(20, seed=2, split="val")
    cfg = config(seed=5)
    model = fit_baseline(train, cfg)
    assert 0.05 <= model.threshold <= 0.95
    pred = model.predict(test)
    assert list(pred.columns) == ["gid", "qid", "aid", "prob", "label", "rank_score", "score"]
    m = evaluate(pred, test)
    keep_all = evaluate(pred.assign(label=1), test)
    assert m["accuracy"] > keep_all["accuracy"] + 0.15
    assert m["spearman_true"] > 0.3
    again = fit_baseline(train, cfg).predict(test)
    pd.testing.assert_frame_equal(pred, again)


def test_saved_model_predicts_bit_for_bit(tmp_path):
    train, test = synthetic_table(40, seed=1), synthetic_table(10, seed=2, split="val")
    model = fit_baseline(train, config(seed=5, prior_shift="em", min_keep=1))
    model.save(tmp_path / "m.json")
    loaded = FittedBaseline.load(tmp_path / "m.json")
    pd.testing.assert_frame_equal(model.predict(test), loaded.predict(test), check_exact=True)
    assert loaded.config == model.config and loaded.threshold == model.threshold
    (tmp_path / "bad.json").write_text('{"config": {}}')  # unsealed
    with pytest.raises(MedrankError, match="bad.json: no record_sha256"):
        FittedBaseline.load(tmp_path / "bad.json")
    write_sealed_json(tmp_path / "bad.json", {"config": {}})  # sealed, but not a model
    with pytest.raises(MedrankError, match="bad.json: not a baseline model"):
        FittedBaseline.load(tmp_path / "bad.json")


def test_filter_only_groups_reach_the_filter_and_not_the_rank_svm(tmp_path):
    train, test = synthetic_table(40, seed=1), synthetic_table(10, seed=2, split="val")
    # a second score whose order disagrees with the labels' within a question
    for t, s in ((train, 3), (test, 4)):
        t["passage_max_cos"] = np.random.default_rng(s).normal(size=len(t))
    both = fit_baseline(train, config(("metadata", "bienc", "passage"), seed=5))
    split = fit_baseline(train, config(("metadata", "bienc", "passage"), seed=5, filter_only=["passage"]))
    alone = fit_baseline(train, config(("metadata", "bienc"), seed=5))
    assert split.config.ranker_groups == ("metadata", "bienc") and both.ranker_builder is None
    got, with_both, without = split.predict(test), both.predict(test), alone.predict(test)
    np.testing.assert_array_equal(got["prob"], with_both["prob"])  # the filter reads the group
    np.testing.assert_array_equal(got["rank_score"], without["rank_score"])  # the rank SVM does not
    assert not np.array_equal(got["rank_score"], with_both["rank_score"])
    split.save(tmp_path / "m.json")
    pd.testing.assert_frame_equal(FittedBaseline.load(tmp_path / "m.json").predict(test), got, check_exact=True)
    # a row of only filter_only groups: the rank SVM reads them all
    assert config(("passage",), filter_only=["passage"]).ranker_groups == ("passage",)


def test_graded_filter_is_the_ordinal_lr_read_at_the_label_cut(tmp_path):
    from sklearn.linear_model import LogisticRegression

    from medrank.models.baseline import GRADE_CUTS, fit_graded_filter

    train, test = synthetic_table(40, seed=1), synthetic_table(10, seed=2, split="val")
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(np.c_[train["bienc_cos"].to_numpy(), rng.normal(size=len(train))])
    grades = train["reference_score"].to_numpy()
    got = fit_graded_filter(X, grades, 1.0, 5)
    # by hand: the rows stacked once per cut, a bias column per cut, no shared intercept
    n, k = len(train), len(GRADE_CUTS)
    dense = X.toarray()
    stacked = np.vstack([np.c_[dense, np.tile(np.eye(k)[i], (n, 1))] for i in range(k)])
    target = np.concatenate([grades >= c for c in GRADE_CUTS]).astype(int)
    ref = LogisticRegression(C=1.0 / k, solver="liblinear", fit_intercept=False, max_iter=1000, random_state=5)
    w = ref.fit(stacked, target).coef_[0]
    x = dense[:5]
    expected = 1 / (1 + np.exp(-(x @ w[:2] + w[2 + GRADE_CUTS.index(3.0)])))
    np.testing.assert_allclose(got.predict_proba(X[:5])[:, 1], expected, rtol=1e-10)
    assert got.coef_[0, 0] > 0  # the cosine carries the grades
    # through the recipe: a filter on the grades, saved and loaded bit for bit; the label's cut keeps its meaning
    model = fit_baseline(train, config(seed=5, filter_target="grade"))
    label = fit_baseline(train, config(seed=5))
    pred = model.predict(test)
    assert not np.array_equal(pred["prob"], label.predict(test)["prob"])
    assert evaluate(pred, test)["accuracy"] > evaluate(pred.assign(label=1), test)["accuracy"] + 0.15
    model.save(tmp_path / "m.json")
    pd.testing.assert_frame_equal(FittedBaseline.load(tmp_path / "m.json").predict(test), pred, check_exact=True)
    with pytest.raises(MedrankError, match="single class"):
        fit_graded_filter(X[:3], np.array([1.0, 2.0, 2.0]), 1.0, 5)
    with pytest.raises(MedrankError, match="without a reference_score"):
        fit_graded_filter(X[:3], np.array([1.0, np.nan, 4.0]), 1.0, 5)


def test_fixed_threshold_and_lr_ranker():
    train = synthetic_table(30, seed=1)
    model = fit_baseline(train, config(threshold=0.5, ranker="lr"))
    assert model.threshold == 0.5 and model.ranker is None
    pred = model.predict(train)
    np.testing.assert_array_equal(pred["rank_score"], pred["prob"])


def test_training_rows_must_be_labelled():
    train = synthetic_table(10, seed=1)
    train.loc[0, "label"] = np.nan
    with pytest.raises(MedrankError, match="without a label"):
        fit_baseline(train, config())


def test_cross_validate_and_source_transfer_report_every_metric():
    table = pd.concat(
        [synthetic_table(15, seed=1), synthetic_table(15, seed=2, split="train_alexa")], ignore_index=True
    )
    cfg = config(cv_folds=3)
    got = protocols(
        table, cfg, None, ("train_liveqa", "train_alexa", "val"), {"em": {"prior_shift": "em"}, "lr": {"ranker": "lr"}}
    )
    out = got["cv"]
    assert set(out) == {"base", "em", "lr"}
    for name in out:
        for metric in ("accuracy", "precision", "mrr", "spearman", "spearman_true"):
            assert set(out[name][metric]) == {"mean", "sd"}
    assert len(out["base"]["thresholds"]) == 3
    assert out["base"]["accuracy"]["mean"] > 0.7
    tr, rows = got["per_source"], got["loso_rows"]
    assert set(tr) == {"train_liveqa", "train_alexa"}  # a source without rows is skipped
    assert 0 < tr["train_alexa"]["em"]["target_prior"] < 1
    # held-out rows in table order, fold = the source's index
    assert list(rows["aid"]) == list(table["aid"]) and set(rows["fold"]) == {0, 1}
    assert list(got["oof"]["aid"]) == list(table["aid"]) and set(got["oof"]["fold"]) == {0, 1, 2}
    assert set(got["loso"]["base"]["by_source"]) == {"train_liveqa", "train_alexa"}
    assert got["loso"]["base"]["accuracy"]["worst"] <= got["loso"]["base"]["accuracy"]["mean"]


def with_judged_lists(table: pd.DataFrame, per_question: int = 6, seed: int = 3) -> pd.DataFrame:
    """`table` plus, for each train_liveqa question, a list of judged answers (medrank.data.judged rows): their own
    gid, the question's qkey, grades only (no ReferenceRank), no CHiQA rank, and a signal in bienc_cos."""
    rng = np.random.default_rng(seed)
    base = table.assign(qkey=table["gid"], judged=False)
    rows = []
    for gid, q in base[base["split"] == "train_liveqa"].groupby("gid", sort=False):
        for i in range(per_question):
            quality = rng.normal()
            grade = 4 if quality > 0.8 else 3 if quality > 0.0 else 2 if quality > -0.8 else 1
            rows.append(
                {
                    "gid": f"{gid}#judged",
                    "qkey": gid,
                    "judged": True,
                    "split": "train_liveqa",
                    "qid": q["qid"].iloc[0],
                    "aid": f"judged:{gid}:{i}",
                    "source": "judged_medquad",
                    "n_sentences": float(rng.integers(1, 30)),
                    "chiqa_rank": np.nan,
                    "answer_text": "",
                    "label": float(grade >= 3),
                    "reference_rank": np.nan,
                    "reference_score": float(grade),
                    "bienc_cos": 0.5 + 0.15 * quality + 0.05 * rng.normal(),
                }
            )
    return pd.concat([base, pd.DataFrame(rows)], ignore_index=True)


def test_judged_rows_only_train_and_stay_with_their_question():
    table = pd.concat(
        [synthetic_table(15, seed=1), synthetic_table(15, seed=2, split="train_alexa")], ignore_index=True
    )
    judged = with_judged_lists(table)
    cfg = config(cv_folds=3, judged_rows="all", features=list(GROUPS))
    both = protocols(judged, replace(cfg, seed=0), None, ("train_liveqa", "train_alexa"))
    oof = both["oof"]
    assert list(oof["aid"]) == list(table["aid"])  # scored: the MEDIQA rows only, in table order
    folds = grouped_folds(judged["qkey"].to_numpy(), 3, 0)
    # a question's judged list shares its fold (it is never on the other side of a split)
    by_q = pd.DataFrame({"qkey": judged["qkey"], "fold": folds}).groupby("qkey")["fold"].nunique()
    assert (by_q == 1).all()
    per_source, rows = both["per_source"], both["loso_rows"]
    assert list(rows["aid"]) == list(table["aid"])
    # held-out liveqa: no judged row trains (they are liveqa's); its positive rate is the MEDIQA rows'
    assert per_source["train_liveqa"]["positive_rate"] == pytest.approx(
        table.loc[table["split"] == "train_liveqa", "label"].mean()
    )
    assert per_source["train_alexa"]["train_positive_rate"] == pytest.approx(
        table.loc[table["split"] == "train_liveqa", "label"].mean()
    )
    model = fit_baseline(judged, cfg)
    assert "chiqa_rank_missing" in model.builder.feature_names and model.builder.rank_missing_
    assert model.train_prior == pytest.approx(table["label"].mean())  # MEDIQA rows' prior, not the judged ones'
    # ranker: the filter trains on the MEDIQA rows only (the same filter as without judged rows), the rank SVM on both
    plain = fit_baseline(table.assign(qkey=table["gid"], judged=False), cfg)
    ranker_only = fit_baseline(judged, config(cv_folds=3, judged_rows="ranker", features=list(GROUPS)))
    from medrank.models.baseline import fit_filter

    mediqa = judged[~judged["judged"]]
    alone = fit_filter(ranker_only.builder.transform(mediqa), mediqa["label"].to_numpy(dtype=int), 1.0, 13)
    np.testing.assert_array_equal(ranker_only.filter.coef_, alone.coef_)
    assert not np.allclose(ranker_only.ranker.coef_[: len(plain.ranker.coef_)], plain.ranker.coef_)
    assert "chiqa_rank_missing" not in plain.builder.feature_names
    with pytest.raises(MedrankError, match="chiqa_rank missing for 1 rows"):
        plain.predict(judged[judged["judged"]].head(1))


def test_judged_rows_rank_pairs_come_from_grades_within_their_own_list():
    from medrank.models.baseline import _relevance

    judged = with_judged_lists(synthetic_table(4, seed=1))
    rel = _relevance(judged, "reference_rank")
    j = judged["judged"].to_numpy()
    np.testing.assert_array_equal(rel[j], judged.loc[j, "reference_score"])
    np.testing.assert_array_equal(rel[~j], -judged.loc[~j, "reference_rank"])
    X = sp.csr_matrix(np.eye(len(judged)))
    D, _, _ = pairwise_differences(X, rel, judged["gid"].to_numpy(), seed=0)
    pairs = [tuple(np.flatnonzero(r)) for r in D.toarray()]
    assert all(judged["gid"].iloc[a] == judged["gid"].iloc[b] for a, b in pairs)  # never a MEDIQA x judged pair


def test_judged_rows_need_groups_with_inputs():
    with pytest.raises(ValueError, match="judged_rows: the judged answers have no anli input"):
        BaselineParams(features=["metadata", "anli"], judged_rows="all")
    assert BaselineParams(features=["metadata", "anli"], judged_rows="none").judged_rows == "none"
    assert BaselineParams(features=["metadata", "bienc"], judged_rows="ranker").judged_rows == "ranker"


def test_judged_rows_need_the_judged_answers_bienc_scores():
    # stage bienc scores the judged answers only with bienc.judged (the default systems never read them)
    with pytest.raises(
        ValueError,
        match="baseline.judged_rows: 'ranker' .* bienc scores stage bienc writes only with bienc.judged: true",
    ):
        Params(baseline={"features": ["metadata", "bienc"], "judged_rows": "ranker"})
    assert Params(
        baseline={"features": ["metadata", "bienc"], "judged_rows": "ranker"}, bienc={"judged": True}
    ).bienc.judged
    assert (
        Params(baseline={"features": ["metadata"], "judged_rows": "all"}).baseline.judged_rows == "all"
    )  # no bienc input read
    # a group reading the MTL path's retrieval is an analysis row's, not the default baseline's (issue 63)
    with pytest.raises(
        ValueError, match="baseline.features: group rqe reads the entailed MedQuAD answers of stage retrieve"
    ):
        Params(baseline={"features": ["metadata", "rqe"]})


def test_an_inner_fold_of_one_class_gets_that_class_rate_and_a_single_class_training_set_is_refused():
    from medrank.models.baseline import oof_probabilities

    table = synthetic_table(4, seed=2)
    table.loc[table["gid"] == table["gid"].iloc[0], "label"] = 0.0  # a question without a correct answer
    table.loc[table["gid"] != table["gid"].iloc[0], "label"] = 1.0  # the others: every answer correct
    p = oof_probabilities(table, config(), None, 2, seed=0)
    folds = np.asarray(grouped_folds(table["gid"].to_numpy(), 2, 0))
    single = [f for f in (0, 1) if table.loc[folds != f, "label"].nunique() == 1]
    assert single  # two questions of all-correct answers share a fold: the other fold trains on one class
    for f in single:  # ... and gets that class's rate (1), no error
        assert (p[folds == f] == 1.0).all()
    with pytest.raises(MedrankError, match="single class"):
        fit_baseline(table[table["label"] == 1.0], config(threshold=0.5))


# ---------------------------------------------------------------- LightGBM: baseline.ranker lambdamart, filter_model gbdt


def lgbm_config(groups=None, seed=5, **params) -> BaselineConfig:
    """A baseline run with params.yaml `baseline` keys `params` (`ranker` here is baseline.ranker, not the run's)."""
    return BaselineConfig(BaselineParams(**params), tuple(groups or GROUPS), seed=seed)


def test_lambdamart_relevance_is_rank_distance_from_the_worst_or_the_grade_less_one():
    from medrank.models.baseline import lambdarank_relevance

    judged = with_judged_lists(synthetic_table(4, seed=1))
    j = judged["judged"].to_numpy()
    rel = lambdarank_relevance(judged, "reference_rank")
    assert rel.dtype == np.int32
    worst = judged.groupby("gid")["reference_rank"].transform("max")
    np.testing.assert_array_equal(rel[~j], (worst - judged["reference_rank"])[~j])
    np.testing.assert_array_equal(rel[j], judged.loc[j, "reference_score"] - 1)  # the judged lists: their grades
    np.testing.assert_array_equal(lambdarank_relevance(judged, "reference_score"), judged["reference_score"] - 1)
    # a question of 40 answers: clipped to LightGBM's default gains (relevance 0..30), the 10 best share 30
    long = pd.DataFrame({"gid": "q", "reference_rank": np.arange(1.0, 41.0), "reference_score": 3.0})
    got = lambdarank_relevance(long, "reference_rank")
    assert (got[:10] == 30).all() and got[10] == 29 and got[-1] == 0


def test_lambdamart_orders_a_question_by_the_feature_that_carries_relevance():
    from medrank.models.baseline import LambdaMART

    train, test = synthetic_table(60, seed=1), synthetic_table(20, seed=2, split="val")
    model = fit_baseline(train, lgbm_config(ranker="lambdamart"))
    assert isinstance(model.ranker, LambdaMART)
    pred = model.predict(test)
    assert not np.array_equal(pred["rank_score"], pred["prob"])
    best = test.loc[test.groupby("gid")["reference_rank"].idxmin(), "aid"]
    top = pred.loc[pred.groupby("gid")["rank_score"].idxmax(), "aid"]
    assert np.mean(np.isin(top, best)) >= 0.6  # the correct first answer gets the top score in most questions (0.75)
    assert evaluate(pred, test)["spearman_true"] > 0.3
    pd.testing.assert_frame_equal(fit_baseline(train, lgbm_config(ranker="lambdamart")).predict(test), pred)
    # the run's ranker "lr" (order by probability) drops it as it drops the rank SVM
    assert fit_baseline(train, replace(lgbm_config(ranker="lambdamart"), ranker="lr")).ranker is None


def test_lambdamart_groups_are_the_questions_wherever_their_rows_are():
    from medrank.models.baseline import LambdaMART

    rng = np.random.default_rng(0)
    gid = np.repeat(np.arange(12), 6)
    X = rng.normal(size=(len(gid), 3))
    rel = np.argsort(np.argsort(X[:, 0].reshape(12, 6), axis=1), axis=1).ravel()
    gbdt = BaselineParams().gbdt.model_copy(update={"min_child_samples": 3})
    contiguous = LambdaMART.fit(sp.csr_matrix(X), rel, gid, gbdt, seed=0)
    mixed = np.argsort(np.tile(np.arange(6), 12), kind="stable")  # the questions' rows interleaved
    interleaved = LambdaMART.fit(sp.csr_matrix(X[mixed]), rel[mixed], gid[mixed], gbdt, seed=0)
    assert interleaved.model_str == contiguous.model_str
    with pytest.raises(MedrankError, match="no answer pair with different relevance"):
        LambdaMART.fit(sp.csr_matrix(X), np.zeros(len(gid)), gid, gbdt, seed=0)


def test_gbdt_filter_separates_the_classes_and_drives_the_threshold():
    from medrank.models.baseline import GbdtFilter

    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.4).astype(int)
    X = sp.csr_matrix(np.c_[y + 0.3 * rng.normal(size=200), rng.normal(size=200)])
    clf = GbdtFilter.fit(X, y, BaselineParams().gbdt, seed=0)
    p = clf.predict_proba(X)
    assert p.shape == (200, 2) and np.allclose(p.sum(axis=1), 1.0)
    assert p[y == 1, 1].min() > p[y == 0, 1].max()
    with pytest.raises(MedrankError, match="single class"):
        GbdtFilter.fit(X, np.ones(200), BaselineParams().gbdt, seed=0)
    train, test = synthetic_table(60, seed=1), synthetic_table(20, seed=2, split="val")
    model = fit_baseline(train, lgbm_config(filter_model="gbdt"))  # threshold on the gbdt's out-of-fold probabilities
    assert isinstance(model.filter, GbdtFilter) and 0.05 <= model.threshold <= 0.95
    pred = model.predict(test)
    assert evaluate(pred, test)["accuracy"] > evaluate(pred.assign(label=1), test)["accuracy"] + 0.15


def test_lightgbm_models_are_saved_as_text_and_predict_bit_for_bit(tmp_path):
    import json

    train, test = synthetic_table(40, seed=1), synthetic_table(10, seed=2, split="val")
    for t, s in ((train, 3), (test, 4)):
        t["passage_max_cos"] = np.random.default_rng(s).normal(size=len(t))
    groups = ("metadata", "bienc", "passage")
    cfg = lgbm_config(groups, ranker="lambdamart", filter_model="gbdt", filter_only=["passage"], prior_shift="em")
    model = fit_baseline(train, cfg)
    pred = model.predict(test)
    # filter_only as with the rank SVM: the ranker reads the groups less passage, with its own builder
    alone = fit_baseline(train, lgbm_config(("metadata", "bienc"), ranker="lambdamart", filter_model="gbdt"))
    assert model.ranker_builder is not None
    np.testing.assert_array_equal(pred["rank_score"], alone.predict(test)["rank_score"])
    model.save(tmp_path / "m.json")
    d = json.loads((tmp_path / "m.json").read_text())
    assert set(d["filter"]) == {"gbdt"} and d["rank_svm"] is None and d["lambdamart"].startswith("tree")
    loaded = FittedBaseline.load(tmp_path / "m.json")
    assert loaded.config == model.config
    pd.testing.assert_frame_equal(loaded.predict(test), pred, check_exact=True)


def test_the_default_model_file_keeps_its_layout_and_an_older_file_still_loads(tmp_path):
    import json

    train, test = synthetic_table(30, seed=1), synthetic_table(10, seed=2, split="val")
    model = fit_baseline(train, config(seed=5))
    assert isinstance(model.ranker, RankSVM) and model.config.params.ranker == "rank_svm"
    model.save(tmp_path / "m.json")
    d = json.loads((tmp_path / "m.json").read_text())
    top = {"config", "builder", "ranker_builder", "filter", "rank_svm", "threshold", "train_prior", "info"}
    assert set(d) - {"record_sha256"} == top  # no lightgbm key
    assert set(d["filter"]) == {"coef", "intercept", "classes"} and set(d["rank_svm"]) == {"c", "coef"}
    # a file written before baseline.ranker / filter_model / gbdt existed
    d.pop("record_sha256")
    for k in ("ranker", "filter_model", "gbdt"):
        del d["config"]["params"][k]
    write_sealed_json(tmp_path / "old.json", d)
    old = FittedBaseline.load(tmp_path / "old.json")
    assert old.config == model.config
    pd.testing.assert_frame_equal(old.predict(test), model.predict(test), check_exact=True)


def test_a_gbdt_filter_on_the_grades_is_refused_naming_the_keys():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="filter_model: gbdt supports filter_target label only"):
        BaselineParams(filter_model="gbdt", filter_target="grade")
    with pytest.raises(ValueError, match="filter_model: gbdt supports filter_target label only"):
        Params(baseline={"filter_model": "gbdt", "filter_target": "grade"})
    assert BaselineParams(ranker="lambdamart", filter_target="grade").ranker == "lambdamart"
    with pytest.raises(ValidationError, match="num_leaves"):
        BaselineParams(gbdt={"num_leaves": 1})
