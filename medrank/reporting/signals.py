"""RESULTS sections on the signals and encoders: retrieval, fine-tuned cross-encoders, the CNN, N x T grid, options, candidate signals."""

from __future__ import annotations

from medrank.reporting.formatting import acc_text, fmt_num, md_table
from medrank.reporting.quality import ANALYSIS_NOTE


def retrieve_section(m: dict) -> list[str]:
    cov = (m.get("coverage") or {}).get("all")
    if not cov:
        return []
    rows = [[t, f"{c['covered']} / {c['questions']}", fmt_num(c["fraction"])] for t, c in cov.items()]
    out = [
        f"**Questions with an entailed MedQuAD question** (paper Table 3; RQE over the BM25 top {m.get('bm25_top_k')})",
        "",
    ]
    out += md_table(["threshold", "questions", "fraction"], rows)
    j = m.get("judged") or {}
    if j.get("by_rqe"):
        ks = sorted(
            (k for k in j["by_rqe"] if k.startswith("recall@")), key=lambda k: int(k.split("@")[1])
        )  # JSON keys sort as text
        rows = [
            [name, fmt_num(j[key]["mrr"])] + [fmt_num(j[key][k]) for k in ks]
            for key, name in (("by_rqe", "RQE score"), ("by_bm25", "BM25"))
        ]
        sel = j.get("selected") or {}
        out += [
            f"**Retrieval against the TREC 2017 LiveQA-Med judgments** ({j['questions_judged']} train_liveqa questions with a "
            f"MedQuAD answer graded ≥ {j['relevant_grade']}; BM25 top {m.get('bm25_top_k')} ordered by):",
            "",
        ]
        out += md_table(["order", "MRR"] + ks, rows)
        if sel:
            out += [
                f"Selected entailed questions (N = {m.get('n_candidates')}, T = {m.get('rqe_threshold')}): a relevant one for "
                f"{fmt_num(sel['hit_rate'])} of the questions, precision {fmt_num(sel['precision'])}, MRR {fmt_num(sel['mrr'])}.",
                "",
            ]
        recipe = m.get("rqe_recipe") or {}
        if any("liveqa" in ((recipe.get(k) or {}).get("extras") or []) for k in ("cross_encoder", "bi_encoder")):
            out += [
                "Caveat: the RQE model was trained on the `liveqa` source, i.e. on these very questions and their summaries: "
                "these numbers flatter it (the judgments themselves were never used for training).",
                "",
            ]
    return out


def finetune_section(metrics: dict[str, dict]) -> list[str]:
    out = []
    nli = metrics.get("finetune_nli")
    if nli:
        v = nli.get("val", {})
        row = [
            "NLI (SICK dev)",
            fmt_num(v.get("accuracy")),
            fmt_num(v.get("macro_f1")),
            str(nli.get("n_train_pairs")),
            str(nli.get("train_precision")),
        ]
        out += ["**NLI cross-encoder** (MiniLM-L6)", ""] + md_table(
            ["model", "accuracy", "macro F1", "train pairs", "train precision"], [row]
        )
    return out + rqe_rows_section(metrics.get("finetune_rqe", {}), metrics.get("rqe_selection", {}))


def rqe_rows_section(m: dict, sel: dict) -> list[str]:
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
        table.append(
            [mark, acc_text(r), fmt_num(r.get("auc")), acc_text(r.get("same_focus"))]
            + [fmt_num(r["by_overlap"].get(b, {}).get("accuracy")) for b in buckets]
        )
    sf = (next(iter(rows.values())).get("same_focus") or {}).get("n")
    out = [
        f"**Question entailment (Task 2)**: question-grouped {len(next(iter(rows.values()))['accuracy_folds'])}-fold CV over the "
        f"{m.get('n_val_pairs')} validation pairs ({m.get('n_val_questions')} CHQs; mean ± sd over folds). `a+b` = trained on "
        f"sources a and b, `> val` = then on the other folds' validation pairs; same-focus = the {sf} pairs whose FAQ names "
        "something the CHQ names; overlap = share of the FAQ's content words in the CHQ. Rule: "
        f"{m.get('selection_rule')}.",
        "",
    ]
    if m is sel:
        from medrank.models.rqe_choice import missing_from_default

        lacks = missing_from_default(sel.get("recipe") or {}, trained.get("trained") or {})
        held = f"lacks {lacks}" if lacks else "holds"
        out[-2] += (
            f" The rows are {ANALYSIS_NOTE}; `finetune.rqe` trains the chosen sets only: it {held} the choice, "
            f"and its own pick is `{trained.get('chosen')}`."
        )
    out += md_table(["row", "CV accuracy", "AUC", "same-focus accuracy"] + [f"overlap {b}" for b in buckets], table)
    for name, d in (m.get("vs") or {}).items():
        out += [
            f"Chosen − `{name}`, paired per fold: accuracy {fmt_num(d.get('accuracy_diff'))} ± {fmt_num(d.get('accuracy_diff_sd'))}, "
            f"same-focus {fmt_num(d.get('same_focus_diff'))} ± {fmt_num(d.get('same_focus_diff_sd'))}.",
            "",
        ]
    return out


