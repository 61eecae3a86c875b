"""The final Task 3 system's steps (stage score: the baseline's rows alone; analysis stage system_choice: every MTL
weight): its inputs, the written rule's pick of MTL weight × keep rule, then order, the submissions in question order,
every system's val / CV / LOSO row beside it, and the error analysis."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from medrank.selection import evaluation as E
from medrank.core import layout as L
from medrank.selection.experiment import held_out_scores

SELECTION_RULE = (
    "MTL weight and keep rule: the acceptance rule (medrank.selection.acceptance) over the LOSO figures: the simplest "
    "candidate (keep rules in the listed order, a single system before an ensemble, the baseline first) stays unless another "
    "gains beyond the noise band (the larger seed spread of the two systems' defaults; the mean of score.select_on in band "
    "units above 1) on the worst held-out source and at the worst positive rate (the held-out rows re-weighted to 0.2-0.65), "
    "and loses beyond its band on no source for any official metric (validation: not at all); among those adopted, the "
    "largest margin. Order of the kept answers: the highest mean of MRR and official Spearman (CV and LOSO), the simplest "
    "within the band."
)


def _metrics(name: str) -> dict:
    return json.loads(L.metrics_file(name).read_text(encoding="utf-8"))


@dataclass
class Inputs:
    answers: pd.DataFrame  # every normalized answer (validation: the full official gold)
    pred: pd.DataFrame | None  # the MTL's predictions (oof / loso / val / test); None: weight 0 alone reads none
    base: pd.DataFrame  # the baseline's
    # the answers the MTL saw (capped profiles see fewer; the baseline's, where no MTL is read): the CV rows
    cand: pd.DataFrame
    gold_val: pd.DataFrame


def read_inputs(with_mtl: bool) -> Inputs:
    """The inputs of the pick; `with_mtl` False (MTL weight 0 alone, stage score): the MTL's predictions are not read."""
    from medrank.task3.features import answer_table, question_key
    from medrank.core.io import read_parquet
    from medrank.selection.metrics import gold_from_answers

    answers = read_parquet(L.ANSWERS)
    base = read_parquet(L.BASELINE_PREDICTIONS)
    pred = read_parquet(L.MTL_PREDICTIONS) if with_mtl else None
    seen = (base if pred is None else pred)[["split", "qid", "aid"]].drop_duplicates()
    cand = answer_table(answers.merge(seen, on=["split", "qid", "aid"]))
    return Inputs(
        answers,
        None if pred is None else pred.assign(gid=question_key(pred)),
        base.assign(gid=question_key(base)),
        cand,
        gold_from_answers(answers, L.VAL_SPLIT),
    )


# stage score's MTL weights: score.system, the baseline (0 = the baseline alone); system_choice's: score.mtl_weights
SCORE_WEIGHTS = (0.0,)


def decide(sp, seed: int, weights) -> tuple[Inputs, dict, dict]:
    """(inputs, the written rule's pick over MTL weight `weights` x score.keep_rules then order, its metrics): stage
    score with SCORE_WEIGHTS (no MTL read), analysis stage system_choice with every weight of score.mtl_weights."""
    weights = [float(w) for w in weights]
    inp = read_inputs(with_mtl=any(w > 0 for w in weights))
    band = noise_band(("accuracy", *sp.select_on, "precision", "mrr", "spearman", "order"))  # the guard's metrics too
    sel = select(inp, sp, weights, band)
    return inp, sel, task3_val_metrics(inp, sel, sp, seed, weights, band)


def noise_band(keys) -> dict[str, float]:
    """The written rule's tolerance per key: the larger seed spread of the two systems' defaults (stage noise_band)."""
    spreads = _metrics("noise_band")
    return E.noise_band([spreads["baseline"], spreads["mtl"]], keys)


def select(inp: Inputs, sp, weights: list[float], band: dict) -> dict:
    """evaluation.candidate_systems over the training sources' questions: the pick, its decided rows, every table."""
    return E.candidate_systems(
        inp.pred,
        inp.base,
        inp.cand,
        E.split_questions(inp.cand, L.TRAIN_SPLITS),
        weights,
        sp.keep_rules,
        sp.orders,
        L.LABELLED_SPLITS,
        band,
        sp.select_on,
        sp.select_under,
    )


