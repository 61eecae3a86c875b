"""Resampled priors (medrank.selection.resampling): batches drawn by dropping answers within questions, the keep rule
re-run on each; for a fixed rule the figures agree with re-weighting (experiment.PriorShift), for a batch-adaptive one
only resampling lets it adapt."""

import numpy as np
import pandas as pd
import pytest

from medrank.selection import decision as D
from medrank.selection import evaluation as E
from medrank.selection import resampling as R
from medrank.selection.experiment import PriorShift, SHIFT_PRIORS


def _cand(gid: list[str], y: list[int]) -> pd.DataFrame:
    """A truth table: each question's answers in their listed order as the reference order (correct: grade 4)."""
    out = pd.DataFrame({"gid": gid, "aid": [f"{g}.{i}" for i, g in enumerate(gid)], "label": y})
    rank = out.groupby("gid", sort=False).cumcount() + 1
    return out.assign(qid=out["gid"], split="s", reference_rank=rank, reference_score=np.where(out["label"] == 1, 4, 1))


def _hand_case() -> tuple[pd.DataFrame, pd.DataFrame]:
    """q1: a1 a2 correct, a3 not; q2: b1 correct, b2 b3 not; q3: c1 correct only (P = 4, N = 3, rate 4/7)."""
    cand = _cand(["q1"] * 3 + ["q2"] * 3 + ["q3"], [1, 1, 0, 1, 0, 0, 1])
    batch = cand[["gid", "aid"]].assign(prob=[0.9, 0.8, 0.6, 0.7, 0.2, 0.3, 0.7])
    return cand, batch.assign(rank_key=batch["prob"])


def _synthetic(n_q: int, prior: float, seed: int, sep: float = 1.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Questions of 8 answers, P(correct) = `prior`; score x ~ N(+-sep, 1) by label, prob = sigmoid(2 sep x) (the
    posterior at rate 0.5)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n_q * 8) < prior).astype(int)
    x = rng.normal(np.where(y == 1, sep, -sep), 1.0)
    cand = _cand([f"g{seed}:{q}" for q in np.repeat(np.arange(n_q), 8)], y.tolist())
    p = 1 / (1 + np.exp(-2 * sep * x))
    return cand, cand[["gid", "aid"]].assign(prob=p, rank_key=p)


def test_resampling_reproduces_a_hand_computed_case():
    cand, batch = _hand_case()
    gid, y = cand["gid"].to_numpy(), cand["label"].to_numpy()
    # rate 0.25: N = 3 incorrect stay, round(3 * 0.25 / 0.75) = 1 correct kept, 3 dropped; q3 holds no incorrect
    # answer, so c1 is protected and the pool {a1, a2, b1} goes whole: the batch is a3, b2, b3, c1 for any seed
    for seed in range(5):
        kept = R.draw_batch(gid, y, 0.25, np.random.default_rng(seed))
        assert cand["aid"][kept].tolist() == ["q1.2", "q2.4", "q2.5", "q3.6"]
    # 0.2 rounds to the same count (round(0.75) = 1): realised rate 0.25; 0.1 rounds to 0 kept: unreachable
    assert R.draw_batch(gid, y, 0.2, np.random.default_rng(0)).tolist() == kept.tolist()
    assert R.draw_batch(gid, y, 0.1, np.random.default_rng(0)) is None
    # rate 0.8: P = 4 correct stay, round(4 * 0.2 / 0.8) = 1 incorrect kept (every question has a correct answer)
    for seed in range(5):
        kept = R.draw_batch(gid, y, 0.8, np.random.default_rng(seed))
        assert kept[y == 1].all() and kept[y == 0].sum() == 1
    assert R.draw_batch(gid, y, 0.9, np.random.default_rng(0)) is None  # round(4 * 0.1 / 0.9) = 0 incorrect
    assert R.draw_batch(gid, y, 4 / 7, np.random.default_rng(0)).all()  # its own rate: the fold as it is
    # the fixed 0.5 threshold on a3 (0.6), b2 (0.2), b3 (0.3), c1 (0.7): keeps a3 (wrong) and c1 (right)
    got = R.Resampling(priors=(0.25, 0.1), draws=3).fold_scores(batch.iloc[:0], batch, cand, D.Keep("threshold", 0.5))
    assert got[0.1] is None
    at = got[0.25]
    assert at["rate"] == 0.25 and at["answers"] == 4 and all(v == 0 for v in at["sd"].values())
    assert at["scores"]["accuracy"] == pytest.approx(3 / 4)  # b2, b3, c1 right; a3 kept but incorrect
    assert at["scores"]["precision"] == pytest.approx(1 / 2)
    # MRR: q1 (a3 only) and q2 (b2, b3) have no correct answer left -> 0; q3: c1 first -> 1
    assert at["scores"]["mrr"] == pytest.approx(1 / 3)
    # the evaluation's own scoring of that batch (its truth cut to the kept answers) gives every figure
    kept = R.draw_batch(gid, y, 0.25, np.random.default_rng(0))
    official = E.evaluate_decided(D.apply_decision(batch[kept], D.Keep("threshold", 0.5)), cand[kept])
    assert at["scores"] == pytest.approx({m: official[m] for m in R.METRICS})