def cnn_section(m: dict, crossenc: dict | None = None) -> list[str]:
    """The SQuAD tables of stage cnn_squad; the dev sample gets analysis stage cnn_crossenc's row (same questions)."""
    out = []
    extra = (crossenc or {}).get("dev_sample") or {}
    if extra.get("n_questions") not in (None, (m.get("dev_sample") or {}).get("n_questions")):
        extra = {}  # another sample (cnn.sample_questions changed since): `medrank report` flags the stale stage
    for part, title in (
        ("dev", "all SQuAD dev questions"),
        ("dev_sample", "sample of SQuAD dev questions (every system)"),
    ):
        d = (
            {**m.get(part, {}), **{k: v for k, v in extra.items() if k != "n_questions"}}
            if part == "dev_sample" and m.get(part)
            else m.get(part)
        )
        if not d:
            continue
        systems = [k for k, v in d.items() if isinstance(v, dict)]
        rows = [
            [s, fmt_num(d[s].get("mrr")), fmt_num(d[s].get("map")), fmt_num(d[s].get("precision@1"))] for s in systems
        ]
        out += [f"**Answer-sentence selection, {title}** ({d.get('n_questions')} questions; ranx)", ""]
        out += md_table(["system", "MRR", "MAP", "P@1"], rows)
    return out


def nt_grid_section(m: dict) -> list[str]:
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
        rows.append(
            [
                f"{c['n_candidates']}{mark}",
                t,
                f"`{c['system']}` w {c['mtl_weight']:g}, `{c['keep_rule']}`, `{c['order']}`",
                f"{c['cv']['accuracy']:.3f}",
                f"{c['loso']['accuracy']:.3f} ({c['loso_worst']['accuracy']:.3f} {c['loso_worst']['source']})",
                f"**{c['score']:.3f}**",
                f"{c['cv']['mrr']:.3f} / {c['loso']['mrr']:.3f}",
                f"{c['cv']['spearman']:.3f} / {c['loso']['spearman']:.3f}",
                f"{c['val']['accuracy']:.3f}",
                "—" if mark else f"{c['seconds']:.0f}",
            ]
        )
    pk = m["pick"]
    verdict = (
        f"the default N = {pk['n_candidates']}, T = {thr(pk['rqe_threshold'])} stays: the best cell (N = {pk['best']['n_candidates']}, "
        f"T = {thr(pk['best']['rqe_threshold'])}, score {pk['best']['score']:.3f}) is within the noise band {pk['band']:.3f} of it"
        if pk["default_kept"]
        else f"N = {pk['n_candidates']}, T = {thr(pk['rqe_threshold'])} (score {pk['best']['score']:.3f}) beats the default by more than the "
        f"noise band {pk['band']:.3f}"
    )
    if c := m.get("confirm"):  # analysis/nt_grid.py --confirm: the best cell vs the default over seeds, paired
        r, d = c["rows"][c["name"]], c["rows"]["default"]
        verdict += (
            f". Confirmed over {len(c['seeds'])} seeds ({', '.join(map(str, c['seeds']))}; at commit {c['commit']}): the final system "
            f"scores {' '.join(f'{x:.3f}' for x in r['scores'])} at {c['name']} vs {' '.join(f'{x:.3f}' for x in d['scores'])} at the "
            f"default, paired difference {r['diff_mean']:+.4f} ± {r['diff_sd']:.4f} against the band {c['band']:.4f} (the default's "
            f"seed sd): " + ("**a win beyond the noise**" if r["win"] else "within the noise, so the default stays")
        )
    out = [
        f"**N × T grid of the final system** (analysis/nt_grid.py at commit {m['commit']}, {m['date']}: one `dvc exp run -S n_candidates=N "
        "-S rqe_threshold=T` per cell, the score stage choosing the final system inside each; score = mean of CV accuracy and LOSO mean "
        f"accuracy). By the rule ({m['rule']}): {verdict}.",
        "",
    ]
    return out + md_table(
        [
            "N",
            "T",
            "final system",
            "CV accuracy",
            "LOSO accuracy (worst)",
            "score",
            "MRR CV / LOSO",
            "Spearman CV / LOSO",
            "val accuracy (25 q)",
            "experiment s",
        ],
        rows,
    )


