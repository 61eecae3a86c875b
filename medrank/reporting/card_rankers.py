"""Model-card sections of the rankers: the MTL (and the final system it feeds) and the CNN."""

from __future__ import annotations

import json
from typing import Any

from medrank.reporting.card_base import (
    Card,
    MISSING,
    NOT_MEASURED,
    Repo,
    code_text,
    cv_text,
    dataset_lines,
    dig,
    lo_text,
    val_text,
)
from medrank.reporting.formatting import TASK3_COLUMNS, fmt_num, md_table
from medrank.reporting.headline import final_line
from medrank.reporting.quality import mtl_section
from medrank.reporting.signals import cnn_section


def _protocols(m: dict, n_val: Any, val_model: str) -> list[str]:
    """Task 3 numbers under the three protocols: validation, question-grouped CV, LOSO (mean (worst source))."""
    val, cv, loso = m.get("val") or {}, m.get("cv") or {}, m.get("loso") or {}
    rows = [
        [f"validation: {val_text(n_val)} questions, {val_model}"] + [val_text(val.get(k)) for k, _ in TASK3_COLUMNS],
        ["CV: question-grouped folds over train+val (mean ± sd)"] + [cv_text(cv.get(k)) for k, _ in TASK3_COLUMNS],
        ["LOSO: trained on two labelled sources, scored on the third (mean (worst source))"]
        + [lo_text(loso, k) for k, _ in TASK3_COLUMNS],
    ]
    out = md_table(["protocol"] + [h for _, h in TASK3_COLUMNS], rows)
    by_source = loso.get("by_source") or {}
    if by_source:
        out += ["LOSO per held-out source:", ""]
        rows = [[s] + [val_text(r.get(k)) for k, _ in TASK3_COLUMNS] for s, r in by_source.items()]
        out += md_table(["held-out source"] + [h for _, h in TASK3_COLUMNS], rows)
    return out


def _groups(name: str, row: dict) -> frozenset:
    return frozenset(row.get("groups") or name.split("+"))


def downstream_rows(repo: Repo, groups: tuple[str, ...], mtl_parts: dict[str, Any]) -> list[str]:
    """Task 3 rows with and without this model's features: baseline feature rows that differ by some of `groups`,
    and the MTL default beside its ablation rows that add / drop them or set `mtl_parts` (the part that reads it)."""
    head = ["system", "features / change", "CV accuracy", "CV Spearman (true)", "LOSO accuracy (worst)"]
    rows = []
    t1 = dig(repo.metrics, "baseline_ablations", "table1_ablation") or {}
    cells = lambda x: [
        cv_text(dig(x, "cv", "accuracy")),
        cv_text(dig(x, "cv", "spearman_true")),
        lo_text(x.get("loso")),
    ]
    for name, r in t1.items():
        for other, o in t1.items():
            g, og = _groups(name, r), _groups(other, o)
            if og < g and g - og <= set(groups):
                base = " + ".join(og_name for og_name in (o.get("groups") or other.split("+")))
                added = " + ".join(x for x in (r.get("groups") or name.split("+")) if x not in og)
                rows += [["baseline", base] + cells(o), ["baseline", f"{base} **+ {added}**"] + cells(r)]
    mtl = repo.metrics.get("mtl") or {}
    default = set(repo.value("mtl.feature_groups", "mtl") or [])
    picked = {}
    for name, r in (dig(repo.metrics, "mtl_ablations", "rows") or {}).items():
        over = r.get("overrides") or {}
        changed = default ^ set(over.get("feature_groups", default))
        if any(over.get(k, MISSING) == v for k, v in mtl_parts.items()) or (
            changed and changed <= set(groups) and len(over) == 1
        ):
            picked[name] = r
    if picked and mtl.get("cv"):
        groups_now = json.dumps(repo.value("mtl.feature_groups", "mtl"))
        rows.append(
            [
                "MTL",
                f"default (`feature_groups: {groups_now}`)",
                cv_text(dig(mtl, "cv", "accuracy")),
                cv_text(dig(mtl, "cv", "spearman_true")),
                lo_text(mtl.get("loso")),
            ]
        )
        for name, r in picked.items():
            change = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in (r.get("overrides") or {}).items())
            rows.append(
                [
                    "MTL",
                    f"{name}: {change}",
                    cv_text(r.get("accuracy")),
                    cv_text(r.get("spearman_true")),
                    lo_text(r.get("loso")),
                ]
            )
    uses = [
        f"`{g}` in the baseline's features: {'yes' if g in (repo.value('baseline.features', 'baseline') or []) else 'no'}, "
        f"in the MTL's: {'yes' if g in default else 'no'}"
        for g in groups
    ]
    uses += [f"MTL `{k}`: {code_text(repo.value(f'mtl.{k}', 'mtl'))}" for k in mtl_parts]
    out = [f"**Downstream (MEDIQA Task 3)**: feature group {'; '.join(uses)}.", ""]
    if not rows:
        return out + [f"Rows with and without this model's features: {NOT_MEASURED}.", ""]
    out += [
        "Rows with and without this model's features (same folds; `metrics/baseline_ablations.json` feature rows, "
        "`metrics/mtl_ablations.json` rows beside `metrics/mtl.json`'s default; analysis/dvc.yaml):",
        "",
    ]
    return out + md_table(head, list(dict.fromkeys(map(tuple, rows))))  # type: ignore[arg-type]


