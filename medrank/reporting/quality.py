"""RESULTS sections on the systems' quality: Task 3 rows, nested LOSO, Task 2, the baseline and MTL tables."""

from __future__ import annotations

import json

from medrank.reporting.formatting import (
    TASK3_COLUMNS,
    acceptance_text,
    fmt_metric,
    acc_text,
    fmt_num,
    loso_text,
    md_table,
    pm_text,
    shift_text,
)
from medrank.reporting.headline import final_line, system_rows


def held_pick(choice: dict, final: dict) -> str:
    """Whether stage score runs system_choice's pick (score.system holds it), said in a phrase."""
    pick, runs = choice.get("system"), final.get("system")
    if choice is final or pick == runs:
        return f"it picks `{pick}`, which `score.system` holds"
    return f"it picks `{pick}`, but `score.system` runs `{runs}`: follow the pick, or say why not"


def task3_section(metrics: dict[str, dict]) -> list[str]:
    """Validation systems side by side (+ question-grouped CV over train+val where the stage ran it)."""
    systems = {f.removeprefix("task3_val_"): m for f, m in metrics.items() if f.startswith("task3_val_")}
    if "cnn_mediqa" in metrics and "val" in metrics["cnn_mediqa"]:
        systems["cnn (Severyn & Moschitti)"] = metrics["cnn_mediqa"]["val"]
    if not systems:
        return []
    final = metrics.get("task3_val", {})
    sys_rows = system_rows(metrics)
    rows = []
    for name, m in systems.items():
        key = "final" if name == "ensemble" else name.split(" ")[0]
        if (
            key == "final" and final.get("system") != "ensemble" and final.get("system") in systems
        ):  # a row of its own: marked there
            continue
        r = sys_rows.get(key, {})
        label = (
            f"**{final.get('system')}** (final: `submissions/task3_{{val,test}}.csv`)"
            if key in ("final", final.get("system")) and key != "ensemble"
            else name
        )
        rows.append(
            [label]
            + [fmt_metric(m.get(k)) for k, _ in TASK3_COLUMNS]
            + [pm_text((r.get("cv") or {}).get(k)) for k in ("accuracy", "mrr", "spearman")]
            + [loso_text(r.get("loso"), k) for k in ("accuracy", "mrr", "spearman")]
        )
    head = (
        ["system"]
        + [h for _, h in TASK3_COLUMNS]
        + ["CV accuracy", "CV MRR", "CV Spearman", "LOSO accuracy (worst)", "LOSO MRR (worst)", "LOSO Spearman (worst)"]
    )
    out = [
        "**MEDIQA Task 3: every system under three protocols** (val: the 25 validation questions, swings ±0.1; CV: question-grouped "
        "5-fold over train+val, mean ± sd; LOSO: trained on two labelled sources, scored on the third, mean (worst source))",
        "",
    ]
    out += md_table(head, rows) + final_line(final)
    choice = metrics.get("system_choice") or final  # every MTL weight's candidate: analysis stage system_choice
    cands = choice.get("candidates") or {}
    if cands:
        rules = (choice.get("selection") or {}).get("keep_rules") or list(next(iter(cands.values())))
        table = [
            [w, rule, pm_text(c["cv"]["accuracy"]), loso_text(c["loso"]), fmt_num(c["score"])]
            for w, by_rule in cands.items()
            for rule, c in by_rule.items()
            if rule == final.get("keep_rule") or float(w) == float(final.get("mtl_weight", -1))
        ]
        table = [
            [f"**{r[0]}**", f"**{r[1]}**", *r[2:]]
            if float(r[0]) == float(final.get("mtl_weight", -1)) and r[1] == final.get("keep_rule")
            else r
            for r in table
        ]
        out += [
            f"**Decisions that transfer** (analysis stage `system_choice`, `metrics/system_choice.json`: {held_pick(choice, final)}): MTL weight (0 = the baseline alone, 1 = the MTL alone) × keep rule, each fitted on other "
            "folds' / other sources' held-out rows; rows: every rule at the chosen weight and every weight at the chosen rule; "
            "score = mean of CV accuracy and LOSO mean accuracy. Keep rules, simplest first (`medrank/params/rankers.py` KEEP_RULES): "
            + ", ".join(f"`{r}`" for r in rules)
            + ".",
            "",
        ]
        out += md_table(["MTL weight", "keep rule", "CV accuracy", "LOSO accuracy (worst)", "score"], table)
    orders = final.get("orders") or {}
    if orders:
        table = [
            [
                f"**{o}**" if o == final.get("order") else o,
                pm_text(c["cv"]["mrr"]),
                pm_text(c["cv"]["spearman"]),
                loso_text(c["loso"], "mrr"),
                loso_text(c["loso"], "spearman"),
                fmt_num(c["score"]),
            ]
            for o, c in orders.items()
        ]
        out += [
            "**Order of the kept answers** (the chosen weight and keep rule; `rank`: by the rank model, `prob_first`: the most "
            "probable kept answer first, then the rank model, `prob`: by probability; score = mean over CV and LOSO of "
            "(MRR + official Spearman) / 2)",
            "",
        ]
        out += md_table(["order", "CV MRR", "CV Spearman", "LOSO MRR (worst)", "LOSO Spearman (worst)", "score"], table)
    vs = final.get("vs_baseline")
    if vs and final.get("system") != "baseline":
        cell = lambda d: (
            f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['p_better']:.0%} / {d['p_worse']:.0%})"
        )
        rows = [
            [where] + [cell(vs[where][k]) for k in ("accuracy", "precision", "mrr", "spearman_true")]
            for where in ("val", "cv")
            if where in vs
        ]
        out += [
            f"**Final system minus the baseline**, paired question bootstrap ({vs['resamples']} resamples of the questions, the same "
            "draw for both systems): observed difference [95% interval] (share of resamples where the final system is better / "
            "worse). val: the 25 validation questions; cv: the out-of-fold rows of all train+val questions",
            "",
        ]
        out += md_table(["questions", "Accuracy", "Precision", "MRR", "Spearman (true)"], rows)
    by_split, chars = final.get("cv_by_split"), final.get("question_chars_median") or {}
    if by_split:
        keys = ("accuracy", "precision", "mrr", "spearman", "spearman_true")
        rows = [
            [s, str(chars.get(s, "—"))]
            + [fmt_num(m.get(k)) for k in keys]
            + [fmt_num(by_split.get("baseline", {}).get(s, {}).get("accuracy"))]
            for s, m in by_split.get("final", {}).items()
        ]
        rows += [
            [f"{s} (blind)", str(n)] + ["—"] * (len(keys) + 1)
            for s, n in chars.items()
            if s not in by_split.get("final", {})
        ]
        out += [
            "**CV by question set** (the final system's out-of-fold rows, split by where the questions come from; the median "
            "question length is read from the unlabelled question text, test included: compare the test questions' style "
            "with each labelled set's)",
            "",
        ]
        out += md_table(
            [
                "questions",
                "median question chars",
                "Accuracy",
                "Precision",
                "MRR",
                "Spearman (official)",
                "Spearman (true)",
                "baseline Accuracy",
            ],
            rows,
        )
    return out


