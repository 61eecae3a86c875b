"""Keep rules, orders and the two protocols (question-grouped CV, leave-one-source-out) of medrank.selection.decision /
medrank.selection.evaluation: what the score stage's written rule selects from."""

from typing import get_args

import numpy as np
import pandas as pd
import pytest

from medrank.selection import decision as D
from medrank.selection import evaluation as E
from medrank.selection import experiment as X
from medrank.core.errors import MedrankError
from medrank.params import KeepRule, OrderRule


def _synthetic(n_q: int, prior: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Questions of 8 answers; P(valid) = `prior`; calibrated-ish scores: valid ~ Beta(4, 2), invalid ~ Beta(2, 4)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n_q * 8) < prior).astype(int)
    p = np.where(y == 1, rng.beta(4, 2, len(y)), rng.beta(2, 4, len(y)))
    return y, p, np.repeat(np.arange(n_q), 8)


def test_rule_names_match_params():
    assert list(get_args(KeepRule)) == list(D.KEEP_RULES) and list(get_args(OrderRule)) == list(D.ORDERS)


def test_keep_kinds():
    p, gid = np.array([0.9, 0.7, 0.2, 0.3, 0.25, 0.1]), np.array([0, 0, 0, 1, 1, 1])
    assert list(D.Keep("threshold", 0.5).labels(p, gid)) == [1, 1, 0, 0, 0, 0]
    assert list(D.Keep("threshold", 0.5, min_keep=1).labels(p, gid)) == [1, 1, 0, 1, 0, 0]
    assert list(D.Keep("relative", 0.1).labels(p, gid)) == [1, 0, 0, 1, 1, 0]
    assert list(D.Keep("top_k", 2).labels(p, gid)) == [1, 1, 0, 1, 1, 0]
    k = D.Keep("threshold", 0.4, 1, 0.3)
    assert D.Keep.from_json(k.to_json()) == k


def test_fitted_rules_on_separable_rows():
    y = np.array([1, 1, 0, 0, 1, 0, 0, 0])
    p = np.array([0.9, 0.8, 0.3, 0.1, 0.7, 0.4, 0.2, 0.05])
    gid = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    for rule in ("threshold", "min_keep_1", "isotonic", "relative"):
        keep = D.fit_keep(rule, y, p, gid, p)
        assert list(keep.labels(p, gid)) == list(y), rule
    # one count for every question cannot fit 2 and 1 valid answers: the accuracy-best k misses one answer
    top = D.fit_keep("top_k", y, p, gid)
    assert top.value in (1, 2) and (top.labels(p, gid) == y).mean() == 7 / 8
    assert 0.4 < D.fit_keep("platt", y, p, gid, p).value < 0.7
    # platt_min_keep_1: platt's threshold, and a question whose answers all fall below it keeps its most probable one
    both = D.fit_keep("platt_min_keep_1", y, p, gid)
    assert (both.value, both.min_keep) == (D.fit_keep("platt", y, p, gid).value, 1)
    low = np.array([0.9, 0.8, 0.3, 0.1, 0.35, 0.3, 0.2, 0.05])
    assert list(both.labels(low, gid)) == [1, 1, 0, 0, 1, 0, 0, 0]
    assert list(D.fit_keep("platt", y, p, gid).labels(low, gid)) == [1, 1, 0, 0, 0, 0, 0, 0]
    assert D.fit_keep("fixed_0.5", y, p, gid).value == 0.5
    with pytest.raises(MedrankError, match="target"):
        D.fit_keep("em", y, p, gid)
    with pytest.raises(MedrankError, match="keep rule 'nope'"):
        D.fit_keep("nope", y, p, gid)


@pytest.mark.parametrize("rule", ["em_fraction", "bbse_fraction", "em"])
def test_prior_matching_rules_follow_the_target_prior(rule):
    y, p, gid = _synthetic(200, 0.3, 1)
    yt, pt, _ = _synthetic(200, 0.6, 2)  # the target has twice the positive rate
    keep = D.fit_keep(rule, y, p, gid, pt)
    assert keep.target_prior == pytest.approx(0.6, abs=0.08)
    kept = keep.labels(pt, np.repeat(np.arange(200), 8)).mean()
    fixed = D.fit_keep("threshold", y, p, gid).labels(pt, np.repeat(np.arange(200), 8)).mean()
    assert kept > fixed  # the shift-aware rule keeps more on the richer target
    if rule != "em":
        assert kept == pytest.approx(keep.target_prior, abs=0.01)