def _nested_line(repo: Repo) -> list[str]:
    """The final system's headline estimate for new questions: its selection procedure under nested LOSO."""
    fs = dig(repo.metrics, "nested_loso", "final_system") or {}
    n, over = fs.get("nested_loso"), fs.get("overstatement")
    if not n:
        return [f"Nested LOSO of the final system's selection (stage `nested_loso`): {NOT_MEASURED}.", ""]
    return [
        f"**Headline estimate for new questions** (`metrics/nested_loso.json`: the whole selection re-made on two labelled "
        f"sources, the third scored; mean (worst source)): accuracy {lo_text(n)}, precision {lo_text(n, 'precision')}, MRR {lo_text(n, 'mrr')}, "
        f"official Spearman {lo_text(n, 'spearman')}; plain LOSO minus nested accuracy {over['accuracy']['mean']:+.3f}.",
        "",
    ]


def mtl_card(repo: Repo, art: dict) -> Card:
    m, final = repo.metrics.get("mtl") or {}, repo.metrics.get("task3_val") or {}
    nli_fp, rqe_fp = (
        dig(repo.metrics, "finetune_nli", "model_fingerprint"),
        dig(repo.metrics, "finetune_rqe", "model_fingerprint"),
    )

    def fed(fp: Any, model_fp: Any, name: str) -> str:
        if not fp:
            return NOT_MEASURED
        same = (
            ""
            if not model_fp
            else (f" (= {name}'s)" if fp == model_fp else f" (≠ {name}'s `{model_fp}`: re-run the pipeline)")
        )
        return f"`{fp}`{same}"

    splits = dig(repo.metrics, "data", "answers", "by_split") or {}
    rows = [
        [s, val_text(r.get("questions")), val_text(r.get("answers")), val_text(r.get("positive"))]
        for s, r in splits.items()
        if r.get("positive") is not None
    ]
    q = m.get("questions") or {}
    weight = final.get("mtl_weight")
    if weight is None:
        role = NOT_MEASURED
    elif float(weight) in (0, 1):
        role = "this model alone" if float(weight) == 1 else "the baseline alone: this model is not used"
    else:
        role = f"this model blended with the baseline (MTL weight {float(weight):g})"
    return Card(
        what=[
            [
                "architecture",
                "multi-task network (paper §4.5-4.6): a conv encoder over the NLI sentence grids (candidate × entailed answer), "
                "the RQE [CLS] vector and candidate feature groups → a filter head and a pairwise ranking head; no pretrained base",
            ],
            [
                "inputs: NLI grids",
                "model fingerprint "
                + fed(dig(repo.metrics, "embed", "nli_model_fingerprint"), nli_fp, "nli-cross-encoder"),
            ],
            [
                "inputs: RQE",
                "model fingerprint "
                + fed(dig(repo.metrics, "retrieve", "rqe_model_fingerprint"), rqe_fp, "rqe-cross-encoder"),
            ],
            [
                "files",
                f"`{art['path']}`: the final model (train + validation questions); `{art['path']}/val`: trained on the train questions only",
            ],
            ["in the final system", f"{role} (`metrics/task3_val.json`; the choice: analysis stage `system_choice`)"],
        ],
        data=[
            "MEDIQA 2019 Task 3 labelled questions (`metrics/data.json`); the final model trains on "
            f"{val_text(q.get('train'))} train + {val_text(q.get('val'))} validation questions, the validation model on the train questions; "
            f"{val_text(dig(m, 'n_pairs', 'all'))} (answer, entailed answer) pairs, {val_text(dig(m, 'n_pairs', 'augmented'))} of them augmentation pairs "
            "(higher-ranked candidates as entailed answers). Entailed answers are MedQuAD answers found by rqe-cross-encoder.",
            "",
        ]
        + md_table(["split", "questions", "answers", "valid answers"], rows)
        + dataset_lines(["task3", "medquad"]),
        recipe=tuple(
            f"mtl.{k}"
            for k in (
                "feature_groups",
                "proj_channels",
                "conv_channels",
                "rqe_dim",
                "filter_hidden",
                "pair_hidden",
                "dropout",
                "alpha",
                "pair_scope",
                "lr",
                "weight_decay",
                "max_epochs",
                "patience",
                "fixed_epochs",
                "questions_per_batch",
                "inner_val_frac",
                "augment",
                "ensemble",
                "rank_by",
                "n_seeds",
            )
        )
        + (
            "score.keep_rules",  # its first rule is the model's keep decision (threshold, prior shift, min_keep)
            "cv_folds",
            "n_candidates",
            "rqe_threshold",
            "embed.max_sentences",
            "embed.prefilter_top_k",
            "embed.augment_top",
            "seed",
            "device",
        ),
        recorded=[
            ["best epoch (final model, per seed)", val_text(dig(m, "best_epochs", "final_model")), "metrics/mtl.json"],
            [
                "filter threshold (final model)",
                val_text(dig(m, "decision", "threshold_final_model")),
                "metrics/mtl.json",
            ],
            ["device", val_text(m.get("device")), "metrics/mtl.json"],
            ["threads", val_text(m.get("threads")), "metrics/mtl.json"],
        ],
        evaluation=["**MEDIQA Task 3** (`metrics/mtl.json`: this model with its own threshold and pairwise order):", ""]
        + _protocols(m, dig(m, "val_counts", "n_questions"), "the train-only model")
        + [
            f"Seed spread ({val_text(dig(repo.metrics, 'noise_band', 'mtl', 'seeds'))} seeds, CV + LOSO re-run; `metrics/noise_band.json`): accuracy "
            f"{val_text(dig(repo.metrics, 'noise_band', 'mtl', 'accuracy'))}, order score {val_text(dig(repo.metrics, 'noise_band', 'mtl', 'order'))}.",
            "",
        ]
        + (final_line(final) or [f"Final system: {NOT_MEASURED}.", ""])
        + _nested_line(repo)
        + mtl_section(m, repo.metrics.get("mtl_ablations") or {}),
        use=[
            "- Filters and orders the ≤10 answers a QA system (CHiQA) retrieved for a consumer health question: `medrank rank` "
            "(the final system, stage `score`'s choice), `submissions/task3_{val,test}.csv`."
        ],
        limits=[
            f"- Transfer to a new question population: trained on two labelled sources and scored on the third, accuracy "
            f"{lo_text(m.get('loso'))} against CV {cv_text(dig(m, 'cv', 'accuracy'))}; MRR {lo_text(m.get('loso'), 'mrr')}.",
            "- Question lengths (median characters, `metrics/task3_val.json`): "
            + (", ".join(f"{s} {n}" for s, n in (final.get("question_chars_median") or {}).items()) or NOT_MEASURED)
            + "; the blind test questions are a fourth population.",
            f"- Validation has {val_text(dig(m, 'val_counts', 'n_questions'))} questions ({val_text(dig(m, 'val_counts', 'n_spearman_questions'))} "
            "with a Spearman): validation numbers are noisy; compare systems on CV and LOSO.",
        ]
        + _error_analysis(repo, final),
    )


