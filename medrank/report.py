"""README.md and RESULTS.md blocks and the model cards, rendered from the repo itself (never typed by hand).

README.md holds the headline table (`headline` block) and `dvc dag --md` (`dag` block); RESULTS.md holds every other
table (`results` block). Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; the prose around
the markers is hand-written and left alone. The model cards (docs/model_cards/, medrank/model_cards.py) are whole
generated files, one per `artifacts:` entry of the README's repository's dvc.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path

from medrank.errors import MedrankError
from medrank.io import write_text

TASK3_COLUMNS = [("accuracy", "Accuracy"), ("precision", "Precision"), ("mrr", "MRR"), ("spearman", "Spearman (official)"), ("spearman_true", "Spearman (true)")]

# The bar: the best MEDIQA 2019 team per metric on the blind test sets (Ben Abacha et al., BioNLP 2019 overview).
# Published figures, not ours: the only numbers in README/RESULTS that do not come from metrics/.
MEDIQA2019_BEST_TASK3 = {"accuracy": 0.783, "precision": 0.819, "mrr": 0.962, "spearman": 0.338}
MEDIQA2019_BEST_TASK2 = {"accuracy": 0.749}


def _load(path: Path) -> dict:
    """A metrics file as a JSON object; a truncated, non-UTF-8 or non-object file (what a merge conflict or a full disk
    leaves) is one error line naming it and the way back."""
    from medrank.io import decode_utf8

    fix = f"restore it with `git checkout -- {path}` or re-run its stage (`dvc repro`)"
    try:
        obj = json.loads(decode_utf8(path.read_bytes(), path))
    except json.JSONDecodeError as e:
        raise MedrankError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    except MedrankError as e:
        raise MedrankError(f"{e}; {fix}") from None
    if not isinstance(obj, dict):
        raise MedrankError(f"{path}: expected a JSON object of metrics, got {type(obj).__name__}; {fix}")
    return obj


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "—" if v is None else str(v)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def _pm(d: dict | None) -> str:
    """A CV cell: mean ± sd."""
    return "—" if not d else f"{d['mean']:.3f} ± {d['sd']:.3f}"


def _loso(d: dict | None, metric: str = "accuracy") -> str:
    """A LOSO cell: the mean over held-out sources (the worst source's value and name)."""
    m = (d or {}).get(metric)
    return "—" if not m else f"{m['mean']:.3f} ({m['worst']:.3f} {m['worst_source']})"


def _acc(d: dict | None) -> str:
    """An RQE CV cell: accuracy mean ± sd over folds."""
    return "—" if not d or d.get("accuracy") is None else f"{d['accuracy']:.3f} ± {d.get('accuracy_sd') or 0:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def _final_line(final: dict, short: bool = False) -> list[str]:
    """One sentence naming the score stage's final system, its decision rules and how they were chosen (`short`: the
    rule itself is left to the README's prose)."""
    if not final:
        return []
    sel = final.get("selection") or {}
    rule = sel.get("rule", "") if isinstance(sel, dict) else sel
    band = sel.get("noise_band") if isinstance(sel, dict) else None
    noise = f" Noise band (seed spread): accuracy {band['accuracy']:.3f}, order score {band['order']:.3f}." if band else ""
    how = "Chosen by the written rule (below)." if short else f"Rule: {rule}"
    if final.get("system") == "baseline":  # said plainly: the paper's system does not beat the simpler one here
        how += " The MTL is not better beyond the noise band, under CV or LOSO, so the simpler baseline is kept."
    return [f"Final system: `{final.get('system')}` (MTL weight {final.get('mtl_weight', 0):g}), keep rule `{final.get('keep_rule')}`, "
            f"order `{final.get('order')}`. {how}{noise}", ""]  # fmt: skip


def _headline(metrics: dict[str, dict]) -> list[str]:
    """README's one table: the final Task 3 system beside the baseline, CHiQA's order and the 2019 bar; Task 2 in a line."""
    final = metrics.get("task3_val")
    if not final:
        return []
    baseline, chiqa = metrics.get("task3_val_baseline", {}), metrics.get("task3_val_chiqa")
    sys_rows = final.get("systems", {})
    nested = ((metrics.get("nested_loso") or {}).get("final_system") or {}).get("nested_loso")
    cells = lambda m, r, n=None: ([_fmt(m.get(k)) for k, _ in TASK3_COLUMNS] + [_loso(n)]  # noqa: E731
                                  + [_pm((r.get("cv") or {}).get("accuracy")), _loso(r.get("loso"))])  # fmt: skip
    rows = [[f"**{final.get('system')}** (final: `submissions/task3_{{val,test}}.csv`)"] + cells(final, sys_rows.get("final", {}), nested)]
    if baseline and final.get("system") != "baseline":
        rows.append(["baseline (LR filter + rank SVM)"] + cells(baseline, sys_rows.get("baseline", baseline)))
    mtl = metrics.get("task3_val_mtl")
    if mtl and final.get("system") != "mtl" and "mtl" in sys_rows:  # the paper's system, whenever the rule did not pick it alone
        rows.append(["MTL (multi-task network)"] + cells(mtl, sys_rows["mtl"]))
    if chiqa:
        rows.append(["CHiQA order (every answer kept)"] + cells(chiqa, sys_rows.get("chiqa", {})))
    rows.append(["MEDIQA 2019 bar: best team per metric, blind test"] + cells(MEDIQA2019_BEST_TASK3, {}))
    n_val, n_cv, folds = (chiqa or {}).get("n_questions", 25), baseline.get("cv_questions"), baseline.get("cv_folds", 5)
    out = [f"**MEDIQA 2019 Task 3**: the {n_val} validation questions (swings ±0.1); **nested LOSO** (selection re-made on two "
           "labelled sources, the third scored: mean, worst source); what the rule selected on: question-grouped "
           f"{folds}-fold CV over the {f'{n_cv} ' if n_cv else ''}train + validation questions and plain LOSO. The 2019 bar is "
           "on the blind test: where we stand, not a paired comparison.", ""]  # fmt: skip
    head = ["system"] + [h for _, h in TASK3_COLUMNS] + ["**nested LOSO accuracy (worst)**", "CV accuracy", "LOSO accuracy (worst)"]
    out += _table(head, rows) + _final_line(final, short=True)
    fs = (metrics.get("nested_loso") or {}).get("final_system") or {}
    if fs.get("overstatement"):
        over = fs["overstatement"]
        out += [f"Nested LOSO: MRR {_loso(nested, 'mrr')}, Spearman {_loso(nested, 'spearman')}; plain LOSO minus nested: "
                f"accuracy {over['accuracy']['mean']:+.3f}, MRR {over['mrr']['mean']:+.3f}.", ""]  # fmt: skip
    out += _task2_line(metrics)
    return out


def _task2_line(metrics: dict[str, dict]) -> list[str]:
    """Task 2 in a line: the RQE model finetune_rqe chose and the within-CHQ decision stage task2 chose."""
    rqe, t2 = metrics.get("finetune_rqe") or {}, metrics.get("task2") or {}
    if not rqe.get("cv"):
        return []
    line = (f"**MEDIQA 2019 Task 2** (question entailment): `{rqe.get('chosen')}`, question-grouped CV accuracy over the "
            f"{rqe.get('n_val_pairs')} validation pairs {_acc(rqe['cv'])} (each pair alone at 0.5)")  # fmt: skip
    if t2.get("cv"):
        line += (f"; within each CHQ (`{t2['chosen']}`): CV {_acc(t2['cv'])}, **nested {_acc(t2['nested_cv'])}**; "
                 f"entailed: test {_fmt(t2.get('test_positive_rate'))} predicted, validation {_fmt(t2.get('val_true_positive_rate'))}")  # fmt: skip
    return [line + f"; the best 2019 team, blind test: {_fmt(MEDIQA2019_BEST_TASK2['accuracy'])}.", ""]


def _task3(metrics: dict[str, dict]) -> list[str]:
    """Validation systems side by side (+ question-grouped CV over train+val where the stage ran it)."""
    systems = {f.removeprefix("task3_val_"): m for f, m in metrics.items() if f.startswith("task3_val_")}
    if "cnn_mediqa" in metrics and "val" in metrics["cnn_mediqa"]:
        systems["cnn (Severyn & Moschitti)"] = metrics["cnn_mediqa"]["val"]
    if not systems:
        return []
    final = metrics.get("task3_val", {})
    sys_rows = final.get("systems", {})
    rows = []
    for name, m in systems.items():
        key = "final" if name == "ensemble" else name.split(" ")[0]
        if key == "final" and final.get("system") != "ensemble" and final.get("system") in systems:  # a row of its own: marked there
            continue
        r = sys_rows.get(key, {})
        label = f"**{final.get('system')}** (final: `submissions/task3_{{val,test}}.csv`)" if key in ("final", final.get("system")) and key != "ensemble" else name
        rows.append([label] + [_fmt(m.get(k)) for k, _ in TASK3_COLUMNS]
                    + [_pm((r.get("cv") or {}).get(k)) for k in ("accuracy", "mrr", "spearman")] + [_loso(r.get("loso"), k) for k in ("accuracy", "mrr", "spearman")])  # fmt: skip
    head = ["system"] + [h for _, h in TASK3_COLUMNS] + ["CV accuracy", "CV MRR", "CV Spearman", "LOSO accuracy (worst)", "LOSO MRR (worst)", "LOSO Spearman (worst)"]
    out = ["**MEDIQA Task 3: every system under three protocols** (val: the 25 validation questions, swings ±0.1; CV: question-grouped "
           "5-fold over train+val, mean ± sd; LOSO: trained on two labelled sources, scored on the third, mean (worst source))", ""]
    out += _table(head, rows) + _final_line(final)
    cands = final.get("candidates") or {}
    if cands:
        rules = (final.get("selection") or {}).get("keep_rules") or list(next(iter(cands.values())))
        table = [[w, rule, _pm(c["cv"]["accuracy"]), _loso(c["loso"]), _fmt(c["score"])] for w, by_rule in cands.items() for rule, c in by_rule.items()
                 if rule == final.get("keep_rule") or float(w) == float(final.get("mtl_weight", -1))]  # fmt: skip
        table = [[f"**{r[0]}**", f"**{r[1]}**", *r[2:]] if float(r[0]) == float(final.get("mtl_weight", -1)) and r[1] == final.get("keep_rule") else r for r in table]
        out += ["**Decisions that transfer**: MTL weight (0 = the baseline alone, 1 = the MTL alone) × keep rule, each fitted on other "
                "folds' / other sources' held-out rows; rows: every rule at the chosen weight and every weight at the chosen rule; "
                "score = mean of CV accuracy and LOSO mean accuracy. Keep rules, simplest first (`medrank/decision.py` KEEP_RULES): "
                + ", ".join(f"`{r}`" for r in rules) + ".", ""]  # fmt: skip
        out += _table(["MTL weight", "keep rule", "CV accuracy", "LOSO accuracy (worst)", "score"], table)
    orders = final.get("orders") or {}
    if orders:
        table = [[f"**{o}**" if o == final.get("order") else o, _pm(c["cv"]["mrr"]), _pm(c["cv"]["spearman"]), _loso(c["loso"], "mrr"),
                  _loso(c["loso"], "spearman"), _fmt(c["score"])] for o, c in orders.items()]  # fmt: skip
        out += ["**Order of the kept answers** (the chosen weight and keep rule; `rank`: by the rank model, `prob_first`: the most "
                "probable kept answer first, then the rank model, `prob`: by probability; score = mean over CV and LOSO of "
                "(MRR + official Spearman) / 2)", ""]  # fmt: skip
        out += _table(["order", "CV MRR", "CV Spearman", "LOSO MRR (worst)", "LOSO Spearman (worst)", "score"], table)
    vs = final.get("vs_baseline")
    if vs and final.get("system") != "baseline":
        cell = lambda d: f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['p_better']:.0%} / {d['p_worse']:.0%})"  # noqa: E731
        rows = [[where] + [cell(vs[where][k]) for k in ("accuracy", "precision", "mrr", "spearman_true")] for where in ("val", "cv") if where in vs]
        out += [f"**Final system minus the baseline**, paired question bootstrap ({vs['resamples']} resamples of the questions, the same "
                "draw for both systems): observed difference [95% interval] (share of resamples where the final system is better / "
                "worse). val: the 25 validation questions; cv: the out-of-fold rows of all train+val questions", ""]
        out += _table(["questions", "Accuracy", "Precision", "MRR", "Spearman (true)"], rows)
    by_split, chars = final.get("cv_by_split"), final.get("question_chars_median") or {}
    if by_split:
        keys = ("accuracy", "precision", "mrr", "spearman", "spearman_true")
        rows = [[s, str(chars.get(s, "—"))] + [_fmt(m.get(k)) for k in keys] + [_fmt(by_split.get("baseline", {}).get(s, {}).get("accuracy"))]
                for s, m in by_split.get("final", {}).items()]  # fmt: skip
        rows += [[f"{s} (blind)", str(n)] + ["—"] * (len(keys) + 1) for s, n in chars.items() if s not in by_split.get("final", {})]
        out += ["**CV by question set** (the final system's out-of-fold rows, split by where the questions come from; the median "
                "question length is read from the unlabelled question text, test included: compare the test questions' style "
                "with each labelled set's)", ""]
        out += _table(["questions", "median question chars", "Accuracy", "Precision", "MRR", "Spearman (official)", "Spearman (true)",
                       "baseline Accuracy"], rows)  # fmt: skip
    return out


