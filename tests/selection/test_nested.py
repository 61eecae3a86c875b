"""Nested leave-one-source-out (medrank.selection.nested): the held-out source never reaches a selection step or a fit."""

import numpy as np
import pandas as pd
import pytest

from medrank.selection import nested

SOURCES = ["train_liveqa", "train_alexa", "val"]


def _cand(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for s in SOURCES:
        for q in range(15):
            scores = rng.integers(1, 5, 5)
            for a, r in enumerate(np.argsort(-scores, kind="stable").argsort() + 1):
                rows.append(
                    {
                        "gid": f"{s}:{q}",
                        "qid": f"{s}:{q}",
                        "aid": f"{s}:{q}.{a}",
                        "split": s,
                        "reference_rank": int(r),
                        "reference_score": int(scores[a]),
                    }
                )
    out = pd.DataFrame(rows)
    return out.assign(label=(out["reference_score"] >= 3).astype(int))


def _fake_models(truth: pd.DataFrame, calls: list):
    """Two 'systems' whose scores are fixed functions of the truth they were built with (so a later change of the
    candidate table's labels cannot reach them), recording what they are asked to fit on."""
    noise = np.random.default_rng(1).normal(0, 0.25, len(truth))
    p = pd.Series(np.clip(0.3 + 0.4 * truth["label"].to_numpy() + noise, 0.01, 0.99), index=truth["aid"])
    split_of = truth.drop_duplicates("gid").set_index("gid")["split"]

    def rows(inner, inner_sources, outer, shift: float):
        calls.append((set(inner), set(outer)))
        t = truth[truth["gid"].isin(set(inner) | set(outer))]
        fold_cv = t["gid"].map({g: i % 3 for i, g in enumerate(inner)})
        fold_lo = t["gid"].map(lambda g: list(inner_sources).index(split_of[g]) if g in set(inner) else -1)
        prob = np.clip(p.loc[t["aid"]].to_numpy() + shift, 0.01, 0.99)
        base = pd.DataFrame({"gid": t["gid"].to_numpy(), "aid": t["aid"].to_numpy(), "prob": prob, "rank_key": prob})
        is_in = t["gid"].isin(set(inner)).to_numpy()
        parts = [
            base[is_in].assign(part="oof", fold=fold_cv[is_in].astype(int).to_numpy()),
            base[is_in].assign(part="loso", fold=fold_lo[is_in].astype(int).to_numpy()),
            base[~is_in].assign(part="test", fold=-1),
        ]
        return pd.concat(parts, ignore_index=True)

    def mtl_rows(inner, inner_sources, outer):
        out = rows(inner, inner_sources, outer, 0.05)
        return out.assign(prob_mean=out["prob"])

    def base_rows(inner, inner_sources, outer):
        out = rows(inner, inner_sources, outer, -0.05)
        return out.rename(columns={"rank_key": "rank_score"})

    return mtl_rows, base_rows


SEL = nested.Selection(
    (0.0, 1.0), ("threshold", "fixed_0.5", "top_k"), ("rank", "prob"), {"accuracy": 0.0, "order": 0.0}
)


def test_nested_loso_never_lets_the_held_out_source_reach_a_selection_step():
    cand = _cand()
    calls: list = []
    mtl_rows, base_rows = _fake_models(cand, calls)
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL)
    # every fit request: the inner questions are the other sources', the held-out questions only predicted
    for inner, outer in calls:
        assert inner and outer and not inner & outer
        assert len({g.split(":")[0] for g in outer}) == 1 and not any(
            g.split(":")[0] == next(iter(outer)).split(":")[0] for g in inner
        )
    assert set(got["by_source"]) == set(SOURCES)
    assert got["accuracy"]["worst"] == min(r["scores"]["accuracy"] for r in got["by_source"].values())
    for source in SOURCES:
        # scramble the held-out source's labels in the candidate table: its pick must not move, its score must
        flipped = cand.copy()
        mask = flipped["split"] == source
        flipped.loc[mask, "reference_score"] = 5 - flipped.loc[mask, "reference_score"]
        flipped["label"] = (flipped["reference_score"] >= 3).astype(int)
        again = nested.held_out_source(source, SOURCES, flipped, mtl_rows, base_rows, SEL)
        assert again["chosen"] == got["by_source"][source]["chosen"]
        assert again["selection_score"] == got["by_source"][source]["selection_score"]
        assert again["scores"]["accuracy"] != got["by_source"][source]["scores"]["accuracy"]