def _error_analysis(repo: Repo, final: dict) -> list[str]:
    """The score stage's error analysis (paper Figures 7-9) on the CV rows, when this model is the final system."""
    if final.get("mtl_weight") is None or float(final["mtl_weight"]) != 1:
        return [f"- Error analysis of this model alone: {NOT_MEASURED} (the score stage analyses the final system)."]
    base = "plots/error_analysis/cv"
    recall, sents, valid = (
        repo.csv_rows(f"{base}/{n}.csv") for n in ("recall_by_chiqa_rank", "accuracy_by_sentences", "by_valid_answers")
    )
    series = lambda rows, key, val: (
        "; ".join(f"{r[key]}: {fmt_num(float(r[val]))}" for r in rows) if rows else NOT_MEASURED
    )
    return [
        f"- Error analysis (`{base}/`, out-of-fold rows of train+val): filter recall of valid answers by CHiQA rank: "
        f"{series(recall, 'chiqa_rank', 'recall')}.",
        f"- Filter accuracy by answer length, sentences (answers): {series(sents, 'sentences', 'accuracy')}.",
        "- Accuracy by number of valid answers per question (questions): "
        + (
            "; ".join(f"{r['n_valid']} ({r['n']}): {fmt_num(float(r['accuracy']))}" for r in valid)
            if valid
            else NOT_MEASURED
        )
        + ".",
    ]


