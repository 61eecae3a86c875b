"""Evaluation: gold, ranked rows, official scores of decided rows, CV summaries, the score stage's comparisons
(final system vs baseline by paired question bootstrap, CV by question set and by answer order) and the paper's
error analysis (Figures 7-9). Models and stages evaluate through these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from medrank.core.errors import MedrankError
from medrank.selection.metrics import (
    SHIFT_PRIORS,
    gold_from_answers,
    paired_bootstrap,
    score_task3,
    task3_by_question,
    task3_scores_of,
)

METRICS = ("accuracy", "precision", "mrr", "spearman", "spearman_true")
SENTENCE_BINS = ((0, 5), (6, 10), (11, 20), (21, 40), (41, 80), (81, None))


# ---------------------------------------------------------------- gold and official scores


def gold_of(table: pd.DataFrame) -> pd.DataFrame:
    """Official-style gold (qid = split-unique question key) of labelled rows."""
    return gold_from_answers(table.assign(qid=table["gid"]))


def ranked_rows(pred: pd.DataFrame, key: str = "gid") -> pd.DataFrame:
    """Rows as a submission file lists them: question order kept, then descending score (stable)."""
    q_order = pd.Series(range(pred[key].nunique()), index=pd.unique(pred[key]))
    out = pred.assign(_q=pred[key].map(q_order).to_numpy(), _s=-pred["score"].to_numpy(), _i=np.arange(len(pred)))
    return out.sort_values(["_q", "_s", "_i"]).drop(columns=["_q", "_s", "_i"]).reset_index(drop=True)


def evaluate(pred: pd.DataFrame, table: pd.DataFrame) -> dict:
    """Official Task 3 metrics of predictions (gid, aid, label, score) on labelled rows."""
    sub = ranked_rows(pred)[["gid", "aid", "label"]].rename(columns={"gid": "qid"})
    return score_task3(gold_of(table), sub)


def fold_by_question(rows: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """task3_by_question rows of decided rows (gid, aid, label, score) against the candidate table's truth: summed
    (task3_scores_of), the official scores of `evaluate_decided`."""
    truth = cand[cand["gid"].isin(set(rows["gid"]))]
    return task3_by_question(gold_of(truth), ranked_rows(rows)[["gid", "aid", "label"]].rename(columns={"gid": "qid"}))


def evaluate_decided(rows: pd.DataFrame, cand: pd.DataFrame) -> dict:
    """Official Task 3 metrics of decided rows (gid, aid, label, score) against the candidate table's truth."""
    truth = cand[cand["gid"].isin(set(rows["gid"]))]
    return evaluate(rows[["gid", "aid", "label", "score"]], truth)


def evaluate_rows(pred: pd.DataFrame) -> dict:
    """Official Task 3 metrics of decided rows that carry their truth (label_true, reference_rank/score, split, qid)."""
    truth = pred[["gid", "aid", "qid", "split", "reference_rank", "reference_score"]].assign(label=pred["label_true"])
    return evaluate(pred[["gid", "aid", "label", "score"]], truth)


# ---------------------------------------------------------------- summaries


def summarize(per_fold: list[dict]) -> dict:
    """Mean and sd (ddof=1) of each metric over folds."""
    out: dict = {}
    for m in METRICS:
        v = np.array([f[m] for f in per_fold], dtype=float)
        out[m] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0}
    return out


def cv_summary_of(decided: pd.DataFrame, cand: pd.DataFrame) -> dict:
    """CV mean ± sd of already-decided oof rows (one official score per fold)."""
    oof = decided[decided["part"] == "oof"]
    return summarize([evaluate_decided(oof[oof["fold"] == f], cand) for f in sorted(oof["fold"].unique())])


def rounded_scores(m: dict) -> dict:
    """The official metrics (+ true Spearman) of one scoring, rounded for a diff-friendly metrics file."""
    return {k: round(float(m[k]), 4) for k in METRICS}


def rounded_summary(m: dict) -> dict:
    """`summarize` output rounded the same way."""
    return {k: {"mean": round(float(m[k]["mean"]), 4), "sd": round(float(m[k]["sd"]), 4)} for k in METRICS}