def nested_section(m: dict) -> list[str]:
    """The final system's selection procedure under nested LOSO: per held-out source its pick and scores, the plain
    (selection-time) LOSO beside it, and each keep rule alone (weight and order still chosen inside)."""
    fs = (m or {}).get("final_system")
    if not fs:
        return []
    n, plain = fs["nested_loso"], fs["plain_loso"]
    keys = [k for k, _ in TASK3_COLUMNS if k in n]
    rows = [
        [
            f"held out: {src}",
            f"`{'baseline' if r['chosen']['mtl_weight'] == 0 else 'mtl' if r['chosen']['mtl_weight'] == 1 else 'ensemble'}` "
            f"w {r['chosen']['mtl_weight']:g}, `{r['chosen']['keep_rule']}`, `{r['chosen']['order']}`",
        ]
        + [fmt_num(r["scores"][k]) for k in keys]
        for src, r in n["by_source"].items()
    ]
    rows.append(["**nested LOSO: mean (worst)**", ""] + [f"**{n[k]['mean']:.3f}** ({n[k]['worst']:.3f})" for k in keys])
    rows.append(
        ["plain LOSO (selection-time): mean (worst)", "the final system"]
        + [f"{plain[k]['mean']:.3f} ({plain[k]['worst']:.3f})" for k in keys]
    )
    out = [
        "**Nested leave-one-source-out** ("
        + ANALYSIS_NOTE
        + "; stage `nested_loso`): for each labelled source, the baseline and "
        "the MTL are refitted on the other two sources (question-grouped CV over them and leave-one-of-the-two-out), the written rule "
        "picks MTL weight × keep rule, then the order, on those rows only, and the held-out source is scored by the models trained "
        "on both other sources with that pick. Recipes fixed at the defaults: baseline features "
        + ", ".join(f"`{g}`" for g in m["recipes"]["baseline_features"])
        + "; MTL feature groups "
        + ", ".join(f"`{g}`" for g in m["recipes"]["mtl_feature_groups"])
        + ".",
        "",
    ]
    out += md_table(["", "pick (made without the held-out source)"] + [h for k, h in TASK3_COLUMNS if k in keys], rows)
    variants = m.get("variants") or {}
    if variants:

        def worst_rate(r: dict) -> str:
            sh = r.get("resampled") or r.get("shift") or {}
            return " / ".join(f"{sh[k]['worst']:.3f}" if k in sh else "—" for k in ("accuracy", "mrr"))

        def figures(r: dict) -> list[str]:
            return [loso_text(r, k) for k in ("accuracy", "precision", "mrr", "spearman")] + [worst_rate(r)]

        def overrides(over: dict) -> str:
            return (
                "; ".join(
                    f"`{k}`: " + (", ".join(map(str, val)) if isinstance(val, list) else str(val))
                    for k, val in over.items()
                )
                or "—"
            )

        rows = [["default", "—", "—"] + figures(n) + ["—", "—"]]
        rows += [
            [name, overrides(v["baseline"]), overrides(v["mtl"])]
            + figures(v["nested_loso"])
            + [
                f"{v['vs_default']['accuracy']:+.3f} / {v['vs_default']['mrr']:+.3f}",
                acceptance_text(v.get("acceptance")),
            ]
            for name, v in variants.items()
        ]
        out += [
            "**Rows beside the default under nested LOSO** (`analysis.nested.variants`: keys of the baseline and mtl sections "
            "a row overrides, the same protocol; the groups of `baseline.filter_only` reach the baseline's filter, not its rank SVM; at the "
            "worst rate: the mean over the held-out sources resampled to each positive rate in 20–65%, at the worst one; acceptance: "
            "the acceptance rule between the row and the default, the simpler recipe the incumbent: a group stays only when it "
            "gains beyond the noise band on the worst source and at the worst rate and loses on no source)",
            "",
        ]
        out += md_table(
            [
                "row",
                "baseline overrides",
                "MTL overrides",
                "Accuracy",
                "Precision",
                "MRR",
                "Spearman (official)",
                "at the worst rate (accuracy / MRR)",
                "vs default (accuracy / MRR)",
                "acceptance",
            ],
            rows,
        )
    if n.get("shift"):
        s = n["shift"]
        priors = list(s["accuracy"]["by_prior"])
        out += [
            "**The nested estimate under a prior shift** (`experiment.PriorShift`): each held-out source's rows re-weighted "
            "to a positive rate (a correct answer weighs rate / the source's own rate, an incorrect one (1 − rate) / (1 − own "
            "rate); MRR and Spearman: question means weighted by each question's mean row weight), then averaged over the "
            "three sources. The labelled sources hold 27–47% correct answers: a set with fewer correct answers gets the "
            "lower accuracy rows, one with more the higher.",
            "",
        ]
        out += md_table(
            ["positive rate"] + [h for k, h in TASK3_COLUMNS if k in s],
            [
                [f"{float(pr):.0%}"] + [f"{s[k]['by_prior'][pr]:.3f}" for k, _ in TASK3_COLUMNS if k in s]
                for pr in priors
            ],
        )
    alone_columns = [
        "Accuracy",
        "Accuracy, 20–65% correct",
        "Precision",
        "MRR",
        "MRR, 20–65% correct",
        "Spearman (official)",
    ]

    def alone_row(label: str, v: dict) -> list[str]:
        band = v.get("resampled") or v.get("shift")  # resampled: each batch's keep rule re-run (an adaptive one adapts)
        return [
            label,
            loso_text(v),
            shift_text(band),
            loso_text(v, "precision"),
            loso_text(v, "mrr"),
            shift_text(band, "mrr"),
            loso_text(v, "spearman"),
        ]

    weights = n.get("by_weight") or {}
    if weights:
        rows = [alone_row(weight_name(w), v) for w, v in weights.items()]
        rows += [
            alone_row(f"{weight_name(w)}, row `{name}`", r)
            for name, var in variants.items()
            for w, r in (var["nested_loso"].get("by_weight") or {}).items()
            if float(w) > 0
        ]
        out += [
            "**The MTL against its baseline under nested LOSO** (each MTL weight the only one the written rule may pick; "
            "keep rule and order still chosen inside; the same folds and held-out sources for both models; mean over the "
            "three held-out sources (worst source)); rows of `analysis.nested.variants` that change the MTL below.",
            "",
        ]
        out += md_table(["MTL weight", *alone_columns], rows)
        if m.get("mtl_vs_baseline"):
            out += [
                "",
                "The MTL alone challenging the baseline alone under the acceptance rule: "
                + acceptance_text({"verdict": m["mtl_vs_baseline"]})
                + ".",
            ]
    rules = n.get("by_keep_rule") or {}
    if rules:
        kp = m.get("keep_rule_pick") or {}
        verdicts = kp.get("verdicts") or {}
        rows = [
            alone_row(f"`{r}`", v)
            + ["incumbent" if r == kp.get("incumbent") else acceptance_text({"verdict": verdicts.get(r)})]
            for r, v in rules.items()
        ]
        verdict = (
            (
                f" The acceptance rule on these figures ({kp.get('on')}) keeps `{kp['pick']}`"
                + (
                    f" (the incumbent, `{kp['incumbent']}`)"
                    if kp["pick"] == kp["incumbent"]
                    else f" over `{kp['incumbent']}`"
                )
                + "; `score.keep_rules` holds "
                + ", ".join(f"`{r}`" for r in kp.get("score_keep_rules", []))
                + "."
            )
            if kp.get("pick")
            else ""
        )
        out += [
            "**Keep rules under an unknown prior** (nested LOSO, each rule the only one the written rule may pick; weight and "
            "order still chosen inside; mean over the three held-out sources (worst source)). A question with nothing kept "
            "scores 0 on the official MRR: `min_keep_1` and `top_k` always keep each question's best answer." + verdict,
            "",
        ]
        out += md_table(["keep rule", *alone_columns, "acceptance (vs the incumbent)"], rows)
    return out