def _nested(m: dict) -> list[str]:
    """The final system's selection procedure under nested LOSO: per held-out source its pick and scores, the plain
    (selection-time) LOSO beside it, and each keep rule alone (weight and order still chosen inside)."""
    fs = (m or {}).get("final_system")
    if not fs:
        return []
    n, plain = fs["nested_loso"], fs["plain_loso"]
    keys = [k for k, _ in TASK3_COLUMNS if k in n]
    rows = [[f"held out: {src}", f"`{'baseline' if r['chosen']['mtl_weight'] == 0 else 'mtl' if r['chosen']['mtl_weight'] == 1 else 'ensemble'}` "
             f"w {r['chosen']['mtl_weight']:g}, `{r['chosen']['keep_rule']}`, `{r['chosen']['order']}`"] + [_fmt(r["scores"][k]) for k in keys]
            for src, r in n["by_source"].items()]  # fmt: skip
    rows.append(["**nested LOSO: mean (worst)**", ""] + [f"**{n[k]['mean']:.3f}** ({n[k]['worst']:.3f})" for k in keys])
    rows.append(["plain LOSO (selection-time): mean (worst)", "the final system"] + [f"{plain[k]['mean']:.3f} ({plain[k]['worst']:.3f})" for k in keys])
    out = ["**Nested leave-one-source-out** (" + ANALYSIS_NOTE + "; stage `nested_loso`): for each labelled source, the baseline and "
           "the MTL are refitted on the other two sources (question-grouped CV over them and leave-one-of-the-two-out), the written rule "
           "picks MTL weight × keep rule, then the order, on those rows only, and the held-out source is scored by the models trained "
           "on both other sources with that pick. Recipes fixed at the defaults: baseline features "
           + ", ".join(f"`{g}`" for g in m["recipes"]["baseline_features"]) + "; MTL feature groups "
           + ", ".join(f"`{g}`" for g in m["recipes"]["mtl_feature_groups"]) + ".", ""]  # fmt: skip
    out += _table(["", "pick (made without the held-out source)"] + [h for k, h in TASK3_COLUMNS if k in keys], rows)
    variants = m.get("variants") or {}
    if variants:
        rows = [["default", ", ".join(m["recipes"]["baseline_features"]), ", ".join(m["recipes"]["mtl_feature_groups"])]
                + [_loso(n, k) for k in ("accuracy", "mrr", "spearman")] + ["—"]]  # fmt: skip
        rows += [[name, ", ".join(v["baseline_features"]), ", ".join(v["mtl_feature_groups"])] + [_loso(v["nested_loso"], k) for k in ("accuracy", "mrr", "spearman")]
                 + [f"{v['vs_default']['accuracy']:+.3f} / {v['vs_default']['mrr']:+.3f}"] for name, v in variants.items()]  # fmt: skip
        out += ["**Rows beside the default under nested LOSO** (`analysis.nested.variants`: other feature groups for both systems, "
                "the same protocol; a row beats the default only beyond the noise band)", ""]  # fmt: skip
        out += _table(["row", "baseline features", "MTL feature groups", "Accuracy", "MRR", "Spearman (official)", "vs default (accuracy / MRR)"], rows)
    rules = n.get("by_keep_rule") or {}
    if rules:
        rows = [[f"`{r}`", _loso(v), _loso(v, "precision"), _loso(v, "mrr"), _loso(v, "spearman")] for r, v in rules.items()]
        kp = m.get("keep_rule_pick") or {}
        verdict = (f" The written rule on these figures ({kp.get('on')}) picks `{kp['rule']}`; `score.keep_rules` holds "
                   + ", ".join(f"`{r}`" for r in kp.get("score_keep_rules", [])) + ".") if kp.get("rule") else ""  # fmt: skip
        out += ["**Keep rules under an unknown prior** (nested LOSO, each rule the only one the written rule may pick; weight and "
                "order still chosen inside; mean over the three held-out sources (worst source)). A question with nothing kept "
                "scores 0 on the official MRR: `min_keep_1` and `top_k` always keep each question's best answer." + verdict, ""]  # fmt: skip
        out += _table(["keep rule", "Accuracy", "Precision", "MRR", "Spearman (official)"], rows)
    return out