def test_each_mtl_weight_alone_is_the_rule_held_to_it_on_the_same_folds():
    from dataclasses import replace

    cand = _cand()
    calls: list = []
    mtl_rows, base_rows = _fake_models(cand, calls)
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL, per_weight=(0.0, 1.0))
    # both models are asked for the same inner and held-out questions: the comparison is on identical folds
    assert calls[0::2] == calls[1::2] and len(calls) == 2 * len(SOURCES)
    assert set(got["by_weight"]) == {"0.0", "1.0"} and "by_weight" not in got["by_source"]["val"]
    scores = {}
    for source in SOURCES:
        for w in (0.0, 1.0):
            only = nested.held_out_source(source, SOURCES, cand, mtl_rows, base_rows, replace(SEL, weights=(w,)))
            assert only["chosen"]["mtl_weight"] == w
            scores.setdefault(w, []).append(only["scores"]["accuracy"])
    for w in (0.0, 1.0):
        alone = got["by_weight"][str(w)]["accuracy"]
        assert alone["mean"] == pytest.approx(np.mean(scores[w]), abs=1e-4) and alone["worst"] == min(scores[w])
        assert set(got["by_weight"][str(w)]["shift"]["accuracy"]["by_prior"]) == set(
            got["shift"]["accuracy"]["by_prior"]
        )
    # the fake MTL's probabilities sit 0.1 above the baseline's: the same folds, different systems, different figures
    assert got["by_weight"]["0.0"]["precision"] != got["by_weight"]["1.0"]["precision"]


def test_rows_that_mix_the_held_out_source_into_the_selection_are_refused():
    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])

    def leaky(inner, inner_sources, outer):
        out = base_rows(inner, inner_sources, outer)
        return out.assign(part=out["part"].replace({"test": "oof"}))

    with pytest.raises(AssertionError, match="baseline rows mix the held-out source"):
        nested.held_out_source("val", SOURCES, cand, mtl_rows, leaky, SEL)


def test_overstatement_is_plain_minus_nested():
    plain = {m: {"mean": 0.8, "worst": 0.7} for m in nested.METRICS}
    inner = {m: {"mean": 0.75, "worst": 0.6} for m in nested.METRICS}
    assert nested.overstatement(plain, inner)["accuracy"] == {"mean": 0.05, "worst": 0.1}


def test_each_keep_rule_is_scored_alone_with_mean_and_worst_source():
    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL, per_rule=SEL.keep_rules)
    assert set(got["by_keep_rule"]) == set(SEL.keep_rules)
    for r in SEL.keep_rules:
        acc = got["by_keep_rule"][r]["accuracy"]
        assert acc["worst"] <= acc["mean"] and acc["worst_source"] in SOURCES


def test_the_rule_can_average_accuracy_and_mrr_and_takes_the_larger_band():
    from dataclasses import replace

    from medrank.selection.evaluation import noise_band

    band = noise_band(
        [{"accuracy": 0.01, "mrr": 0.03, "order": 0.02}, {"accuracy": 0.02, "mrr": 0.01, "order": 0.05}],
        ("accuracy", "mrr", "order"),
    )
    assert band == {"accuracy": 0.02, "mrr": 0.03, "order": 0.05}
    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    both = replace(SEL, band=band, select_on=("accuracy", "mrr"))
    got = nested.held_out_source("val", SOURCES, cand, mtl_rows, base_rows, both)
    assert got["chosen"]["keep_rule"] in SEL.keep_rules and 0 <= got["scores"]["mrr"] <= 1