def options_section(m: dict) -> list[str]:
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
        bdiff = (
            ""
            if name == "default"
            else f" ({r['baseline']['score'] - r.get('default_baseline_score', base['baseline']['score']):+.3f})"
        )
        at = "" if name == "default" or r.get("commit", m["commit"]) == m["commit"] else f" (at {r['commit']})"
        rows.append(
            [
                name + at,
                sets,
                f"`{r['system']}` w {r['mtl_weight']:g}",
                f"{r['cv']['accuracy']:.3f}",
                f"{r['loso']['accuracy']:.3f} ({r['loso_worst']['accuracy']:.3f} {r['loso_worst']['source']})",
                f"**{r['score']:.3f}** ({diff})",
                f"{r['baseline']['cv_accuracy']:.3f} / {r['baseline']['loso_accuracy']:.3f} / {r['baseline']['score']:.3f}{bdiff}",
                _nested_cell(r.get("nested")),
                "—" if name == "default" else f"{r['seconds']:.0f} ({stages})",
            ]
        )
    out = [
        f"**Model options beside the default** (analysis/options.py at commit {m['commit']}, {m['date']}: one `dvc exp run -S ...` per option "
        "from the committed outputs, so its seconds are what it re-runs; an option measured at an earlier commit is compared with that "
        "commit's default; score = mean of CV accuracy and LOSO mean accuracy; an option "
        f"beats the default only beyond the noise band {base['noise_band']:.3f}; a larger model is measured here, adopted only by a "
        "decision written in the notes below)",
        "",
    ]
    return out + md_table(
        [
            "option",
            "params",
            "final system",
            "CV accuracy",
            "LOSO accuracy (worst)",
            "score (vs default)",
            "baseline CV / LOSO / score",
            "nested LOSO accuracy (worst) / MRR",
            "experiment s (stages)",
        ],
        rows,
    )


def _nested_cell(n: dict | None) -> str:
    """An options cell: the final system's nested LOSO accuracy (worst source) / MRR, or — where it was not run."""
    return "—" if not n else f"{n['accuracy']['mean']:.3f} ({n['accuracy']['worst']:.3f}) / {n['mrr']['mean']:.3f}"


def judged_rows_section(m: dict) -> list[str]:
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
            return (
                "—"
                if mode == "none"
                else f"{d['diff_mean']:+.4f} ± {d['diff_sd']:.4f}" + (" **win**" if d["win"] else "")
            )

        rows.append(
            [
                f"`{mode}`",
                str(rs[0]["judged_training_rows"]),
                f"{mean('cv', 'accuracy')} / {mean('loso', 'accuracy')}",
                f"{mean('cv', 'precision')} / {mean('loso', 'precision')}",
                f"{mean('cv', 'mrr')} / {mean('loso', 'mrr')}",
                f"{mean('cv', 'spearman')} / {mean('loso', 'spearman')}",
                f"{f['mean']:.4f} ({vs(f)})",
                f"{o['mean']:.4f} ({vs(o)})",
            ]
        )
    out = [
        f"**Judged LiveQA answers as baseline training rows** (analysis/judged_rows.py at commit {m['commit']}, {m['date']}; "
        f"`baseline.judged_rows`, features {', '.join(m['features'])}; means over seeds {', '.join(map(str, m['seeds']))}, each mode paired by "
        "seed with `none`; a mode wins only beyond `none`'s seed sd: filter band "
        f"{m['filter']['band']:.4f}, order band {m['order']['band']:.4f}). `ranker`: the rank SVM also learns from their grades; `all`: the "
        "filter trains on them too.",
        "",
    ]
    return out + md_table(
        [
            "judged_rows",
            "judged rows",
            "accuracy CV / LOSO",
            "precision CV / LOSO",
            "MRR CV / LOSO",
            "Spearman CV / LOSO",
            "filter score (vs none)",
            "order score (vs none)",
        ],
        rows,
    )