def _task2(m: dict) -> list[str]:
    """Task 2 decisions within a CHQ: every rule's CHQ-grouped CV accuracy and predicted-positive rates."""
    if not (m or {}).get("rules"):
        return []
    rows = [[f"**{r}**" if r == m["chosen"] else r, v["description"], _acc(v), _fmt(v["val_positive_rate"]), _fmt(v.get("test_positive_rate"))]
            for r, v in m["rules"].items()]  # fmt: skip
    out = [f"**Task 2 decisions within a CHQ** (stage `task2`): finetune_rqe's out-of-fold P(entailed) of the {m['n_val_pairs']} "
           f"validation pairs ({m['n_val_chqs']} CHQs), decided per CHQ; each rule's floor / margin fitted on the other folds; the best "
           f"CV accuracy wins ({m['selection_rule']}). Nested CV of that choice (made on the other folds only): "
           f"{_acc(m['nested_cv'])}. True positive rate on validation: {_fmt(m['val_true_positive_rate'])}; the test set "
           f"({m['n_test_pairs']} pairs, {m['n_test_chqs']} CHQs) is unlabelled: only its predicted rate is shown.", ""]  # fmt: skip
    return out + _table(["rule", "what", "CV accuracy", "predicted positive (val, out-of-fold)", "predicted positive (test)"], rows)


ANALYSIS_NOTE = ("from analysis/dvc.yaml, which `dvc repro` / `dvc exp run` leave alone: `dvc repro analysis/dvc.yaml` refreshes it, "
                 "`dvc status analysis/dvc.yaml` says whether it is current")