def test_without_per_rule_tables_the_summary_still_holds_every_metric():
    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL)
    assert got["by_keep_rule"] == {} and all(m in got for m in nested.METRICS)


def test_under_the_prior_shift_the_held_out_source_still_reaches_no_selection_step():
    """select_under shift_worst: the inner figures are re-weighted over the positive rates, the held-out source is
    only scored (its band over the rates moves with its labels, the pick does not)."""
    from dataclasses import replace

    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    sel = replace(SEL, keep_rules=("min_keep_1", "minimax", "threshold"), select_under="shift_worst")
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, sel, per_rule=sel.keep_rules)
    band = got["shift"]["accuracy"]
    assert band["worst"] <= band["mean"] <= band["best"] and band["worst_prior"] in (0.2, 0.65)
    assert set(band["by_prior"]) == {f"{p:g}" for p in (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65)}
    assert all("shift" in got["by_keep_rule"][r] for r in sel.keep_rules)
    source = "train_alexa"
    flipped = cand.copy()
    mask = flipped["split"] == source
    flipped.loc[mask, "label"] = 1 - flipped.loc[mask, "label"]
    again = nested.held_out_source(source, SOURCES, flipped, mtl_rows, base_rows, sel)
    assert again["chosen"] == got["by_source"][source]["chosen"]
    mine = nested.held_out_source(source, SOURCES, cand, mtl_rows, base_rows, sel)
    assert again["shift"][0.2]["accuracy"] != mine["shift"][0.2]["accuracy"]


def test_the_keep_rule_pick_applies_the_acceptance_rule_against_the_default_rule():
    from medrank.models.nested_refits import keep_rule_pick

    def rule(acc: dict, acc_worst_rate: float, mrr_worst_rate: float = 0.8, resampled: bool = True) -> dict:
        prior = {"accuracy": {"worst": acc_worst_rate}, "mrr": {"worst": mrr_worst_rate}}
        scores = {s: {"accuracy": a, "precision": 0.7, "mrr": 0.8, "spearman": 0.3} for s, a in acc.items()}
        return {"by_source": scores, "shift": prior, **({"resampled": prior} if resampled else {})}

    band = {"accuracy": 0.01, "precision": 0.02, "mrr": 0.02, "spearman": 0.05}
    by_rule = {
        "min_keep_1": rule({"train_alexa": 0.80, "train_liveqa": 0.78, "val": 0.79}, 0.74),
        # the best mean (0.817) but Alexa loses 0.04: refused
        "em": rule({"train_alexa": 0.76, "train_liveqa": 0.86, "val": 0.83}, 0.80),
        # +0.03 on the worst source and at the worst rate (1.5 bands on the mean of accuracy and a flat MRR): adopted
        "platt": rule({"train_alexa": 0.82, "train_liveqa": 0.81, "val": 0.81}, 0.77),
    }
    got = keep_rule_pick(by_rule, band, ["accuracy", "mrr"], "min_keep_1")
    assert got["pick"] == "platt" and got["incumbent"] == "min_keep_1"
    assert got["verdicts"]["em"]["losses"] == ["train_alexa accuracy -0.040"]
    # the worst rate read from the resampled batches, not the re-weighted ones: a resampled collapse refuses platt
    by_rule["platt"]["resampled"] = {"accuracy": {"worst": 0.70}, "mrr": {"worst": 0.8}}
    assert keep_rule_pick(by_rule, band, ["accuracy", "mrr"], "min_keep_1")["pick"] == "min_keep_1"
    # the default's rule not among the rules scored: no pick, not a KeyError
    assert keep_rule_pick({"em": by_rule["em"]}, band, ["accuracy", "mrr"], "min_keep_1")["pick"] is None