def qa_graded_section(m: dict) -> list[str]:
    """The qa cross-encoder after learning the judged LiveQA grades (analysis stage qa_graded), cross-fitted."""
    if not m.get("folds"):
        return []
    held = m["held_out_judged"]
    rows = [
        [
            f"held-out judged answers ({held['after']['n']}, grade 1-4)",
            fmt_num(held["before"]["auc"]),
            fmt_num(held["after"]["auc"]),
            f"{fmt_num(held['before']['spearman_within_question'])} → {fmt_num(held['after']['spearman_within_question'])}",
        ]
    ]
    for split, d in sorted(m.get("mediqa_auc", {}).items()):
        if d.get("qa_auc") is not None:
            rows.append([f"MEDIQA {split} answers (label)", fmt_num(d["qa_auc"]), fmt_num(d["qa_graded_auc"]), "—"])
    out = [
        f"**The QA cross-encoder on graded targets** (analysis stage `qa_graded`, `metrics/qa_graded.json`): models/qa fine-tuned on "
        f"the {m['n_judged']} judged LiveQA answers of {m['n_judged_questions']} train_liveqa questions (target `{m['target']}`), "
        f"cross-fitted over {len(m['folds'])} question folds: no question is scored by a model that learned its grades. AUC of "
        "grade ≥ 3 / the MEDIQA label, `qa` (before) vs `qa_graded` (after); the train_liveqa row's answers share their questions "
        "with the judged answers, the other splits' do not.",
        "",
    ]
    return out + md_table(["rows", "AUC qa", "AUC qa_graded", "Spearman with the grade within a question"], rows)


def qa_bienc_section(m: dict, bienc: dict | None = None) -> list[str]:
    """The fine-tuned question -> answer bi-encoder's cosines beside the zero-shot ones (and stage bienc's cosine, from
    metrics/bienc.json): AUC per labelled source."""
    auc = (m or {}).get("auc")
    if not auc:
        return []
    ref = ((bienc or {}).get("auc") or {}).get("bienc_cos")
    if ref:
        auc = {f"bienc_cos (stage bienc, {bienc.get('model')})": ref} | auc
    splits = [s for s in next(iter(auc.values())) if s != "pooled"] + ["pooled"]
    rows = [[name] + [fmt_num(r.get(s)) for s in splits] for name, r in auc.items()]
    out = [
        f"**Question → answer bi-encoder** (stage `qa_bienc`, {ANALYSIS_NOTE}): step one learns {m.get('n_triplets')} MedQuAD "
        "(question, answer, same-focus other-type answer) triplets with in-batch negatives; step two, cross-fitted over "
        f"{len(m.get('folds') or [])} question folds, the labelled MEDIQA answers and judged LiveQA answers of the other folds' "
        f"questions (no question scored by a model that learned it). AUC of cos(question, answer) against the label, per labelled "
        "source (its seconds: the timings table).",
        "",
    ]
    return out + md_table(["score"] + splits, rows)


def passages_section(m: dict) -> list[str]:
    """Group passage (metrics/passages.json): the best window's cosine beside stage bienc's, AUC per labelled source."""
    auc = (m or {}).get("auc")
    if not auc:
        return []
    splits = [s for s in next(iter(auc.values())) if s != "pooled"] + ["pooled"]
    rows = [[name] + [fmt_num(r.get(s)) for s in splits] for name, r in auc.items()]
    out = [
        f"**Group passage** (stage `passages`, `metrics/passages.json`, {m.get('model')}): each answer's sentences packed "
        f"into windows, {m.get('windows')} in all over {m.get('answers')} answers ({m.get('answers_read_past_the_first_window')} "
        "read past the first window); `passage_max_cos` = the best window's cosine with the question, beside the cosine of "
        "the answer's first `max_length` tokens (`encoders.zero_shot`). AUC against the label per labelled source.",
        "",
    ]
    return out + md_table(["score"] + splits, rows)