def _baseline(m: dict, ab: dict, band: dict) -> list[str]:
    out = []
    t1 = ab.get("table1_ablation") or {}
    if t1:
        best = _rule_pick(t1, (band.get("baseline") or {}).get("accuracy", 0.0))
        rows = [[("**" + name.replace("+", " + ") + "** (rule's pick)") if name == best else name.replace("+", " + "), _pm(r["cv"]["accuracy"]),
                 _loso(r.get("loso")), _fmt(r.get("selection_score")), _pm(r["cv"]["precision"]), _pm(r["cv"]["spearman_true"]),
                 _fmt(r["val"]["accuracy"]), _fmt(r["val"]["precision"]), _fmt(r["val"]["spearman"])] for name, r in t1.items()]  # fmt: skip
        default = "+".join(ab.get("default_features") or [])
        agree = "is the rule's pick" if default == best else f"is not the rule's pick ({best.replace('+', ' + ') if best else '—'})"
        out += ["**Baseline feature ablation** (paper Tables 1-2: LR filter + rank SVM; score = mean of CV accuracy and LOSO mean accuracy; "
                f"the rule's pick: the fewest groups within the baseline's seed spread of the best score; {ANALYSIS_NOTE}). "
                f"The default `baseline.features` ({default.replace('+', ' + ')}) {agree}.", ""]
        out += _table(["features", "CV accuracy", "LOSO accuracy (worst)", "score", "CV precision", "CV Spearman (true)", "val accuracy",
                       "val precision", "val Spearman"], rows)  # fmt: skip
    t4 = ab.get("table4_ranking") or {}
    if t4:
        rows = [[name.replace("+", " + ")] + [x for k in ("lr_filter_score", "rank_svm") for x in (_pm(r[k]["cv_spearman_true"]), _loso_cell(r[k]))]
                for name, r in t4.items()]  # fmt: skip
        out += ["**Ranking: LR filter score vs rank SVM** (paper Table 4; Spearman covers the answers each row's own filter "
                "keeps, so compare the two rankers within a row, not rows with each other)", ""]
        out += _table(["features", "LR: CV Spearman (true)", "LR: LOSO Spearman (worst)", "rank SVM: CV Spearman (true)", "rank SVM: LOSO Spearman (worst)"], rows)
    return out


def _rule_pick(rows: dict, band: float) -> str | None:
    """The written rule over feature rows: the fewest groups among rows within `band` of the best selection score."""
    scored = {n: r["selection_score"] for n, r in rows.items() if r.get("selection_score") is not None}
    if not scored:
        return None
    best = max(scored.values())
    return min((n for n, v in scored.items() if v >= best - band - 1e-12), key=lambda n: (len(rows[n].get("groups") or n.split("+")), -scored[n]))


def _loso_cell(r: dict) -> str:
    """Table 4's LOSO Spearman cell (mean and worst source of the official Spearman)."""
    return _loso({"spearman": r.get("loso_spearman")}, "spearman")


def _mtl(m: dict, ab: dict) -> list[str]:
    """The MTL's CV beside its ablation rows (each row: its overrides of params.yaml `mtl`)."""
    if not ab.get("rows") or not m.get("cv"):
        return []
    rows = []
    for name, cv in {"default (params.yaml `mtl`)": m["cv"], **ab["rows"]}.items():
        change = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in (cv.get("overrides") or {}).items()) or "—"
        loso = m.get("loso") if cv is m["cv"] else cv.get("loso")
        rows.append([name, change] + [_pm(cv.get(k)) for k in ("accuracy", "precision", "mrr", "spearman_true")] + [_loso(loso), _loso(loso, "mrr")])
    out = ["**Multi-task model: what each part adds** (question-grouped 5-fold CV over train+val, the same folds for every row, and "
           "LOSO; CV MRR is low because some training questions have no valid answer: their MRR is 0 whatever the ranking; the rows "
           f"are {ANALYSIS_NOTE}; the default's row is the mtl stage's)", ""]
    return out + _table(["row", "change from the default", "CV accuracy", "CV precision", "CV MRR", "CV Spearman (true)", "LOSO accuracy (worst)",
                         "LOSO MRR (worst)"], rows)  # fmt: skip


def _mtl_confirm(m: dict) -> list[str]:
    """analysis/dvc.yaml mtl_confirm: the default and the named rows under several seeds, paired by seed."""
    if not m.get("rows"):
        return []
    rows = []
    for name, r in m["rows"].items():
        change = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in (r.get("overrides") or {}).items()) or "—"
        diff = "—" if name == "default" else f"{r['diff_mean']:+.4f} ± {r['diff_sd']:.4f}"
        verdict = "—" if name == "default" else ("**win**" if r["win"] else "within the noise")
        rows.append([name, change, " ".join(f"{v:.3f}" for v in r["scores"]), f"{r['mean']:.4f}", diff, verdict])
    out = [f"**MTL rows confirmed over {len(m['seeds'])} seeds** (seeds {', '.join(map(str, m['seeds']))}: folds and initialisation, the same for "
           f"every row of a seed; score = {m['score']}; band = the sd of the default's score over the seeds, {m['band']:.4f}: a row wins "
           f"only if its mean paired difference exceeds it; {ANALYSIS_NOTE})", ""]  # fmt: skip
    return out + _table(["row", "change from the default", "score per seed", "mean", "paired difference (mean ± sd)", "verdict"], rows)