def weight_name(w: str) -> str:
    """An MTL weight as the table names it: 0 is the baseline alone, 1 the MTL alone."""
    return {0.0: "0 (the baseline alone)", 1.0: "1 (the MTL alone)"}.get(float(w), f"{float(w):g} (ensemble)")


def task2_section(m: dict) -> list[str]:
    """Task 2 decisions within a CHQ: every rule's CHQ-grouped CV accuracy and predicted-positive rates."""
    if not (m or {}).get("rules"):
        return []
    rows = [
        [
            f"**{r}**" if r == m["chosen"] else r,
            v["description"],
            acc_text(v),
            fmt_num(v["val_positive_rate"]),
            fmt_num(v.get("test_positive_rate")),
        ]
        for r, v in m["rules"].items()
    ]
    out = [
        f"**Task 2 decisions within a CHQ** (stage `task2`): finetune_rqe's out-of-fold P(entailed) of the {m['n_val_pairs']} "
        f"validation pairs ({m['n_val_chqs']} CHQs), decided per CHQ; each rule's floor / margin fitted on the other folds; the best "
        f"CV accuracy wins ({m['selection_rule']}). Nested CV of that choice (made on the other folds only): "
        f"{acc_text(m['nested_cv'])}. True positive rate on validation: {fmt_num(m['val_true_positive_rate'])}; the test set "
        f"({m['n_test_pairs']} pairs, {m['n_test_chqs']} CHQs) is unlabelled: only its predicted rate is shown.",
        "",
    ]
    return out + md_table(
        ["rule", "what", "CV accuracy", "predicted positive (val, out-of-fold)", "predicted positive (test)"], rows
    )