def cnn_card(repo: Repo, art: dict) -> Card:
    sq, med = repo.metrics.get("cnn_squad") or {}, repo.metrics.get("cnn_mediqa") or {}
    tr, data = sq.get("cnn_train") or {}, dig(sq, "data", "train") or {}
    return Card(
        what=[
            [
                "architecture",
                "Severyn & Moschitti (SIGIR 2015): wide convolution + max pooling per side, bilinear similarity x_q^T M x_d, "
                "word-overlap features, hidden layer, softmax; no pretrained base",
            ],
            [
                "word vectors",
                f"skip-gram `models/word2vec`, dimension {val_text(repo.value('cnn.w2v_dim', 'cnn_word2vec'))}, "
                f"trained further: {code_text(repo.value('cnn.train_embeddings', 'cnn_train'))}",
            ],
        ],
        data=[
            f"SQuAD v1.1 answer-sentence selection: {val_text(tr.get('train_questions'))} train questions ({val_text(tr.get('train_pairs'))} question-sentence "
            f"pairs) of the {val_text(data.get('kept'))} kept from {val_text(data.get('questions'))}; {val_text(tr.get('val_questions'))} questions of "
            "held-out train articles pick the epoch (`metrics/cnn_squad.json`). Word vectors: SQuAD train contexts"
            f"{' and MedQuAD answers' if repo.value('cnn.w2v_medquad', 'cnn_word2vec') else ''}.",
            "",
        ]
        + dataset_lines(
            ["squad_train"] + (["medquad"] if repo.value("cnn.w2v_medquad", "cnn_word2vec") else []) + ["squad_dev"]
        ),
        recipe=tuple(
            f"cnn.{k}"
            for k in (
                "w2v_dim",
                "w2v_window",
                "w2v_min_count",
                "w2v_epochs",
                "w2v_medquad",
                "conv_width",
                "n_filters",
                "overlap_dim",
                "hidden_size",
                "dropout",
                "l2",
                "optimizer",
                "lr",
                "epochs",
                "batch_size",
                "max_tokens",
                "train_embeddings",
                "max_train_questions",
                "val_articles",
                "mediqa_aggregation",
            )
        )
        + ("seed",),
        recorded=[["best epoch", val_text(tr.get("best_epoch")), "metrics/cnn_squad.json"]],
        evaluation=cnn_section(sq, repo.metrics.get("cnn_crossenc"))
        + [
            "**MEDIQA Task 3, zero-shot** (`metrics/cnn_mediqa.json`: an answer's score is the "
            f"`{med.get('aggregation') or NOT_MEASURED}` of its sentence scores; only the keep threshold is fitted on MEDIQA rows):",
            "",
        ]
        + _protocols(med, dig(med, "val", "n_questions"), "threshold from the training sets")
        + downstream_rows(repo, ("cnn",), {}),
        use=[
            "- Ranks candidate answer sentences for a question (answer-sentence selection); scores MEDIQA answers sentence by sentence "
            "(`cnn_score`, feature group `cnn`) and makes the `cnn` row of RESULTS.md."
        ],
        limits=[
            "- Trained on Wikipedia paragraphs (SQuAD): consumer health questions and long NIH answers are out of its domain; "
            f"MEDIQA LOSO accuracy {lo_text(med.get('loso'))}, MRR {lo_text(med.get('loso'), 'mrr')}.",
            "- CC BY-SA 4.0 training data (share-alike).",
        ],
    )