def _retrieve(m: dict) -> list[str]:
    cov = (m.get("coverage") or {}).get("all")
    if not cov:
        return []
    rows = [[t, f"{c['covered']} / {c['questions']}", _fmt(c["fraction"])] for t, c in cov.items()]
    out = [f"**Questions with an entailed MedQuAD question** (paper Table 3; RQE over the BM25 top {m.get('bm25_top_k')})", ""]
    out += _table(["threshold", "questions", "fraction"], rows)
    j = m.get("judged") or {}
    if j.get("by_rqe"):
        ks = sorted((k for k in j["by_rqe"] if k.startswith("recall@")), key=lambda k: int(k.split("@")[1]))  # JSON keys sort as text
        rows = [[name, _fmt(j[key]["mrr"])] + [_fmt(j[key][k]) for k in ks] for key, name in (("by_rqe", "RQE score"), ("by_bm25", "BM25"))]
        sel = j.get("selected") or {}
        out += [f"**Retrieval against the TREC 2017 LiveQA-Med judgments** ({j['questions_judged']} train_liveqa questions with a "
                f"MedQuAD answer graded ≥ {j['relevant_grade']}; BM25 top {m.get('bm25_top_k')} ordered by):", ""]  # fmt: skip
        out += _table(["order", "MRR"] + ks, rows)
        if sel:
            out += [f"Selected entailed questions (N = {m.get('n_candidates')}, T = {m.get('rqe_threshold')}): a relevant one for "
                    f"{_fmt(sel['hit_rate'])} of the questions, precision {_fmt(sel['precision'])}, MRR {_fmt(sel['mrr'])}.", ""]  # fmt: skip
        recipe = m.get("rqe_recipe") or {}
        if any("liveqa" in ((recipe.get(k) or {}).get("extras") or []) for k in ("cross_encoder", "bi_encoder")):
            out += ["Caveat: the RQE model was trained on the `liveqa` source, i.e. on these very questions and their summaries: "
                    "these numbers flatter it (the judgments themselves were never used for training).", ""]  # fmt: skip
    return out


def _finetune(metrics: dict[str, dict]) -> list[str]:
    out = []
    nli = metrics.get("finetune_nli")
    if nli:
        v = nli.get("val", {})
        row = ["NLI (SICK dev)", _fmt(v.get("accuracy")), _fmt(v.get("macro_f1")), str(nli.get("n_train_pairs")), str(nli.get("train_precision")),
               _fmt(nli.get("train_seconds"))]  # fmt: skip
        out += ["**NLI cross-encoder** (MiniLM-L6)", ""] + _table(["model", "accuracy", "macro F1", "train pairs", "train precision", "train seconds"], [row])
    return out + _rqe_rows(metrics.get("finetune_rqe", {}), metrics.get("rqe_selection", {}))


def _rqe_rows(m: dict, sel: dict) -> list[str]:
    """Every RQE row of rqe_selection side by side (else the rows finetune_rqe trains): CV over the Task 2 validation
    pairs, same-focus pairs, overlap buckets; and whether finetune.rqe trains the selection's choice."""
    trained = m
    m = sel if sel.get("rows") else m
    rows = m.get("rows")
    if not rows:
        return []
    buckets = list(next(iter(rows.values())).get("by_overlap", {}))
    table = []
    for name, r in rows.items():
        mark = f"**{name}** (chosen)" if name == m.get("chosen") else name
        table.append([mark, _acc(r), _fmt(r.get("auc")), _acc(r.get("same_focus"))]
                     + [_fmt(r["by_overlap"].get(b, {}).get("accuracy")) for b in buckets])  # fmt: skip
    sf = (next(iter(rows.values())).get("same_focus") or {}).get("n")
    out = [f"**Question entailment (Task 2)**: question-grouped {len(next(iter(rows.values()))['accuracy_folds'])}-fold CV over the "
           f"{m.get('n_val_pairs')} validation pairs ({m.get('n_val_questions')} CHQs; mean ± sd over folds). `a+b` = trained on "
           f"sources a and b, `> val` = then on the other folds' validation pairs; same-focus = the {sf} pairs whose FAQ names "
           "something the CHQ names; overlap = share of the FAQ's content words in the CHQ. Rule: "
           f"{m.get('selection_rule')}.", ""]  # fmt: skip
    if m is sel:
        from medrank.models.rqe import missing_from_default

        lacks = missing_from_default(sel.get("recipe") or {}, trained.get("trained") or {})
        held = f"lacks {lacks}" if lacks else "holds"
        out[-2] += (f" The rows are {ANALYSIS_NOTE}; `finetune.rqe` trains the chosen sets only: it {held} the choice, "
                    f"and its own pick is `{trained.get('chosen')}`.")  # fmt: skip
    out += _table(["row", "CV accuracy", "AUC", "same-focus accuracy"] + [f"overlap {b}" for b in buckets], table)
    for name, d in (m.get("vs") or {}).items():
        out += [f"Chosen − `{name}`, paired per fold: accuracy {_fmt(d.get('accuracy_diff'))} ± {_fmt(d.get('accuracy_diff_sd'))}, "
                f"same-focus {_fmt(d.get('same_focus_diff'))} ± {_fmt(d.get('same_focus_diff_sd'))}.", ""]  # fmt: skip
    return out


def _cnn(m: dict, crossenc: dict | None = None) -> list[str]:
    """The SQuAD tables of stage cnn_squad; the dev sample gets analysis stage cnn_crossenc's row (same questions)."""
    out = []
    extra = (crossenc or {}).get("dev_sample") or {}
    if extra.get("n_questions") not in (None, (m.get("dev_sample") or {}).get("n_questions")):
        extra = {}  # another sample (cnn.sample_questions changed since): `medrank report` flags the stale stage
    for part, title in (("dev", "all SQuAD dev questions"), ("dev_sample", "sample of SQuAD dev questions (every system)")):
        d = {**m.get(part, {}), **{k: v for k, v in extra.items() if k != "n_questions"}} if part == "dev_sample" and m.get(part) else m.get(part)
        if not d:
            continue
        systems = [k for k, v in d.items() if isinstance(v, dict)]
        rows = [[s, _fmt(d[s].get("mrr")), _fmt(d[s].get("map")), _fmt(d[s].get("precision@1"))] for s in systems]
        out += [f"**Answer-sentence selection, {title}** ({d.get('n_questions')} questions; ranx)", ""]
        out += _table(["system", "MRR", "MAP", "P@1"], rows)
    return out