@pytest.mark.parametrize("seed", range(6))
def test_every_question_keeps_an_answer_and_only_the_thinned_class_is_dropped(seed):
    rng = np.random.default_rng(seed)
    # questions of 1-6 answers at varied rates: some all correct, some with no correct answer
    sizes = rng.integers(1, 7, 40)
    gid = np.repeat(np.arange(40), sizes)
    y = (rng.random(len(gid)) < np.repeat(rng.choice([0.0, 0.3, 0.7, 1.0], 40), sizes)).astype(int)
    pi0 = y.mean()
    for prior in SHIFT_PRIORS:
        kept = R.draw_batch(gid, y, prior, np.random.default_rng([seed, int(prior * 100)]))
        thin = 1 if prior < pi0 else 0
        alone = ~pd.Series(gid).isin(set(gid[y != thin])).to_numpy()  # rows of questions without the other class
        keep_n = round((y != thin).sum() * (prior / (1 - prior) if thin else (1 - prior) / prior))
        if kept is None:  # unreachable only where the protected answers leave too few to drop, or 0 would be kept
            assert keep_n < 1 or keep_n < len(set(gid[alone & (y == thin)]))
            continue
        assert set(gid[kept]) == set(gid)
        assert kept[y != thin].all() and kept[y == thin].sum() == keep_n
        # the realised rate is the prior up to rounding the kept count to a whole answer: the count moves by <= 1/2,
        # the rate by <= 1/2 / (rows - 1/2) per half answer, so by <= 1 / rows
        assert abs(y[kept].mean() - prior) <= 1 / kept.sum()


def test_a_fixed_rule_scores_the_same_reweighted_and_resampled():
    """Re-weighting is the expectation of resampling for a rule that does not read its batch: under pure prior shift
    accuracy = pi TPR + (1 - pi) TNR either way. Tolerance: 4 standard errors of the mean over the draws (the draws'
    own spread / sqrt(draws): a seeded miss beyond it has odds under 1e-4 per rate), plus the rate's rounding to a
    whole answer (|realised - pi| moves accuracy by at most that much), plus the protected answers' share (1 / rows)."""
    cand, batch = _synthetic(150, 0.45, 1)
    keep = D.Keep("threshold", 0.5)
    draws = 40
    got = R.Resampling(draws=draws, seed=3).fold_scores(batch.iloc[:0], batch, cand, keep)
    decided = D.apply_decision(batch, keep)
    weighted = PriorShift().fold_scores(decided, cand)
    for pi in SHIFT_PRIORS:
        for m in ("accuracy", "precision"):
            tol = 4 * got[pi]["sd"][m] / np.sqrt(draws) + abs(got[pi]["rate"] - pi) + 1 / len(batch)
            assert got[pi]["scores"][m] == pytest.approx(weighted[pi][m], abs=tol), (pi, m)
    # the comparison has teeth: the figures move with the rate by far more than the tolerance
    assert weighted[0.65]["precision"] - weighted[0.2]["precision"] > 0.2


def test_a_batch_adaptive_rule_adapts_only_under_resampling():
    """Saerens EM re-estimates the rate of the batch it decides: resampled to 20% or 65% correct, it moves its
    threshold and beats its own non-adaptive counterpart (Platt at 0.5, fitted on the same calibration rows) at both
    ends. Re-weighted, it decides the one batch it was given (one threshold, its accuracy affine in the rate), so it
    cannot gain at both ends: the protocol, not the rule, hid the gain."""
    cal_cand, cal = _synthetic(200, 0.45, 2)
    cand, batch = _synthetic(150, 0.45, 5)
    cal = cal.assign(label_true=cal_cand["label"].to_numpy())
    both = pd.concat([cal_cand, cand], ignore_index=True)
    rs = R.Resampling(priors=(0.2, 0.45, 0.65), draws=8, seed=0)
    resampled = {r: rs.fold_scores(cal, batch, both, r) for r in ("em", "platt")}
    weighted = {}
    for r in ("em", "platt"):
        keep = D.fit_keep(r, cal["label_true"], cal["prob"], cal["gid"], batch["prob"])
        weighted[r] = PriorShift(priors=rs.priors).fold_scores(D.apply_decision(batch, keep), both)

    def gain(figures: dict, pi: float) -> float:
        return figures["em"][pi] - figures["platt"][pi]

    resampled_acc = {r: {pi: v["scores"]["accuracy"] for pi, v in f.items()} for r, f in resampled.items()}
    weighted_acc = {r: {pi: v["accuracy"] for pi, v in f.items()} for r, f in weighted.items()}
    # measured: resampled +0.033 (20%) / +0.021 (65%); re-weighted -0.008 / +0.000
    assert gain(resampled_acc, 0.2) > 0.01 and gain(resampled_acc, 0.65) > 0.01
    assert all(gain(resampled_acc, pi) - gain(weighted_acc, pi) > 0.01 for pi in (0.2, 0.65))
    assert min(gain(weighted_acc, 0.2), gain(weighted_acc, 0.65)) < 0.005
    # re-weighted, any rule's accuracy is affine in the rate (one decision, two rates of it): it cannot adapt
    acc = [weighted["em"][pi]["accuracy"] for pi in rs.priors]
    assert acc[1] - acc[0] == pytest.approx((acc[2] - acc[1]) * (0.45 - 0.2) / (0.65 - 0.45), abs=1e-9)