def system_record(sel: dict) -> dict:
    """models/system.json of `select`'s pick: the MTL weight (and the system it makes), the Keep fitted per target set
    (val, test), the keep rule and the order. A batch-adaptive pick (decision.BATCH_ADAPTIVE) fitted its keep on the
    val / test batch; what serves a request is then decision.REQUEST_RULE fitted on the same calibration rows
    ("request": per target set), which `medrank rank` and `medrank serve` apply (steps.system_step)."""
    from medrank.selection.decision import BATCH_ADAPTIVE, REQUEST_RULE, fit_keep_on

    out = {
        "system": E.system_name(sel["weight"]),
        "mtl_weight": sel["weight"],
        "keep": {k: v for k, v in sel["fits"].items() if k in ("val", "test")},
        "keep_rule": sel["rule"],
        "order": sel["order"],
    }
    if sel["rule"] in BATCH_ADAPTIVE:
        oof = sel["decided"][sel["decided"]["part"] == "oof"]
        cal = {"val": oof[oof["split"].isin(L.TRAIN_SPLITS)], "test": oof}  # as decide_system fits val and test
        out["request"] = {k: fit_keep_on(REQUEST_RULE, rows, rows).to_json() for k, rows in cal.items()}
        out["request_rule"] = REQUEST_RULE
        # the calibration rows themselves: `medrank rank` over a batch of questions re-fits the rule on that batch
        out["calibration"] = {k: calibration_record(rows) for k, rows in cal.items()}
    return out


def calibration_record(rows: pd.DataFrame) -> dict[str, list]:
    """The calibration rows a keep rule is fitted on (decision.fit_keep_on: gid, label_true, prob) as JSON lists."""
    return {
        "gid": rows["gid"].astype(str).tolist(),
        "label_true": rows["label_true"].astype(int).tolist(),
        "prob": rows["prob"].astype(float).tolist(),
    }


def system_rows(metrics: dict) -> dict[str, dict]:
    """metrics/task3_val_mtl.json and task3_val_ensemble.json: the MTL's and the final system's validation scores, with
    their CV and LOSO rows (from `task3_val_metrics`)."""
    out = {}
    for name, system in (("task3_val_mtl", "mtl"), ("task3_val_ensemble", "final")):
        if system in metrics["systems"]:
            row = metrics["systems"][system]
            out[name] = {**row["val"], "cv": row["cv"], "loso": row["loso"]}
    return out


def write_submissions(chosen: pd.DataFrame, cand: pd.DataFrame) -> None:
    """submissions/task3_{val,test}.csv of the chosen rows, questions in table order."""
    from medrank.core.errors import MedrankError
    from medrank.selection.submission import write_task3_submission

    for part in ("val", "test"):
        rows = in_question_order(chosen, cand, part)
        if part == "test" and rows.empty:
            raise MedrankError("no test predictions (did the baseline stage see the test split?)")
        write_task3_submission(L.task3_submission(part), rows)


def in_question_order(chosen: pd.DataFrame, cand: pd.DataFrame, part: str) -> pd.DataFrame:
    """The chosen rows of one part (qid, aid, label, score), questions in the candidate table's order."""
    q_order = {g: i for i, g in enumerate(pd.unique(cand["gid"]))}
    rows = chosen[chosen["part"] == part]
    rows = rows.assign(_q=rows["gid"].map(q_order)).sort_values("_q", kind="stable")
    return rows[["qid", "aid", "label", "score"]]


def submission_rows(chosen: pd.DataFrame, cand: pd.DataFrame, part: str) -> pd.DataFrame:
    """The rows write_submissions writes for one part (qid, aid, label), in their order."""
    from medrank.selection.submission import task3_submission_rows

    return task3_submission_rows(in_question_order(chosen, cand, part))


def _row(c: dict) -> dict:
    out = {"cv": E.rounded_summary(c["cv"]), "loso": c["loso"], "score": round(c["score"], 4)}
    if "cv_shift" in c:  # each figure at its worst positive rate (the band's ends; the rates' table: the final row)
        out["shift"] = {p: _band(c[f"{p}_shift"]) for p in ("cv", "loso")}
    return out


def _band(shift: dict) -> dict:
    return {m: {k: v for k, v in s.items() if k != "by_prior"} for m, s in shift.items()}