def _nt_grid(m: dict) -> list[str]:
    """The N x T grid of the final system (analysis/nt_grid.py: one `dvc exp run` per cell) and the rule's pick."""
    cells = m.get("cells") or []
    if not cells:
        return []
    default = (m["default"]["n_candidates"], m["default"]["rqe_threshold"])
    def thr(v: float | None) -> str:
        return "none" if v is None else f"{v:g}"

    rows = []
    for c in cells:
        t = thr(c["rqe_threshold"])
        mark = " (default)" if (c["n_candidates"], c["rqe_threshold"]) == default else ""
        rows.append([f"{c['n_candidates']}{mark}", t, f"`{c['system']}` w {c['mtl_weight']:g}, `{c['keep_rule']}`, `{c['order']}`",
                     f"{c['cv']['accuracy']:.3f}", f"{c['loso']['accuracy']:.3f} ({c['loso_worst']['accuracy']:.3f} {c['loso_worst']['source']})",
                     f"**{c['score']:.3f}**", f"{c['cv']['mrr']:.3f} / {c['loso']['mrr']:.3f}", f"{c['cv']['spearman']:.3f} / {c['loso']['spearman']:.3f}",
                     f"{c['val']['accuracy']:.3f}", "—" if mark else f"{c['seconds']:.0f}"])  # fmt: skip
    pk = m["pick"]
    verdict = (f"the default N = {pk['n_candidates']}, T = {thr(pk['rqe_threshold'])} stays: the best cell (N = {pk['best']['n_candidates']}, "
               f"T = {thr(pk['best']['rqe_threshold'])}, score {pk['best']['score']:.3f}) is within the noise band {pk['band']:.3f} of it"
               if pk["default_kept"] else
               f"N = {pk['n_candidates']}, T = {thr(pk['rqe_threshold'])} (score {pk['best']['score']:.3f}) beats the default by more than the "
               f"noise band {pk['band']:.3f}")  # fmt: skip
    if c := m.get("confirm"):  # analysis/nt_grid.py --confirm: the best cell vs the default over seeds, paired
        r, d = c["rows"][c["name"]], c["rows"]["default"]
        verdict += (f". Confirmed over {len(c['seeds'])} seeds ({', '.join(map(str, c['seeds']))}; at commit {c['commit']}): the final system "
                    f"scores {' '.join(f'{x:.3f}' for x in r['scores'])} at {c['name']} vs {' '.join(f'{x:.3f}' for x in d['scores'])} at the "
                    f"default, paired difference {r['diff_mean']:+.4f} ± {r['diff_sd']:.4f} against the band {c['band']:.4f} (the default's "
                    f"seed sd): " + ("**a win beyond the noise**" if r["win"] else "within the noise, so the default stays"))  # fmt: skip
    out = [f"**N × T grid of the final system** (analysis/nt_grid.py at commit {m['commit']}, {m['date']}: one `dvc exp run -S n_candidates=N "
           "-S rqe_threshold=T` per cell, the score stage choosing the final system inside each; score = mean of CV accuracy and LOSO mean "
           f"accuracy). By the rule ({m['rule']}): {verdict}.", ""]  # fmt: skip
    return out + _table(["N", "T", "final system", "CV accuracy", "LOSO accuracy (worst)", "score", "MRR CV / LOSO", "Spearman CV / LOSO",
                         "val accuracy (25 q)", "experiment s"], rows)  # fmt: skip


def _options(m: dict) -> list[str]:
    """Model options beside the default (analysis/options.py: one `dvc exp run` per option), with their cost."""
    rows_in = m.get("rows") or {}
    if len(rows_in) < 2:
        return []
    base = rows_in["default"]
    rows = []
    for name, r in rows_in.items():
        sets = ", ".join(f"`{x}`" for x in r["set"]) or "—"
        stages = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["stage_seconds"].items(), key=lambda kv: -kv[1]))
        diff = "—" if name == "default" else f"{r['score'] - r.get('default_score', base['score']):+.3f}"
        bdiff = "" if name == "default" else f" ({r['baseline']['score'] - r.get('default_baseline_score', base['baseline']['score']):+.3f})"
        at = "" if name == "default" or r.get("commit", m["commit"]) == m["commit"] else f" (at {r['commit']})"
        rows.append([name + at, sets, f"`{r['system']}` w {r['mtl_weight']:g}", f"{r['cv']['accuracy']:.3f}",
                     f"{r['loso']['accuracy']:.3f} ({r['loso_worst']['accuracy']:.3f} {r['loso_worst']['source']})", f"**{r['score']:.3f}** ({diff})",
                     f"{r['baseline']['cv_accuracy']:.3f} / {r['baseline']['loso_accuracy']:.3f} / {r['baseline']['score']:.3f}{bdiff}",
                     _nested_cell(r.get("nested")), "—" if name == "default" else f"{r['seconds']:.0f} ({stages})"])  # fmt: skip
    out = [f"**Model options beside the default** (analysis/options.py at commit {m['commit']}, {m['date']}: one `dvc exp run -S ...` per option "
           "from the committed outputs, so its seconds are what it re-runs; an option measured at an earlier commit is compared with that "
           "commit's default; score = mean of CV accuracy and LOSO mean accuracy; an option "
           f"beats the default only beyond the noise band {base['noise_band']:.3f}; a larger model is measured here, adopted only by a "
           "decision written in the notes below)", ""]  # fmt: skip
    return out + _table(["option", "params", "final system", "CV accuracy", "LOSO accuracy (worst)", "score (vs default)",
                         "baseline CV / LOSO / score", "nested LOSO accuracy (worst) / MRR", "experiment s (stages)"], rows)  # fmt: skip


def _nested_cell(n: dict | None) -> str:
    """An options cell: the final system's nested LOSO accuracy (worst source) / MRR, or — where it was not run."""
    return "—" if not n else f"{n['accuracy']['mean']:.3f} ({n['accuracy']['worst']:.3f}) / {n['mrr']['mean']:.3f}"


def _judged_rows(m: dict) -> list[str]:
    """The judged LiveQA answers as baseline training rows (analysis/judged_rows.py), paired by seed against none."""
    runs = m.get("runs") or {}
    if not runs:
        return []
    rows = []
    for mode, rs in sorted(runs.items(), key=lambda kv: ("none", "ranker", "all").index(kv[0])):
        f, o = m["filter"]["modes"][mode], m["order"]["modes"][mode]

        def mean(part: str, key: str) -> str:
            return f"{sum(r[part][key] for r in rs) / len(rs):.3f}"

        def vs(d: dict) -> str:
            return "—" if mode == "none" else f"{d['diff_mean']:+.4f} ± {d['diff_sd']:.4f}" + (" **win**" if d["win"] else "")

        rows.append([f"`{mode}`", str(rs[0]["judged_training_rows"]), f"{mean('cv', 'accuracy')} / {mean('loso', 'accuracy')}",
                     f"{mean('cv', 'precision')} / {mean('loso', 'precision')}", f"{mean('cv', 'mrr')} / {mean('loso', 'mrr')}",
                     f"{mean('cv', 'spearman')} / {mean('loso', 'spearman')}", f"{f['mean']:.4f} ({vs(f)})", f"{o['mean']:.4f} ({vs(o)})"])  # fmt: skip
    out = [f"**Judged LiveQA answers as baseline training rows** (analysis/judged_rows.py at commit {m['commit']}, {m['date']}; "
           f"`baseline.judged_rows`, features {', '.join(m['features'])}; means over seeds {', '.join(map(str, m['seeds']))}, each mode paired by "
           "seed with `none`; a mode wins only beyond `none`'s seed sd: filter band "
           f"{m['filter']['band']:.4f}, order band {m['order']['band']:.4f}). `ranker`: the rank SVM also learns from their grades; `all`: the "
           "filter trains on them too.", ""]  # fmt: skip
    return out + _table(["judged_rows", "judged rows", "accuracy CV / LOSO", "precision CV / LOSO", "MRR CV / LOSO", "Spearman CV / LOSO",
                         "filter score (vs none)", "order score (vs none)"], rows)  # fmt: skip