def gpu_bi_encoders_section(m: dict) -> list[str]:
    """mpnet against MiniLM-L6 in the fine-tuned bi-encoder roles, measured on a lent GPU (metrics/gpu_bi_encoders.json,
    written from benchmarks/gpu/run.sh's outputs): RQE rows and Task 2 rules, the QA bi-encoder under nested LOSO."""
    runs = (m or {}).get("runs")
    if not runs:
        return []

    def rqe_row(name: str, r: dict) -> list[str]:
        rows = r["rows"]
        best = lambda prefix: max((v["accuracy"] for k, v in rows.items() if k.startswith(prefix)), default=None)
        t2 = r["task2"]
        rule = t2["rules"][t2["chosen"]]
        return [
            name,
            fmt_num(best("bi:")),
            fmt_num(best("ce:")),
            fmt_num(rows[r["chosen"]]["accuracy"]),
            f"`{t2['chosen']}` {fmt_num(t2['cv']['accuracy'])}",
            fmt_num(t2["nested_cv"]),
            fmt_num(rule["test_positive_rate"]),
            f"{r['seconds'].get('selection', 0):.0f}",
        ]

    out = [
        f"**mpnet in the fine-tuned bi-encoder roles, on a GPU** (`metrics/gpu_bi_encoders.json`, {m.get('device', '—')}; "
        f"{m.get('transfer', '')}). Stage finetune_rqe with all-mpnet-base-v2 as cross-encoder and bi-encoder base, beside "
        "MiniLM-L6 on the same GPU: CV accuracy over the 302 Task 2 validation pairs (grouped by CHQ), then stage task2's "
        "within-CHQ rules over each run's out-of-fold probabilities.",
        "",
    ]
    out += md_table(
        [
            "base",
            "best bi-encoder row",
            "best cross-encoder row",
            "chosen row",
            "Task 2 rule (CV)",
            "nested CV",
            "test positive rate",
            "selection s (GPU)",
        ],
        [rqe_row(n.removeprefix("rqe_"), r) for n, r in runs.items() if n.startswith("rqe_")],
    )
    qa_rows = []
    for name, r in runs.items():
        if not name.startswith("qa_"):
            continue
        nested = (
            r.get("nested_loso_with_qa_bienc (CPU, stage nested_loso over these scores)")
            or r.get("nested_loso_with_qa_bienc")
            or {}
        )
        cross = (r.get("auc") or {}).get("cross-fitted (qa_bienc_cos)") or {}
        acc = nested.get("accuracy") or {}
        qa_rows.append(
            [
                name.removeprefix("qa_").replace("_cpu_committed", " (CPU, committed)"),
                fmt_num(cross.get("pooled")),
                f"{fmt_num(acc.get('mean'))} ({fmt_num(acc.get('worst'))})",
                fmt_num((nested.get("mrr") or {}).get("mean")),
            ]
        )
    default = next(
        (r.get("nested_loso_default (same run)") for r in runs.values() if r.get("nested_loso_default (same run)")),
        None,
    )
    if default:
        qa_rows.append(
            [
                "final system without qa_bienc",
                "—",
                f"{fmt_num(default['accuracy']['mean'])} ({fmt_num(default['accuracy']['worst'])})",
                fmt_num((default.get("mrr") or {}).get("mean")),
            ]
        )
    out += [
        "The question → answer bi-encoder (stage qa_bienc) on each base: its cross-fitted cosine's pooled AUC, and the nested "
        "LOSO of the final system's selection with feature group qa_bienc added (analysis.nested.variants `with_qa_bienc`).",
        "",
    ]
    out += md_table(["qa_bienc base", "AUC (pooled)", "nested LOSO accuracy mean (worst)", "nested LOSO MRR"], qa_rows)
    if m.get("not_run"):
        out += [f"Not run: {m['not_run']}.", ""]
    return out