def rounded(obj, digits: int = 4):
    """Floats rounded (recursively) for a readable, diff-friendly metrics file."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


# ---------------------------------------------------------------- the score stage's comparisons


def oof_by_question(rows: pd.DataFrame, cv_cand: pd.DataFrame, split_of: pd.Series) -> pd.DataFrame:
    """task3_by_question rows of a system's out-of-fold rows on the candidate table's answers, with each split."""
    rows = rows[rows["part"] == "oof"].merge(cv_cand[["gid", "aid"]], on=["gid", "aid"])
    out = task3_by_question(gold_of(cv_cand), ranked_rows(rows)[["gid", "aid", "label"]].rename(columns={"gid": "qid"}))
    return out.assign(split=out["qid"].map(split_of))


def cv_comparisons(
    final: pd.DataFrame, baseline: pd.DataFrame, cand: pd.DataFrame, orders: dict[str, tuple[str, bool]]
) -> tuple[dict[str, pd.DataFrame], dict, dict]:
    """The CV questions' out-of-fold rows per question (each system with its own fold thresholds) ->
    (per-question rows of final and baseline, scores by question set, the final system's scores by order of its
    kept answers: as submitted, and re-ordered by each `orders` entry {name: (column, higher value first?)})."""
    from medrank.selection.decision import submission_score

    split_of = cand.drop_duplicates("gid").set_index("gid")["split"]
    # the answers of the candidate table: a capped profile's MTL sees fewer answers than the baseline
    cv_cand = cand[cand["gid"].isin(set(final.loc[final["part"] == "oof", "gid"]))]
    per_q = {
        "final": oof_by_question(final, cv_cand, split_of),
        "baseline": oof_by_question(baseline, cv_cand, split_of),
    }
    by_split = {
        name: {s: rounded_scores(task3_scores_of(g)) for s, g in rows.groupby("split", sort=True)}
        for name, rows in per_q.items()
    }
    # the order of the kept answers trades MRR (the most probably correct first) against Spearman (the reference
    # order): the final system's CV rows re-ordered, labels unchanged
    from_cand = [c for c, _ in orders.values() if c not in final.columns]
    final_oof = final[final["part"] == "oof"].merge(cv_cand[["gid", "aid", *from_cand]], on=["gid", "aid"])
    gid, kept = final_oof["gid"].to_numpy(), final_oof["label"].to_numpy()
    by_order = {"rank model (submitted)": rounded_scores(task3_scores_of(per_q["final"]))}
    for name, (col, higher_first) in orders.items():
        key = final_oof[col].to_numpy() if higher_first else -final_oof[col].to_numpy()
        reordered = final_oof.assign(score=submission_score(kept, key, gid))
        by_order[name] = rounded_scores(task3_scores_of(oof_by_question(reordered, cv_cand, split_of)))
    return per_q, by_split, by_order


def vs_baseline(val: dict[str, pd.DataFrame], cv: dict[str, pd.DataFrame], resamples: int, seed: int) -> dict | None:
    """Final system minus the baseline by paired question bootstrap, on validation and on the CV questions."""
    if not resamples:
        return None
    return {
        "resamples": resamples,
        "val": paired_bootstrap(val["final"], val["baseline"], resamples, seed),
        "cv": paired_bootstrap(cv["final"], cv["baseline"], resamples, seed),
    }


def question_chars_median(answers: pd.DataFrame) -> dict[str, int]:
    """Median question length per split (unlabelled text: how each split's questions are written)."""
    q = answers.drop_duplicates(["split", "qid"]).groupby("split")["question"]
    return q.apply(lambda s: int(s.fillna("").str.len().median())).to_dict()


# ---------------------------------------------------------------- error analysis (paper Figures 7-9)


def per_question_scores(decided: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """Official accuracy and Spearman (official + true; 0 with fewer than 2 kept correct answers, the paper's
    convention) of each question, with its number of valid answers."""
    gids = pd.unique(decided["gid"])
    truth = cand[cand["gid"].isin(set(gids))]
    sub = ranked_rows(decided)[["gid", "aid", "label"]].rename(columns={"gid": "qid"})
    q = task3_by_question(gold_of(truth), sub).set_index("qid").loc[gids]  # one question's score_task3, per question
    defined = q["rho"].notna()
    return pd.DataFrame(
        {
            "gid": gids,
            "n_valid": truth.groupby("gid")["label"].sum().loc[gids].astype(int).to_numpy(),
            "accuracy": (q["matches"] / q["gold_rows"]).to_numpy(),
            "spearman": q["rho"].where(defined, 0.0).to_numpy(),
            "spearman_true": q["rho_true"].where(defined, 0.0).to_numpy(),
        }
    )


def error_analysis(decided: pd.DataFrame, cand: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The paper's error analysis (Figures 7-9) of decided rows on labelled questions:
    filter recall of valid answers by CHiQA rank, accuracy by number of sentences, accuracy and Spearman by
    number of valid answers per question. Each table has an `n` column (answers or questions per bin)."""
    d = decided.merge(
        cand[["gid", "aid", "label", "chiqa_rank", "n_sentences"]].rename(columns={"label": "label_true"}),
        on=["gid", "aid"],
        how="left",
        suffixes=("_x", ""),
    )
    d = d.drop(columns=[c for c in d.columns if c.endswith("_x")])
    valid = d[d["label_true"] == 1]
    fig7 = valid.groupby("chiqa_rank").agg(recall=("label", "mean"), n=("label", "size")).reset_index()
    fig7["chiqa_rank"] = fig7["chiqa_rank"].astype(int)
    labels = [f"{lo}-{hi}" if hi is not None else f">{lo - 1}" for lo, hi in SENTENCE_BINS]
    edges = [lo - 0.5 for lo, _ in SENTENCE_BINS] + [np.inf]
    d["sentences"] = pd.cut(d["n_sentences"], edges, labels=labels, right=False)
    d["correct"] = (d["label"] == d["label_true"]).astype(float)
    fig8 = d.groupby("sentences", observed=False).agg(accuracy=("correct", "mean"), n=("correct", "size")).reset_index()
    fig8 = fig8[fig8["n"] > 0]
    fig8["sentences"] = [f"{s} ({n})" for s, n in zip(fig8["sentences"], fig8["n"])]
    pq_ = per_question_scores(decided, cand)
    fig9 = (
        pq_.groupby("n_valid")
        .agg(
            accuracy=("accuracy", "mean"),
            spearman=("spearman", "mean"),
            spearman_true=("spearman_true", "mean"),
            n=("accuracy", "size"),
        )
        .reset_index()
    )
    return {"recall_by_chiqa_rank": fig7, "accuracy_by_sentences": fig8, "by_valid_answers": fig9}


def rounded_csv(df: pd.DataFrame) -> str:
    """A plot table as CSV with floats rounded to 4 digits."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            out[c] = out[c].round(4)
    return out.to_csv(index=False)


def split_questions(cand: pd.DataFrame, splits: Sequence[str]) -> list[str]:
    """Question keys (gid) of the given splits, in table order."""
    split_of = cand.drop_duplicates("gid").set_index("gid")["split"]
    return [g for g, s in split_of.items() if s in splits]


# ---------------------------------------------------------------- protocols: CV and leave-one-source-out


def loso_summary(per_source: dict[str, dict]) -> dict:
    """Leave-one-source-out scores: each held-out source's, their mean and the worst source's, per metric."""
    out: dict = {"by_source": {s: rounded_scores(m) for s, m in per_source.items()}}
    for m in METRICS:
        v = {s: float(r[m]) for s, r in per_source.items()}
        worst = min(v, key=v.get)
        out[m] = {
            "mean": round(float(np.mean(list(v.values()))), 4),
            "worst": round(v[worst], 4),
            "worst_source": worst,
        }
    return out


def held_out_figures(decided: pd.DataFrame, cand: pd.DataFrame, part: str, shift, sources=None) -> tuple[dict, dict]:
    """One part's decided held-out rows, each fold scored from one per-question table: (the protocol's summary - oof:
    CV mean ± sd (`summarize`); loso: `loso_summary`, fold f = sources[f] -, the PriorShift summary)."""
    rows = decided[decided["part"] == part]
    official, shifted = {}, {}
    for f in sorted(rows["fold"].unique()):
        fold = rows[rows["fold"] == f]
        per_q = fold_by_question(fold, cand)
        official[f], shifted[f] = task3_scores_of(per_q), shift.fold_scores(fold, cand, per_q)
    if sources is None:
        summary = summarize(list(official.values()))
    else:
        summary = loso_summary({sources[f]: m for f, m in official.items()})
    return summary, shift.summary(shifted)


def noise_band(spreads: Sequence[dict], keys: Sequence[str]) -> dict[str, float]:
    """The written rule's tolerance per key (a metric or "order"): the largest seed spread of the systems' defaults."""
    return {k: max(float(s[k]) for s in spreads) for k in dict.fromkeys(keys)}


def selection_score(cv: dict, loso: dict, metric: str, under: str = "mean") -> float:
    """The written selection rule's number: the mean of the CV and LOSO figures of `metric`: their means over folds
    (`under` "mean"), or, given PriorShift summaries, each one's worst over the positive rates ("shift_worst")."""
    key = "worst" if under == "shift_worst" else "mean"
    return 0.5 * (float(cv[metric][key]) + float(loso[metric][key]))


def order_score(cv: dict, loso: dict) -> float:
    """The order rule's number: the selection score of (MRR + official Spearman) / 2."""
    return 0.5 * (selection_score(cv, loso, "mrr") + selection_score(cv, loso, "spearman"))


def seed_spread(runs: Sequence[tuple[dict, dict]]) -> dict:
    """sd over seeds of each metric's selection score ((CV summary, LOSO summary) per seed), and of the order score."""
    out = {
        m: round(float(np.std([selection_score(c, l, m) for c, l in runs], ddof=1)), 4) if len(runs) > 1 else 0.0
        for m in METRICS
    }
    out["order"] = round(float(np.std([order_score(c, l) for c, l in runs], ddof=1)), 4) if len(runs) > 1 else 0.0
    out["seeds"] = len(runs)
    return out


def confirm_table(scores: dict[str, list[float]], seeds: list[int], default: str = "default") -> dict:
    """Rows re-run under several seeds, paired by seed: per row its scores, mean, and the paired difference to the
    default (mean, sd); the band is the sd of the default's score over the seeds (its seed spread). A row is a win
    only if its mean paired difference exceeds the band (the written rule: a lever counts only beyond the noise)."""
    base = np.asarray(scores[default])
    band = float(np.std(base, ddof=1))
    rows = {}
    for name, got in scores.items():
        diff = np.asarray(got) - base
        rows[name] = {
            "scores": got,
            "mean": float(np.mean(got)),
            "diff_mean": float(diff.mean()),
            "diff_sd": float(np.std(diff, ddof=1)),
            "win": bool(name != default and diff.mean() > band),
        }
    return {"seeds": seeds, "band": band, "rows": rows}


def pick(scores: dict, band: float) -> object:
    """The written rule's choice among candidates listed simplest first: the simplest whose score is within `band`
    of the best (a more complex candidate must beat a simpler one by more than the seed spread)."""
    best = max(scores.values())
    return next(k for k, v in scores.items() if v >= best - band - 1e-12)


# ---------------------------------------------------------------- choosing the final system


PART_ORDER = ("oof", "val", "loso", "test")  # the MTL's prediction parts, in the order its stage writes them


def in_mtl_order(pred: pd.DataFrame) -> pd.DataFrame:
    """A system's prediction rows in the order the MTL stage writes its own: parts as PART_ORDER, then by fold, split,
    qid and aid (strings); the rows combine_systems is given first set the decided rows' order (ties in a
    submission keep it)."""
    part = pred["part"].map({p: i for i, p in enumerate(PART_ORDER)})
    key = pred.assign(_part=part).sort_values(["_part", "fold", "split", "qid", "aid"], kind="stable")
    return key.drop(columns="_part").reset_index(drop=True)


def system_name(weight: float) -> str:
    return "baseline" if weight == 0 else "mtl" if weight == 1 else "ensemble"


def candidate_systems(
    mtl_pred: pd.DataFrame | None,
    base_pred: pd.DataFrame,
    cand: pd.DataFrame,
    train: Sequence[str],
    weights: Sequence[float],
    rules: Sequence[str],
    orders: Sequence[str],
    sources: Sequence[str],
    band: dict,
    select_on: Sequence[str] = ("accuracy",),
    select_under: str = "mean",
) -> dict:
    """Every (MTL weight, keep rule) candidate decided under CV and LOSO (MTL weight 0 = the baseline alone, 1 = the
    MTL alone; both systems' rows come from the same folds), the chosen one by the written rule (the acceptance rule,
    medrank.selection.acceptance, over the LOSO figures: the simplest candidate - keep rules as listed, single systems
    before ensembles - unless another gains beyond the band on the worst source and at the worst rate on the mean of
    `select_on` and loses on no source; "score", the selection score, is reported beside it), then its order rule
    (`pick` on the order score, `orders` simplest first). `select_under` "shift_worst": the weight x keep rule score reads each protocol's held-out
    folds re-weighted over the plausible positive rates (PriorShift), at the worst rate; "mean": as they are.

    -> {"table": {weight: {rule: {"cv", "loso", "cv_shift", "loso_shift", "score"}}}, "acceptance" (incumbent, pick,
    verdicts), "orders": {order: {"cv", "loso",
    "score"}}, "weight", "rule", "order", "fits" (Keep per target set), "decided" (the chosen candidate's rows), "cv",
    "loso", "cv_shift", "loso_shift"}. `mtl_pred` None: the baseline's rows alone (weights [0.0] only: the default DAG's
    score, which reads no MTL), in the MTL's row order (the same decided rows, bit for bit, as weight 0 beside an MTL).
    """
    from medrank.selection.decision import combine_systems, decide_system

    shift = PriorShift()

    theirs = base_pred[["part", "gid", "aid", "prob", "rank_score"]].rename(columns={"rank_score": "rank_key"})
    if mtl_pred is None:
        if any(w != 0 for w in weights):
            raise MedrankError(f"MTL weights {list(weights)} need the MTL's predictions (weight 0 alone reads none)")
        mine = in_mtl_order(base_pred)[["part", "gid", "aid", "fold", "prob", "rank_score"]]
        mine = mine.rename(columns={"rank_score": "rank_key"})
    else:
        mine = mtl_pred[["part", "gid", "aid", "fold", "prob_mean", "rank_key"]].rename(columns={"prob_mean": "prob"})
    from tqdm.auto import tqdm

    combined = {w: combine_systems(mine, theirs, w) for w in weights}
    table: dict = {w: {} for w in weights}
    for w, rule in tqdm([(w, r) for w in weights for r in rules], desc="score: weight x keep rule", unit="candidate"):
        _, decided = decide_system(combined[w], cand, train, rule)
        (cv, cv_s), (loso, loso_s) = (
            held_out_figures(decided, cand, "oof", shift),
            held_out_figures(decided, cand, "loso", shift, sources),
        )
        on = (cv_s, loso_s) if select_under == "shift_worst" else (cv, loso)
        table[w][rule] = {
            "cv": cv,
            "loso": loso,
            "cv_shift": cv_s,
            "loso_shift": loso_s,
            "score": float(np.mean([selection_score(*on, m, select_under) for m in select_on])),
        }
    simplest_first = sorted(
        ((w, r) for w in weights for r in rules), key=lambda c: (list(rules).index(c[1]), 0 < c[0] < 1, c[0])
    )
    # the acceptance rule (medrank.selection.acceptance): the simplest candidate stays unless another gains beyond the
    # band on the worst LOSO source and at the worst rate (re-weighted: score.keep_rules' fixed rules see the same
    # batch at every rate) and loses on no source; among those adopted, the largest margin
    from medrank.selection import acceptance as A

    figures = {
        c: A.Figures.of({"by_source": table[c[0]][c[1]]["loso"]["by_source"], "shift": table[c[0]][c[1]]["loso_shift"]})
        for c in simplest_first
    }
    accepted = A.challenge(simplest_first[0], figures, band, select_on, [m for m in A.GUARD if m in band])
    weight, rule = accepted["pick"]
    by_order = {}
    for order in orders:
        fits, decided = decide_system(combined[weight], cand, train, rule, order)
        (cv, cv_s), (loso, loso_s) = (
            held_out_figures(decided, cand, "oof", shift),
            held_out_figures(decided, cand, "loso", shift, sources),
        )
        by_order[order] = {
            "cv": cv,
            "loso": loso,
            "shift": (cv_s, loso_s),
            "score": order_score(cv, loso),
            "fits": fits,
            "decided": decided,
        }
    order = pick({o: by_order[o]["score"] for o in orders}, band["order"])
    chosen = by_order[order]
    decided = chosen["decided"].merge(cand[["gid", "split", "qid"]].drop_duplicates(), on="gid", how="left")
    return {
        "table": table,
        "acceptance": {
            "incumbent": list(accepted["incumbent"]),
            "pick": [weight, rule],
            "verdicts": {f"{w:g} {r}": v for (w, r), v in accepted["verdicts"].items()},
        },
        "orders": {
            o: {k: v for k, v in r.items() if k not in ("decided", "fits", "shift")} for o, r in by_order.items()
        },
        "weight": weight,
        "rule": rule,
        "order": order,
        "fits": chosen["fits"],
        "decided": decided,
        "cv": chosen["cv"],
        "loso": chosen["loso"],
        # the chosen candidate in its chosen order (MRR and Spearman depend on it)
        "cv_shift": chosen["shift"][0],
        "loso_shift": chosen["shift"][1],
    }


@dataclass(frozen=True)
class PriorShift:
    """A prior-shift re-scoring of held-out folds (it cuts no folds: it re-weights another protocol's held-out rows).
    Each held-out fold's rows are re-weighted to a positive rate pi of `priors` (a correct answer weighs pi / pi0, an
    incorrect one (1 - pi) / (1 - pi0), pi0 the fold's own rate): accuracy = pi TPR + (1 - pi) TNR, precision =
    pi TPR / (pi TPR + (1 - pi) FPR); MRR and Spearman are question means weighted by each question's mean row weight
    (a set with more correct answers has more questions rich in them). At pi = pi0 every weight is 1: the official
    scores. `summary` gives per metric the mean over the range, the worst prior and its value, and the band."""

    priors: tuple[float, ...] = SHIFT_PRIORS

    def fold_scores(
        self, rows: pd.DataFrame, cand: pd.DataFrame, per_q: pd.DataFrame | None = None
    ) -> dict[float, dict]:
        """{prior: {metric: value}} of one held-out fold's decided rows (gid, aid, label, score); `per_q`: their
        metrics.task3_by_question rows, when the caller has them (evaluation.held_out_figures)."""
        truth = cand[cand["gid"].isin(set(rows["gid"]))][["gid", "aid", "label"]].rename(columns={"label": "y"})
        d = rows[["gid", "aid", "label"]].merge(truth, on=["gid", "aid"], validate="one_to_one")
        if len(d) != len(rows):
            raise MedrankError(f"prior shift: {len(rows) - len(d)} decided rows are not in the candidate table")
        y, kept = d["y"].to_numpy(dtype=int), d["label"].to_numpy(dtype=int)
        pi0 = float(y.mean()) if len(y) else 0.0
        per_q = (fold_by_question(rows, cand) if per_q is None else per_q).set_index("qid")
        q_of = d["gid"].to_numpy()
        out = {}
        for pi in self.priors:
            if 0.0 < pi0 < 1.0:
                w = np.where(y == 1, pi / pi0, (1.0 - pi) / (1.0 - pi0))
            else:  # one class only: nothing to re-weight
                w = np.ones(len(y))
            tp = float(w[(kept == 1) & (y == 1)].sum())
            kept_w = float(w[kept == 1].sum())
            wq = pd.Series(w).groupby(q_of, sort=False).mean().reindex(per_q.index).to_numpy()
            scores = {
                "accuracy": float(w[kept == y].sum() / w.sum()) if len(w) else 0.0,
                "precision": tp / kept_w if kept_w > 0 else 0.0,
                "mrr": float(np.sum(wq * per_q["rr"].to_numpy()) / np.sum(wq)),
            }
            for m, col in (("spearman", "rho"), ("spearman_true", "rho_true")):
                rho = per_q[col].to_numpy(dtype=float)
                ok = ~np.isnan(rho)
                scores[m] = float(np.sum(wq[ok] * rho[ok]) / np.sum(wq[ok])) if ok.any() else 0.0
            out[pi] = {m: scores[m] for m in METRICS}
        return out

    def summary(self, per_fold: Mapping[object, dict[float, dict]]) -> dict:
        """Per metric over the priors, the held-out folds averaged at each prior: {"mean", "worst", "worst_prior",
        "best", "by_prior": {prior: value}} (rounded); the band is [worst, best]."""
        out = {}
        for m in METRICS:
            by_prior = {pi: float(np.mean([f[pi][m] for f in per_fold.values()])) for pi in self.priors}
            worst = min(by_prior, key=by_prior.get)
            out[m] = {
                "mean": round(float(np.mean(list(by_prior.values()))), 4),
                "worst": round(by_prior[worst], 4),
                "worst_prior": worst,
                "best": round(max(by_prior.values()), 4),
                "by_prior": {f"{pi:g}": round(v, 4) for pi, v in by_prior.items()},
            }
        return out