def _qa_graded(m: dict) -> list[str]:
    """The qa cross-encoder after learning the judged LiveQA grades (analysis stage qa_graded), cross-fitted."""
    if not m.get("folds"):
        return []
    held = m["held_out_judged"]
    rows = [[f"held-out judged answers ({held['after']['n']}, grade 1-4)", _fmt(held["before"]["auc"]), _fmt(held["after"]["auc"]),
             f"{_fmt(held['before']['spearman_within_question'])} → {_fmt(held['after']['spearman_within_question'])}"]]  # fmt: skip
    for split, d in sorted(m.get("mediqa_auc", {}).items()):
        if d.get("qa_auc") is not None:
            rows.append([f"MEDIQA {split} answers (label)", _fmt(d["qa_auc"]), _fmt(d["qa_graded_auc"]), "—"])
    out = [f"**The QA cross-encoder on graded targets** (analysis stage `qa_graded`, `metrics/qa_graded.json`): models/qa fine-tuned on "
           f"the {m['n_judged']} judged LiveQA answers of {m['n_judged_questions']} train_liveqa questions (target `{m['target']}`), "
           f"cross-fitted over {len(m['folds'])} question folds: no question is scored by a model that learned its grades. AUC of "
           "grade ≥ 3 / the MEDIQA label, `qa` (before) vs `qa_graded` (after); the train_liveqa row's answers share their questions "
           "with the judged answers, the other splits' do not.", ""]  # fmt: skip
    return out + _table(["rows", "AUC qa", "AUC qa_graded", "Spearman with the grade within a question"], rows)


DETAILS = ("data", "normalize")  # metrics files shown in full (collapsed); the rest: `dvc metrics show`


def _qa_bienc(m: dict, bienc: dict | None = None) -> list[str]:
    """The fine-tuned question -> answer bi-encoder's cosines beside the zero-shot ones (and stage bienc's cosine, from
    metrics/bienc.json): AUC per labelled source."""
    auc = (m or {}).get("auc")
    if not auc:
        return []
    ref = ((bienc or {}).get("auc") or {}).get("bienc_cos")
    if ref:
        auc = {f"bienc_cos (stage bienc, {bienc.get('model')})": ref} | auc
    splits = [s for s in next(iter(auc.values())) if s != "pooled"] + ["pooled"]
    rows = [[name] + [_fmt(r.get(s)) for s in splits] for name, r in auc.items()]
    secs = m.get("seconds") or {}
    out = [f"**Question → answer bi-encoder** (stage `qa_bienc`, {ANALYSIS_NOTE}): step one learns {m.get('n_triplets')} MedQuAD "
           "(question, answer, same-focus other-type answer) triplets with in-batch negatives; step two, cross-fitted over "
           f"{len(m.get('folds') or [])} question folds, the labelled MEDIQA answers and judged LiveQA answers of the other folds' "
           f"questions (no question scored by a model that learned it). AUC of cos(question, answer) against the label, per labelled "
           f"source; {secs.get('total', '—')} s on this machine.", ""]  # fmt: skip
    return out + _table(["score"] + splits, rows)


def _gpu_bi_encoders(m: dict) -> list[str]:
    """mpnet against MiniLM-L6 in the fine-tuned bi-encoder roles, measured on a lent GPU (metrics/gpu_bi_encoders.json,
    written from benchmarks/gpu/run.sh's outputs): RQE rows and Task 2 rules, the QA bi-encoder under nested LOSO."""
    runs = (m or {}).get("runs")
    if not runs:
        return []

    def rqe_row(name: str, r: dict) -> list[str]:
        rows = r["rows"]
        best = lambda prefix: max((v["accuracy"] for k, v in rows.items() if k.startswith(prefix)), default=None)  # noqa: E731
        t2 = r["task2"]
        rule = t2["rules"][t2["chosen"]]
        return [name, _fmt(best("bi:")), _fmt(best("ce:")), _fmt(rows[r["chosen"]]["accuracy"]), f"`{t2['chosen']}` {_fmt(t2['cv']['accuracy'])}",
                _fmt(t2["nested_cv"]), _fmt(rule["test_positive_rate"]), f"{r['seconds'].get('selection', 0):.0f}"]  # fmt: skip

    out = [f"**mpnet in the fine-tuned bi-encoder roles, on a GPU** (`metrics/gpu_bi_encoders.json`, {m.get('device', '—')}; "
           f"{m.get('transfer', '')}). Stage finetune_rqe with all-mpnet-base-v2 as cross-encoder and bi-encoder base, beside "
           "MiniLM-L6 on the same GPU: CV accuracy over the 302 Task 2 validation pairs (grouped by CHQ), then stage task2's "
           "within-CHQ rules over each run's out-of-fold probabilities.", ""]  # fmt: skip
    out += _table(["base", "best bi-encoder row", "best cross-encoder row", "chosen row", "Task 2 rule (CV)", "nested CV", "test positive rate",
                   "selection s (GPU)"], [rqe_row(n.removeprefix("rqe_"), r) for n, r in runs.items() if n.startswith("rqe_")])  # fmt: skip
    qa_rows = []
    for name, r in runs.items():
        if not name.startswith("qa_"):
            continue
        nested = r.get("nested_loso_with_qa_bienc (CPU, stage nested_loso over these scores)") or r.get("nested_loso_with_qa_bienc") or {}
        cross = (r.get("auc") or {}).get("cross-fitted (qa_bienc_cos)") or {}
        acc = nested.get("accuracy") or {}
        qa_rows.append([name.removeprefix("qa_").replace("_cpu_committed", " (CPU, committed)"), _fmt(cross.get("pooled")),
                        f"{_fmt(acc.get('mean'))} ({_fmt(acc.get('worst'))})", _fmt((nested.get("mrr") or {}).get("mean"))])  # fmt: skip
    default = next((r.get("nested_loso_default (same run)") for r in runs.values() if r.get("nested_loso_default (same run)")), None)
    if default:
        qa_rows.append(["final system without qa_bienc", "—", f"{_fmt(default['accuracy']['mean'])} ({_fmt(default['accuracy']['worst'])})",
                        _fmt((default.get("mrr") or {}).get("mean"))])  # fmt: skip
    out += ["The question → answer bi-encoder (stage qa_bienc) on each base: its cross-fitted cosine's pooled AUC, and the nested "
            "LOSO of the final system's selection with feature group qa_bienc added (analysis.nested.variants `with_qa_bienc`).", ""]
    out += _table(["qa_bienc base", "AUC (pooled)", "nested LOSO accuracy mean (worst)", "nested LOSO MRR"], qa_rows)
    if m.get("not_run"):
        out += [f"Not run: {m['not_run']}.", ""]
    return out