def test_the_posterior_fraction_is_the_mean_calibrated_posterior_and_moves_toward_the_target():
    y, p, gid = _synthetic(200, 0.3, 1)
    yt, pt, _ = _synthetic(200, 0.6, 2)
    keep = D.fit_keep("posterior_fraction", y, p, gid, pt)
    a, b = D.platt(y, p)
    assert keep.target_prior == pytest.approx(float(np.mean(1 / (1 + np.exp(-(a * D._logit(pt) + b))))))
    # no EM step: part of the way from the calibration rows' rate (0.3) to the target's (0.6)
    assert 0.3 < keep.target_prior < 0.6
    assert keep.labels(pt, np.repeat(np.arange(200), 8)).mean() == pytest.approx(keep.target_prior, abs=0.01)
    assert "posterior_fraction" in D.BATCH_ADAPTIVE


def test_orders():
    rows = pd.DataFrame({"gid": ["a"] * 3, "prob": [0.6, 0.9, 0.7], "rank_key": [3.0, 1.0, 2.0], "label": [1, 1, 1]})
    order = lambda o: list(np.argsort(-D.order_key(rows, o)))
    assert order("rank") == [0, 2, 1] and order("prob") == [1, 2, 0]
    assert order("prob_first") == [1, 0, 2]  # the most probable kept answer first, then the rank model's order
    with pytest.raises(MedrankError, match="order"):
        D.order_key(rows, "nope")


def _cand() -> pd.DataFrame:
    gids = [f"{s}:{i}" for s in ("train_alexa", "train_liveqa", "val") for i in range(4)]
    rows = []
    for g in gids:
        split = g.split(":")[0]
        for j, lab in enumerate([1, 0, 0]):
            rows.append(
                {
                    "gid": g,
                    "qid": g,
                    "split": split,
                    "aid": f"{g}-{j}",
                    "label": lab,
                    "reference_rank": j + 1,
                    "reference_score": 4 - 2 * j,
                    "chiqa_rank": j + 1,
                }
            )
    return pd.DataFrame(rows)


def test_decide_system_loso_fits_on_the_other_sources():
    cand = _cand()
    sources = ("train_liveqa", "train_alexa", "val")
    # each source's valid answers sit at a different probability; one rule per held-out source from the other two
    level = {"train_alexa": 0.9, "train_liveqa": 0.3, "val": 0.7}
    scores = cand.assign(
        prob=[level[s] if lab else 0.1 for s, lab in zip(cand["split"], cand["label"])],
        rank_key=-cand["chiqa_rank"],
    )
    got = X.experiment({"s": X.FixedScores(scores, cand)}, X.questions_of(cand), [X.CV(2, 0), X.LOSO(sources, 0)])
    cv, loso = got["s"]["cv"], got["s"]["loso"]
    assert len(loso.info["keep_fits"]["loso"]) == 3 and len(cv.info["keep_fits"]["folds"]) == 2
    loso = loso.summary["base"]
    assert set(loso["by_source"]) == set(sources)
    # the rule fitted on sources with higher valid levels misses train_liveqa's 0.3 valid answers: the worst source
    assert loso["accuracy"]["worst_source"] == "train_liveqa" and loso["accuracy"]["worst"] < 1.0
    assert loso["accuracy"]["mean"] == pytest.approx(
        np.mean([m["accuracy"] for m in loso["by_source"].values()]), abs=1e-4
    )
    assert set(cv.summary["base"]["accuracy"]) == {"mean", "sd"}
    # the same folds scored from decided rows (the score stage's path) give the same figures
    assert E.cv_summary_of(cv.rows.assign(part="oof"), cand) == cv.summary["base"]


def test_pick_prefers_the_simplest_within_the_band():
    assert E.pick({"simple": 0.80, "complex": 0.81}, band=0.02) == "simple"
    assert E.pick({"simple": 0.80, "complex": 0.83}, band=0.02) == "complex"
    runs = [
        (
            {
                "accuracy": {"mean": a},
                "mrr": {"mean": 0.5},
                "spearman": {"mean": 0.3},
                "precision": {"mean": 0},
                "spearman_true": {"mean": 0},
            },
            {
                "accuracy": {"mean": a},
                "mrr": {"mean": 0.5},
                "spearman": {"mean": 0.3},
                "precision": {"mean": 0},
                "spearman_true": {"mean": 0},
            },
        )
        for a in (0.8, 0.82)
    ]
    spread = E.seed_spread(runs)
    assert (
        spread["accuracy"] == pytest.approx(np.std([0.8, 0.82], ddof=1), abs=1e-4)
        and spread["order"] == 0.0
        and spread["seeds"] == 2
    )