def task3_val_metrics(inp: Inputs, sel: dict, sp, seed: int, weights: list[float], band: dict) -> dict:
    """metrics/task3_val.json (timing aside; analysis stage system_choice: metrics/system_choice.json): the pick's
    official validation scores, the selection, every system's val / CV / LOSO row (CHiQA on the same folds; the MTL's
    where it was read), the candidate and order tables, `vs_baseline`."""
    from medrank.selection.metrics import score_task3, task3_by_question, task3_scores_of

    chosen, cand, gold_val = sel["decided"], inp.cand, inp.gold_val
    # the validation rows as submitted, scored officially per question (summed: the official scores; resampled: the
    # bootstrap); the baseline's from its written file
    val_q = {
        "final": task3_by_question(gold_val, submission_rows(chosen, cand, "val")),
        "baseline": task3_by_question(gold_val, L.task3_submission("val", "baseline")),
    }
    final_val = task3_scores_of(val_q["final"])
    cv_q, cv_by_split, cv_by_order = E.cv_comparisons(
        chosen, inp.base, cand, {"filter probability": ("prob", True), "CHiQA rank": ("chiqa_rank", False)}
    )
    # CHiQA keeps every answer in its own order: scored on the same CV folds and held-out sources
    chiqa = held_out_scores(
        cand[["gid", "aid", "split", "chiqa_rank"]].assign(label=1, score=-cand["chiqa_rank"]),
        cand,
        L.LABELLED_SPLITS,
        sp.cv_folds,
        seed,
    )
    base, cnn = _metrics("task3_val_baseline"), _metrics("cnn_mediqa")
    systems = {}
    if inp.pred is not None:
        mtl = _metrics("mtl")
        mtl_val = score_task3(gold_val, E.ranked_rows(inp.pred[inp.pred["part"] == "val"])[["qid", "aid", "label"]])
        systems["mtl"] = {"val": E.rounded_scores(mtl_val), "cv": E.rounded_summary(mtl["cv"]), "loso": mtl["loso"]}
    systems |= {
        "chiqa": {
            "val": E.rounded_scores(score_task3(gold_val, L.task3_submission("val", "chiqa"))),
            **chiqa,
        },
        "baseline": {
            "val": E.rounded_scores(task3_scores_of(val_q["baseline"])),
            "cv": base["cv"],
            "loso": base["loso"],
        },
        "cnn": {"val": E.rounded_scores(cnn["val"]), "cv": cnn["cv"], "loso": cnn["loso"]},
        "final": {
            "val": E.rounded_scores(final_val),
            "cv": E.rounded_summary(sel["cv"]),
            "loso": sel["loso"],
            "mtl_weight": sel["weight"],
            "keep_rule": sel["rule"],
            "order": sel["order"],
            "shift": {"cv": sel["cv_shift"], "loso": sel["loso_shift"]},
        },
    }
    return {
        **E.rounded_scores(final_val),
        "system": E.system_name(sel["weight"]),
        "mtl_weight": sel["weight"],
        "keep_rule": sel["rule"],
        "order": sel["order"],
        "selection": {
            "rule": SELECTION_RULE,
            "noise_band": band,
            "weights": [float(w) for w in weights],
            "keep_rules": list(sp.keep_rules),
            "orders": list(sp.orders),
            "select_on": list(sp.select_on),
            "select_under": sp.select_under,
            "acceptance": sel["acceptance"],
        },
        "n_predicted_positive": final_val["n_predicted_positive"],
        "systems": systems,
        "candidates": {str(w): {r: _row(c) for r, c in by_rule.items()} for w, by_rule in sel["table"].items()},
        "orders": {o: _row(c) for o, c in sel["orders"].items()},
        "keep_fits": sel["fits"],
        "vs_baseline": E.vs_baseline(val_q, cv_q, sp.bootstrap_resamples, seed),
        "cv_by_split": cv_by_split,
        "cv_by_order": cv_by_order,
        "question_chars_median": E.question_chars_median(inp.answers),
        "test_predicted_positive_rate": round(float(chosen.loc[chosen["part"] == "test", "label"].mean()), 4),
    }


def write_error_analysis(chosen: pd.DataFrame, cand: pd.DataFrame) -> None:
    """The paper's error analysis (Figures 7-9) of the final system: validation, and all CV folds."""
    from medrank.core.io import write_text

    for where, part in (("val", "val"), ("cv", "oof")):
        for name, df in E.error_analysis(chosen[chosen["part"] == part], cand).items():
            write_text(L.ERROR_ANALYSIS / where / f"{name}.csv", E.rounded_csv(df))