def _metrics(metrics_dir: str | Path) -> dict[str, dict]:
    return {f.stem: _load(f) for f in sorted(Path(metrics_dir).glob("*.json"))}


def render_headline(metrics_dir: str | Path = "metrics") -> str:
    """Markdown for README: the final Task 3 system beside the baseline, CHiQA's order and the MEDIQA 2019 bar."""
    return "\n".join(_headline(_metrics(metrics_dir))).rstrip() + "\n"


def render_results(metrics_dir: str | Path = "metrics") -> str:
    """Markdown for RESULTS.md: every system on validation, bootstrap, CV by set and order, ablations, retrieval,
    cross-encoders, CNN, then the data and normalization metrics in full inside collapsed blocks."""
    metrics = _metrics(metrics_dir)
    lines = _task3(metrics)
    lines += _nested(metrics.get("nested_loso", {}))
    lines += _task2(metrics.get("task2", {}))
    lines += _baseline(metrics.get("baseline", {}), metrics.get("baseline_ablations", {}), metrics.get("noise_band", {}))
    lines += _mtl(metrics.get("mtl", {}), metrics.get("mtl_ablations", {}))
    lines += _mtl_confirm(metrics.get("mtl_confirm", {}))
    lines += _judged_rows(metrics.get("judged_rows", {}))
    lines += _qa_graded(metrics.get("qa_graded", {}))
    lines += _qa_bienc(metrics.get("qa_bienc", {}), metrics.get("bienc"))
    lines += _gpu_bi_encoders(metrics.get("gpu_bi_encoders", {}))
    lines += _retrieve(metrics.get("retrieve", {}))
    lines += _finetune(metrics)
    lines += _cnn(metrics.get("cnn_squad", {}), metrics.get("cnn_crossenc", {}))
    lines += _nt_grid(metrics.get("nt_grid", {}))
    lines += _options(metrics.get("options", {}))
    lines += ["Every metrics file in full: `dvc metrics show`; the data counts and normalization statistics:", ""]
    for name, m in metrics.items():
        if name not in DETAILS:
            continue
        flat = _flat(m)
        if not flat:
            continue
        lines += [f"<details><summary><code>{name}.json</code></summary>", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(flat.items())]
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_dag(repo: str | Path = ".") -> str:
    """`dvc dag --md` of the repo (the mermaid graph README shows)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dvc", "dag", "--md"], cwd=repo, capture_output=True, text=True)
    if r.returncode != 0:
        raise MedrankError(f"dvc dag --md failed in {repo}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout.rstrip() + "\n"


# Which generated blocks each document must hold (the DAG is rendered in the README's own repository).
README_BLOCKS = ("headline", "dag")
RESULTS_BLOCKS = ("results",)


def _render(block: str, doc: Path, metrics_dir: str | Path) -> str:
    if block == "dag":
        return render_dag(doc.resolve().parent)
    return {"headline": render_headline, "results": render_results}[block](metrics_dir)


def _refreshed(doc: Path, blocks: tuple[str, ...], metrics_dir: str | Path) -> tuple[str, str]:
    """(current text, text with every block in `blocks` re-rendered)."""
    if not doc.is_file():
        raise MedrankError(f"{doc}: not found (run from the repository root, or pass its path)")
    text = new = doc.read_text(encoding="utf-8")
    for block in blocks:
        start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
        if new.count(start) != 1 or new.count(end) != 1 or new.index(start) > new.index(end):
            raise MedrankError(f"{doc}: needs exactly one {start} ... {end} pair")
        head, rest = new.split(start, 1)
        tail = rest.split(end, 1)[1]
        new = f"{head}{start}\n{_render(block, doc, metrics_dir)}{end}{tail}"
    return text, new


def _pending(readme: str | Path, results: str | Path, metrics_dir: str | Path, cards: str | Path | None) -> list[tuple[Path, str | None]]:
    """(document, its re-rendered text) for each document whose generated text is out of date; (card, None) for a
    generated card whose artifact left dvc.yaml. Cards: `cards`, else docs/model_cards/ beside the README."""
    from medrank.model_cards import CARDS_DIR, pending_cards

    out: list[tuple[Path, str | None]] = []
    for doc, blocks in ((Path(readme), README_BLOCKS), (Path(results), RESULTS_BLOCKS)):
        text, new = _refreshed(doc, blocks, metrics_dir)
        if new != text:
            out.append((doc, new))
    repo = Path(readme).parent
    return out + pending_cards(repo, Path(cards) if cards else repo / CARDS_DIR, metrics_dir)


def stale_docs(readme: str | Path = "README.md", results: str | Path = "RESULTS.md", metrics_dir: str | Path = "metrics",
               cards: str | Path | None = None) -> list[Path]:  # fmt: skip
    """The documents whose generated text differs from metrics/ (or from dvc.yaml / dvc.lock: the DAG, the cards),
    missing cards included."""
    return [doc for doc, _ in _pending(readme, results, metrics_dir, cards)]


def update_docs(readme: str | Path = "README.md", results: str | Path = "RESULTS.md", metrics_dir: str | Path = "metrics",
                cards: str | Path | None = None) -> list[Path]:  # fmt: skip
    """Re-render README's headline and DAG blocks, RESULTS.md's results block and the model cards (a card whose
    artifact is gone is removed); returns the files that changed."""
    pending = _pending(readme, results, metrics_dir, cards)
    for doc, new in pending:
        if new is None:
            doc.unlink()
        else:
            write_text(doc, new)
    return [doc for doc, _ in pending]