def test_confirmed_row_wins_only_beyond_the_default_seed_spread():
    from medrank.selection.evaluation import confirm_table

    default = [0.80, 0.81, 0.79, 0.80]  # sd 0.0082: the band
    out = confirm_table(
        {"default": default, "better": [a + 0.03 for a in default], "noise": [0.81, 0.80, 0.80, 0.81]}, [13, 14, 15, 16]
    )
    assert out["band"] == pytest.approx(np.std(default, ddof=1)) and out["seeds"] == [13, 14, 15, 16]
    rows = out["rows"]
    assert (
        rows["better"]["win"]
        and rows["better"]["diff_mean"] == pytest.approx(0.03)
        and rows["better"]["diff_sd"] == pytest.approx(0.0, abs=1e-12)
    )
    assert not rows["noise"]["win"] and rows["noise"]["diff_mean"] == pytest.approx(0.005)  # paired +0.005 < band
    assert not rows["default"]["win"] and rows["default"]["diff_mean"] == 0.0


def _two_questions() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Question a: 3 answers (a1 correct, a2 correct, a3 not), question b: 2 answers (b1 not, b2 correct).
    Kept: a1, a3, b1, b2 (listed in submission order within each question) -> pi0 = 3/5."""
    cand = pd.DataFrame(
        {
            "gid": ["a", "a", "a", "b", "b"],
            "aid": ["a1", "a2", "a3", "b1", "b2"],
            "label": [1, 1, 0, 0, 1],
            "reference_rank": [1, 2, 3, 2, 1],
            "reference_score": [4, 3, 1, 1, 4],
            "split": "s",
            "qid": ["a", "a", "a", "b", "b"],
        }
    )
    rows = pd.DataFrame(
        {
            "gid": ["a", "a", "a", "b", "b"],
            "aid": ["a1", "a3", "a2", "b1", "b2"],
            "label": [1, 1, 0, 1, 1],
            "score": [2.0, 1.5, 0.1, 2.0, 1.0],
            "fold": 0,
        }
    )
    return rows, cand


def test_prior_shift_reproduces_a_hand_computed_case():
    rows, cand = _two_questions()
    got = X.PriorShift(priors=(0.6, 0.2)).fold_scores(rows, cand)
    # at its own rate (0.6) every weight is 1: the official scores
    official = E.evaluate_decided(rows, cand)
    for m in E.METRICS:
        assert got[0.6][m] == pytest.approx(official[m]), m
    # by hand at pi = 0.2: TPR = 2/3 (a1, b2 kept; a2 dropped), TNR = 0 (a3, b1 kept), FPR = 1
    assert got[0.2]["accuracy"] == pytest.approx(0.2 * 2 / 3 + 0.8 * 0)
    assert got[0.2]["precision"] == pytest.approx(0.2 * 2 / 3 / (0.2 * 2 / 3 + 0.8 * 1))
    # correct rows weigh 0.2/0.6 = 1/3, incorrect 0.8/0.4 = 2: question a's mean weight (1/3+1/3+2)/3 = 8/9,
    # b's (2+1/3)/2 = 7/6; reciprocal ranks: a 1 (a1 first), b 1/2 (b1 kept first, b2 second)
    wa, wb = 8 / 9, 7 / 6
    assert got[0.2]["mrr"] == pytest.approx((wa * 1 + wb * 0.5) / (wa + wb))
    # Spearman: a keeps one correct answer (a1), b one (b2): no question has 2 kept correct -> 0
    assert got[0.2]["spearman"] == 0.0
    s = X.PriorShift(priors=(0.6, 0.2)).summary({0: got, 1: got})
    assert s["accuracy"]["worst_prior"] == 0.2 and s["accuracy"]["worst"] == pytest.approx(round(0.2 * 2 / 3, 4))
    assert s["accuracy"]["best"] == pytest.approx(round(official["accuracy"], 4))


def test_minimax_threshold_is_best_in_the_worst_case():
    y, p, gid = _synthetic(200, 0.3, 5)
    t = D.minimax_threshold(y, p, (0.2, 0.65))

    def worst(th: float) -> float:
        tpr, tnr = np.mean(p[y == 1] >= th), np.mean(p[y == 0] < th)
        return min(pi * tpr + (1 - pi) * tnr for pi in np.arange(0.2, 0.651, 0.05))

    assert all(worst(t) >= worst(g) - 1e-12 for g in D.THRESHOLD_GRID)
    # the accuracy-best threshold of rows with 30% positives sits higher: it trades the rich-prior end away
    assert t < D.select_threshold(y, p) and worst(t) > worst(D.select_threshold(y, p))
    k = D.fit_keep("minimax_min_keep_1", y, p, gid)
    assert (
        k.kind == "threshold"
        and k.min_keep == 1
        and k.value == pytest.approx(D.minimax_threshold(y, p, X.SHIFT_PRIORS))
    )


def _two_sources(prior: float, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Questions of 8 answers from one source; well-separated scores: logit p ~ N(+-2, 1) by label, plus `shift` (a
    source the model is over-confident on when > 0)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(150 * 8) < prior).astype(int)
    p = 1 / (1 + np.exp(-(rng.normal(np.where(y == 1, 2.0, -2.0), 1.0) + shift)))
    return y, p, np.repeat(np.arange(150), 8)


def _calibration() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (y1, p1, g1), (y2, p2, g2) = _two_sources(0.35, 11), _two_sources(0.55, 12)
    return np.concatenate([y1, y2]), np.concatenate([p1, p2]), np.concatenate([g1, g2 + 150])


def test_em_guarded_follows_em_on_a_prior_shift():
    y, p, gid = _calibration()
    _, pt, _ = _two_sources(0.65, 13)  # the calibration sources' class-conditionals at another rate
    dist, critical = D.label_shift_ks(y, p, pt, D.fit_keep("em", y, p, gid, pt).target_prior)
    assert dist < critical
    em, guarded = D.fit_keep("em", y, p, gid, pt), D.fit_keep("em_guarded", y, p, gid, pt)
    assert guarded == D.Keep("threshold", em.value, 1, em.target_prior)
    assert em.target_prior == pytest.approx(0.65, abs=0.05)


def test_em_guarded_falls_back_on_a_source_unlike_the_calibration_sources():
    y, p, gid = _calibration()
    # the Alexa case: a third source at the calibration rate that the model scores over-confidently
    _, pt, _ = _two_sources(0.45, 14, shift=2.0)
    em = D.fit_keep("em", y, p, gid, pt)
    assert em.target_prior > 0.6  # EM reads the miscalibration as a richer batch
    dist, critical = D.label_shift_ks(y, p, pt, em.target_prior)
    assert dist > critical
    guarded = D.fit_keep("em_guarded", y, p, gid, pt)
    assert guarded == D.fit_keep("min_keep_1", y, p, gid) and guarded.target_prior is None


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_em_guarded_falls_back_outside_the_trusted_priors(rate):
    y, p, gid = _calibration()
    _, pt, _ = _two_sources(rate, 15)  # label shift alone, but to a rate EM_GUARD_PRIORS does not trust
    prior = D.fit_keep("em", y, p, gid, pt).target_prior
    assert not D.EM_GUARD_PRIORS[0] <= prior <= D.EM_GUARD_PRIORS[1]
    assert D.fit_keep("em_guarded", y, p, gid, pt) == D.fit_keep("min_keep_1", y, p, gid)


def test_em_guarded_needs_the_target_rows():
    y, p, gid = _calibration()
    for target in (None, np.array([])):
        with pytest.raises(MedrankError, match="target"):
            D.fit_keep("em_guarded", y, p, gid, target)


def test_the_keep_rules_are_one_table_with_the_params_vocabulary():
    """Every name params accepts has its fit in decision.KEEP_FITS, in the same order, and nothing else does; the
    batch-adaptive rules are the table's transductive ones."""
    from medrank.params.rankers import KEEP_RULES

    assert list(D.KEEP_FITS) == list(KEEP_RULES)
    assert D.BATCH_ADAPTIVE == tuple(r for r, (_, transductive) in D.KEEP_FITS.items() if transductive)
    y, p, gid = np.array([1, 0, 1, 0]), np.array([0.9, 0.2, 0.6, 0.4]), np.array([0, 0, 1, 1])
    for rule in D.BATCH_ADAPTIVE:
        with pytest.raises(MedrankError, match=f"keep rule '{rule}' needs the target rows' probabilities"):
            D.fit_keep(rule, y, p, gid)