ANALYSIS_NOTE = (
    "from analysis/dvc.yaml, which `dvc repro` / `dvc exp run` leave alone: `dvc repro analysis/dvc.yaml` refreshes it, "
    "`dvc status analysis/dvc.yaml` says whether it is current"
)


def baseline_section(m: dict, ab: dict, band: dict) -> list[str]:
    out = []
    t1 = ab.get("table1_ablation") or {}
    if t1:
        best = _rule_pick(t1, (band.get("baseline") or {}).get("accuracy", 0.0))
        rows = [
            [
                ("**" + name.replace("+", " + ") + "** (rule's pick)") if name == best else name.replace("+", " + "),
                pm_text(r["cv"]["accuracy"]),
                loso_text(r.get("loso")),
                fmt_num(r.get("selection_score")),
                pm_text(r["cv"]["precision"]),
                pm_text(r["cv"]["spearman_true"]),
                fmt_num(r["val"]["accuracy"]),
                fmt_num(r["val"]["precision"]),
                fmt_num(r["val"]["spearman"]),
            ]
            for name, r in t1.items()
        ]
        default = "+".join(ab.get("default_features") or [])
        agree = (
            "is the rule's pick"
            if default == best
            else f"is not the rule's pick ({best.replace('+', ' + ') if best else '—'})"
        )
        out += [
            "**Baseline feature ablation** (paper Tables 1-2: LR filter + rank SVM; score = mean of CV accuracy and LOSO mean accuracy; "
            f"the rule's pick: the fewest groups within the baseline's seed spread of the best score; {ANALYSIS_NOTE}). "
            f"The default `baseline.features` ({default.replace('+', ' + ')}) {agree}.",
            "",
        ]
        out += md_table(
            [
                "features",
                "CV accuracy",
                "LOSO accuracy (worst)",
                "score",
                "CV precision",
                "CV Spearman (true)",
                "val accuracy",
                "val precision",
                "val Spearman",
            ],
            rows,
        )
    t4 = ab.get("table4_ranking") or {}
    if t4:
        rows = [
            [name.replace("+", " + ")]
            + [
                x
                for k in ("lr_filter_score", "rank_svm")
                for x in (pm_text(r[k]["cv_spearman_true"]), _loso_cell(r[k]))
            ]
            for name, r in t4.items()
        ]
        out += [
            "**Ranking: LR filter score vs rank SVM** (paper Table 4; Spearman covers the answers each row's own filter "
            "keeps, so compare the two rankers within a row, not rows with each other)",
            "",
        ]
        out += md_table(
            [
                "features",
                "LR: CV Spearman (true)",
                "LR: LOSO Spearman (worst)",
                "rank SVM: CV Spearman (true)",
                "rank SVM: LOSO Spearman (worst)",
            ],
            rows,
        )
    return out