def test_only_the_batch_adaptive_rules_read_the_batch():
    """fold_scores fits every other rule once per fold: guard the list against a rule that starts reading it."""
    cal_cand, cal = _synthetic(60, 0.45, 7)
    y, p, gid = cal_cand["label"].to_numpy(), cal["prob"].to_numpy(), cal["gid"].to_numpy()
    # batches label shift explains (the calibration's own rows at rates 0.2 and 0.7), so em_guarded does not fall back
    pos, neg = p[y == 1], p[y == 0]
    low, high = np.concatenate([neg, pos[: len(neg) // 4]]), np.concatenate([pos, neg[: len(pos) * 3 // 7]])
    for rule in D.KEEP_RULES:
        same = D.fit_keep(rule, y, p, gid, low) == D.fit_keep(rule, y, p, gid, high)
        assert same is (rule not in R.BATCH_ADAPTIVE), rule


def test_the_summary_reads_the_rates_every_fold_reached_and_the_worst_fold():
    rs = R.Resampling(priors=(0.2, 0.5, 0.65), draws=2)

    def fold(acc: dict) -> dict:
        return {
            pi: None if a is None else {"scores": {m: a for m in R.METRICS}, "rate": pi, "answers": 10}
            for pi, a in acc.items()
        }

    s = rs.summary({"a": fold({0.2: 0.7, 0.5: 0.8, 0.65: 0.9}), "b": fold({0.2: 0.6, 0.5: 0.9, 0.65: None})})
    assert s["unreachable"] == {"0.65": ["b"]} and set(s["rate"]) == {"0.2", "0.5"}
    acc = s["accuracy"]
    assert acc["by_prior"] == {"0.2": 0.65, "0.5": 0.85} and acc["worst_prior"] == 0.2 and acc["mean"] == 0.75
    assert acc["band"] == {"worst": 0.6, "worst_fold": "b", "worst_prior": 0.2, "mean": 0.75}
    assert acc["by_fold"]["a"] == {"mean": 0.75, "worst": 0.7, "worst_prior": 0.2}
    assert rs.summary({"b": fold({0.2: None, 0.5: None, 0.65: None})})["accuracy"] is None


def test_cv_and_loso_rows_are_resampled_with_the_rule_fitted_on_the_other_folds():
    frames = [_synthetic(30, pr, s) for s, pr in enumerate((0.3, 0.45, 0.6))]
    cand = pd.concat([c for c, _ in frames], ignore_index=True)
    rows = pd.concat([b.assign(fold=f) for f, (_, b) in enumerate(frames)], ignore_index=True)
    pred = pd.concat([rows.assign(part="oof"), rows.assign(part="loso")], ignore_index=True)
    _, decided = D.decide_system(pred, cand, train=[], rule="em")
    rs = R.Resampling(priors=(0.25, 0.5), draws=2, seed=1)
    loso = R.held_out_resampled(decided, cand, "loso", "em", "rank", rs, sources=["x", "y", "z"])
    assert set(loso["accuracy"]["by_fold"]) == {"x", "y", "z"} and loso["accuracy"]["band"]["worst_fold"] in "xyz"
    # fold f's batch is decided by the rule fitted on the other folds, as decide_system decides the fold itself
    lo = decided[decided["part"] == "loso"]
    one = rs.fold_scores(lo[lo["fold"] != 1], lo[lo["fold"] == 1], cand, "em", key=1)
    assert loso["accuracy"]["by_fold"]["y"]["mean"] == pytest.approx(
        np.mean([one[pi]["scores"]["accuracy"] for pi in rs.priors]), abs=1e-4
    )