def test_the_written_rule_reads_each_figure_at_its_worst_positive_rate():
    """score.select_under shift_worst: a candidate's score is the mean of its CV and LOSO figures at their worst rate;
    "mean" keeps the figures as they are; the chosen candidate's band is that of its rows in the chosen order."""
    from medrank.selection.evaluation import candidate_systems, selection_score

    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    gids = list(pd.unique(cand["gid"]))
    args = (mtl_rows(gids, SOURCES, []), base_rows(gids, SOURCES, []), cand, gids, (0.0, 1.0))
    rules, band = ("min_keep_1", "minimax"), {"accuracy": 0.0, "mrr": 0.0, "order": 0.0}
    worst = candidate_systems(*args, rules, ("rank",), SOURCES, band, ("accuracy", "mrr"), "shift_worst")
    plain = candidate_systems(*args, rules, ("rank",), SOURCES, band, ("accuracy", "mrr"), "mean")
    for w in (0.0, 1.0):
        for r in rules:
            c = worst["table"][w][r]
            assert c["score"] == pytest.approx(
                np.mean(
                    [selection_score(c["cv_shift"], c["loso_shift"], m, "shift_worst") for m in ("accuracy", "mrr")]
                )
            )
            assert c["score"] == pytest.approx(
                np.mean([0.5 * (c["cv_shift"][m]["worst"] + c["loso_shift"][m]["worst"]) for m in ("accuracy", "mrr")])
            )
            p = plain["table"][w][r]
            assert p["score"] == pytest.approx(
                np.mean([selection_score(p["cv"], p["loso"], m) for m in ("accuracy", "mrr")])
            )
    # the pick is the acceptance rule's: the simplest candidate unless one is adopted over it
    acc = worst["acceptance"]
    assert acc["incumbent"] == [0.0, "min_keep_1"] and acc["pick"] == [worst["weight"], worst["rule"]]
    adopted = [k for k, v in acc["verdicts"].items() if v["adopt"]]
    assert (f"{worst['weight']:g} {worst['rule']}" in adopted) if adopted else acc["pick"] == acc["incumbent"]
    assert set(worst["cv_shift"]["mrr"]["by_prior"]) == {f"{p:g}" for p in SHIFT}


SHIFT = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65)


def test_resampled_priors_for_the_pick_and_each_keep_rule_and_the_held_out_labels_only_score():
    """analysis.nested.resample: the held-out source resampled to each rate, the pick's keep rule (and each rule
    alone) re-run on each batch; the pick is made as before, the held-out labels only draw the batches and score."""
    from medrank.selection.resampling import Resampling

    cand = _cand()
    mtl_rows, base_rows = _fake_models(cand, [])
    rs = Resampling(priors=(0.2, 0.5), draws=2, seed=4)
    rules = ("em",)  # batch-adaptive: re-fitted on every batch
    got = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL, per_rule=rules, resample=rs)
    plain = nested.nested_loso(SOURCES, cand, mtl_rows, base_rows, SEL, per_rule=rules)
    assert "resampled" not in plain and all("resampled" not in v for v in plain["by_keep_rule"].values())
    # the existing keys are unchanged
    without = {k: v for k, v in got.items() if k != "resampled"}
    without["by_keep_rule"] = {
        r: {k: v for k, v in f.items() if k != "resampled"} for r, f in got["by_keep_rule"].items()
    }
    assert without == plain
    for r in (got, *got["by_keep_rule"].values()):
        acc = r["resampled"]["accuracy"]
        assert set(acc["by_prior"]) == {"0.2", "0.5"} and set(acc["by_fold"]) == set(SOURCES)
        assert acc["band"]["worst"] <= acc["worst"] <= acc["mean"] and acc["band"]["worst_fold"] in SOURCES
    source = "val"
    flipped = cand.copy()
    mask = flipped["split"] == source
    flipped.loc[mask, "label"] = 1 - flipped.loc[mask, "label"]
    again = nested.held_out_source(source, SOURCES, flipped, mtl_rows, base_rows, SEL, resample=rs)
    mine = nested.held_out_source(source, SOURCES, cand, mtl_rows, base_rows, SEL, resample=rs)
    assert again["chosen"] == mine["chosen"] and again["resampled"] != mine["resampled"]