def _rule_pick(rows: dict, band: float) -> str | None:
    """The written rule over feature rows: the fewest groups among rows within `band` of the best selection score."""
    scored = {n: r["selection_score"] for n, r in rows.items() if r.get("selection_score") is not None}
    if not scored:
        return None
    best = max(scored.values())
    return min(
        (n for n, v in scored.items() if v >= best - band - 1e-12),
        key=lambda n: (len(rows[n].get("groups") or n.split("+")), -scored[n]),
    )


def _loso_cell(r: dict) -> str:
    """Table 4's LOSO Spearman cell (mean and worst source of the official Spearman)."""
    return loso_text({"spearman": r.get("loso_spearman")}, "spearman")


def mtl_section(m: dict, ab: dict) -> list[str]:
    """The MTL's CV beside its ablation rows (each row: its overrides of params.yaml `mtl`)."""
    if not ab.get("rows") or not m.get("cv"):
        return []
    rows = []
    for name, cv in {"default (params.yaml `mtl`)": m["cv"], **ab["rows"]}.items():
        change = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in (cv.get("overrides") or {}).items()) or "—"
        loso = m.get("loso") if cv is m["cv"] else cv.get("loso")
        rows.append(
            [name, change]
            + [pm_text(cv.get(k)) for k in ("accuracy", "precision", "mrr", "spearman_true")]
            + [loso_text(loso), loso_text(loso, "mrr")]
        )
    out = [
        "**Multi-task model: what each part adds** (question-grouped 5-fold CV over train+val, the same folds for every row, and "
        "LOSO; CV MRR is low because some training questions have no valid answer: their MRR is 0 whatever the ranking; the rows "
        f"are {ANALYSIS_NOTE}; the default's row is the mtl stage's)",
        "",
    ]
    return out + md_table(
        [
            "row",
            "change from the default",
            "CV accuracy",
            "CV precision",
            "CV MRR",
            "CV Spearman (true)",
            "LOSO accuracy (worst)",
            "LOSO MRR (worst)",
        ],
        rows,
    )


def mtl_confirm_section(m: dict) -> list[str]:
    """analysis/dvc.yaml mtl_confirm: the default and the named rows under several seeds, paired by seed."""
    if not m.get("rows"):
        return []
    rows = []
    for name, r in m["rows"].items():
        change = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in (r.get("overrides") or {}).items()) or "—"
        diff = "—" if name == "default" else f"{r['diff_mean']:+.4f} ± {r['diff_sd']:.4f}"
        verdict = "—" if name == "default" else ("**win**" if r["win"] else "within the noise")
        rows.append([name, change, " ".join(f"{v:.3f}" for v in r["scores"]), f"{r['mean']:.4f}", diff, verdict])
    out = [
        f"**MTL rows confirmed over {len(m['seeds'])} seeds** (seeds {', '.join(map(str, m['seeds']))}: folds and initialisation, the same for "
        f"every row of a seed; score = {m['score']}; band = the sd of the default's score over the seeds, {m['band']:.4f}: a row wins "
        f"only if its mean paired difference exceeds it; {ANALYSIS_NOTE})",
        "",
    ]
    return out + md_table(
        ["row", "change from the default", "score per seed", "mean", "paired difference (mean ± sd)", "verdict"], rows
    )
