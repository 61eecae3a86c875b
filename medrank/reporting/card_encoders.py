"""Model-card sections of the fine-tuned cross-encoders: NLI, RQE, QA."""

from __future__ import annotations

from medrank.data.tasks import NLI_LABELS, QA_LABELS, RQE_LABELS
from medrank.reporting.card_base import Card, NOT_MEASURED, RQE_SOURCES, Repo, code_text, dataset_lines, dig, val_text
from medrank.reporting.card_rankers import downstream_rows
from medrank.reporting.formatting import acc_text, md_table
from medrank.reporting.signals import retrieve_section, rqe_rows_section


TRAIN_KNOBS = (
    "max_length",
    "epochs",
    "lr",
    "batch_size",
    "warmup_ratio",
    "weight_decay",
)  # every fine-tune's recipe keys
_RECORDED = {
    "train_precision": "train precision (chosen)",
    "predict_precision": "predict precision (chosen)",
    "threads": "threads",
}


def recorded_rows(m: dict, stage: str, keys: tuple[str, ...]) -> list[list[str]]:
    """The card's "recorded" rows: what the fine-tune chose at run time, read from metrics/<stage>.json."""
    return [[_RECORDED[k], val_text(m.get(k)), f"metrics/{stage}.json"] for k in keys]


def _encoder_rows(m: dict) -> list[list[str]]:
    return [
        [
            "base model",
            f"`{m.get('base_model') or NOT_MEASURED}`: weights sha256-checked at load against the pin in `medrank/encoders/weights.py`",
        ],
        ["base fingerprint", code_text(m["base_fingerprint"]) if m.get("base_fingerprint") else NOT_MEASURED],
        [
            "model fingerprint",
            (code_text(m["model_fingerprint"]) if m.get("model_fingerprint") else NOT_MEASURED)
            + " (sha256 over the weights and config/tokenizer files: keys the encoder caches)",
        ],
    ]


def _precision_line(m: dict, file: str) -> str:
    probe = m.get("precision_probe") or {}
    pred = m.get("predict_precision") or dig(m, "predict_speed", "precision")
    reason = f" (precision choice on {probe['device']}: {probe['reason']})" if probe.get("reason") else ""
    return (
        f"- Numerics: trained in `{m.get('train_precision') or NOT_MEASURED}`, scores in `{pred or NOT_MEASURED}`{reason}, "
        f"{m.get('threads') or NOT_MEASURED} CPU threads (`{file}`)."
    )


def gated_note(repo: Repo) -> str:
    used = lambda key: "used" if repo.value(key, None) else "not used"
    return (
        f"Licence-gated sources are never shipped: MedNLI (`clean.mednli_dir`: {used('clean.mednli_dir')}) and UMLS "
        f"(`normalize.umls_mrconso`: {used('normalize.umls_mrconso')}; without it concept names come from the Human Disease Ontology, "
        "CC0 / CC BY 3.0)."
    )


def nli_card(repo: Repo, art: dict) -> Card:
    m = repo.metrics.get("finetune_nli") or {}
    dataset = repo.value("finetune.nli.dataset", "finetune_nli") or NOT_MEASURED
    emb = repo.metrics.get("embed") or {}
    check = emb.get("precision_check_vs_fp32") or {}
    rows = [
        [
            f"`{dataset}` {split}",
            val_text(dig(m, part, "n")),
            val_text(dig(m, part, "accuracy")),
            val_text(dig(m, part, "macro_f1")),
        ]
        for split, part in (("dev", "val"), ("test", "test"))
    ]
    return Card(
        what=_encoder_rows(m) + [["classes", ", ".join(NLI_LABELS)]],
        data=[
            f"Fine-tuned on the `{dataset}` train split ({val_text(m.get('n_train_pairs'))} pairs); dev and test held out.",
            "",
        ]
        + dataset_lines(["mednli" if dataset == "mednli" else "sick"]),
        recipe=tuple(
            f"finetune.nli.{k}"
            for k in (
                "dataset",
                "base_model",
                *TRAIN_KNOBS,
                "max_train_pairs",
                "train_precision",
                "predict_precision",
            )
        )
        + ("seed", "device"),
        recorded=recorded_rows(m, "finetune_nli", ("train_precision", "predict_precision", "threads")),
        evaluation=["**Held-out NLI** (`metrics/finetune_nli.json`; the last epoch's model):", ""]
        + md_table(["split", "pairs", "accuracy", "macro F1"], rows)
        + [
            f"**Sentence grids for the MTL** (`metrics/embed.json`): {val_text(emb.get('grid_cells'))} cells scored in `{emb.get('precision') or NOT_MEASURED}`; "
            f"max |Δp| vs fp32 {val_text(check.get('max_abs_prob_diff'))} over {val_text(check.get('pairs'))} pairs.",
            "",
        ]
        + downstream_rows(repo, ("anli",), {"nli_grid": False}),
        use=[
            "- Scores (premise, hypothesis) sentence pairs as entailment / neutral / contradiction: stage `embed` builds the MTL's "
            "sentence grids (candidate answer × entailed answer) and the baseline's `anli` feature from it.",
            "- Not a medical NLI model: use it as a feature extractor inside this pipeline.",
        ],
        limits=[
            f"- Trained on `{dataset}` (general-domain sentences); accuracy on medical text: {NOT_MEASURED}.",
            "- SICK's licence is non-commercial (CC BY-NC-SA 3.0): the weights and everything built on them (grids, the MTL) are for research use.",
            _precision_line(m, "metrics/finetune_nli.json"),
        ],
    )


def rqe_card(repo: Repo, art: dict) -> Card:
    m = repo.metrics.get("finetune_rqe") or {}
    recipe, n_pre = m.get("recipe") or {}, m.get("n_pretrain_pairs") or {}
    stack, feats = recipe.get("stack") or {}, recipe.get("features") or []
    bi_path = (
        f"{art['path']}/{stack['bi_encoder']}"
        if stack.get("bi_encoder_local")
        else stack.get("bi_encoder") or NOT_MEASURED
    )
    parts = {
        "ce": "the cross-encoder's P(entailed)",
        "cosine": f"the cosine of the bi-encoder `{bi_path}`",
        "qtype": "the question-type agreement",
    }
    scorer = (
        (
            f"logistic regression over {', '.join(parts.get(f, f) for f in feats)} (coefficients in the model's metadata)"
            if stack
            else "the cross-encoder's P(entailed)"
        )
        if recipe
        else NOT_MEASURED
    )
    data, used = [], []
    for kind, path in (("cross_encoder", art["path"]), ("bi_encoder", bi_path)):
        r = recipe.get(kind)
        if not r:
            continue
        used += r.get("extras") or []
        srcs = ", ".join(f"`{s}` ({val_text(n_pre.get(s))} pairs)" for s in r.get("extras") or []) or "none"
        then = f"; then all {val_text(m.get('n_val_pairs'))} Task 2 validation pairs" if r.get("val_stage") else ""
        data.append(f"- {kind.replace('_', '-')} (`{path}`): {srcs}{then}.")
    selection = repo.metrics.get("rqe_selection") or {}
    tried = {
        s
        for r in (selection.get("rows") or m.get("rows") or {}).values()
        for kind in ("cross_encoder", "bi_encoder")
        for s in (((r.get("recipe") or {}).get(kind) or {}).get("extras") or [])
    }
    if tried - set(used):
        data.append(
            f"- Tried in the CV, not in the final model: {', '.join(f'`{s}`' for s in sorted(tried - set(used)))}."
        )
    cv = m.get("cv") or {}
    buckets = (
        ", ".join(
            f"`{b}` {val_text(r.get('accuracy'))} ({val_text(r.get('n'))} pairs)"
            for b, r in (cv.get("by_overlap") or {}).items()
        )
        or NOT_MEASURED
    )
    oof = m.get("val_official_oof") or {}
    return Card(
        what=_encoder_rows(m)
        + [
            [
                "bi-encoder fingerprint",
                code_text(m["bi_encoder_fingerprint"]) if m.get("bi_encoder_fingerprint") else NOT_MEASURED,
            ],
            [
                "chosen recipe",
                f"`{m['chosen']}` (rule: {m.get('selection_rule')})" if m.get("chosen") else NOT_MEASURED,
            ],
            ["RQE score", scorer],
            [
                "cross-encoder classes",
                ", ".join(RQE_LABELS) + "; its [CLS] vector feeds the MTL (`mtl.rqe_dim`) and `rqe_emb`",
            ],
        ],
        data=[
            "Training pairs (`metrics/finetune_rqe.json`: `recipe`, `n_pretrain_pairs`). `meqsum`, `liveqa`: a consumer question with "
            "its own summary as entailed, other questions' summaries (`hard_negatives` of the same topic, `easy_negatives` at random) as "
            "not entailed; `medquad`: a consumer-worded MedQuAD question and a same-focus FAQ; `amia`: the labelled AMIA 2016 pairs.",
            "",
        ]
        + data
        + [""]
        + dataset_lines([RQE_SOURCES[s] for s in used if s in RQE_SOURCES] + ["task2_val"]),
        recipe=tuple(
            f"finetune.rqe.{k}"
            for k in (
                "base_model",
                "bi_encoder",
                *TRAIN_KNOBS,
                "medquad_pairs",
                "hard_negatives",
                "easy_negatives",
                "max_train_pairs",
                "folds",
                "val_epochs",
                "val_lr",
                "extra_sets",
                "bi_encoder_sets",
            )
        )
        + ("seed", "device"),
        recorded=recorded_rows(m, "finetune_rqe", ("train_precision", "threads")),
        evaluation=rqe_rows_section(m, selection)
        + [
            f"Official Task 2 scorer on the chosen row's out-of-fold predictions: accuracy {val_text(oof.get('accuracy'))} over "
            f"{val_text(oof.get('n_gold_rows'))} validation pairs.",
            "",
        ]
        + retrieve_section(repo.metrics.get("retrieve") or {})
        + downstream_rows(repo, ("rqe", "rqe_emb"), {"rqe_dim": 0}),
        use=[
            "- Decides whether a consumer health question entails a MedQuAD FAQ question: stage `retrieve` keeps the top `n_candidates` "
            "MedQuAD questions with RQE score ≥ `rqe_threshold` (their answers become the MTL's entailed answers); Task 2 submissions."
        ],
        limits=[
            f"- Selected and measured on only {val_text(m.get('n_val_pairs'))} validation pairs ({val_text(m.get('n_val_questions'))} questions): "
            f"CV accuracy {NOT_MEASURED if cv.get('accuracy') is None else acc_text(cv)} (mean ± sd over folds).",
            f"- Same-focus pairs (the FAQ names what the question names, the hard case): accuracy "
            f"{val_text(dig(cv, 'same_focus', 'accuracy'))} over {val_text(dig(cv, 'same_focus', 'n'))} pairs. By word overlap: {buckets}.",
            _precision_line(m, "metrics/finetune_rqe.json"),
        ],
    )


def qa_card(repo: Repo, art: dict) -> Card:
    m = repo.metrics.get("qa") or {}
    h = m.get("val_heldout_foci") or {}
    return Card(
        what=_encoder_rows(m) + [["classes", ", ".join(QA_LABELS)]],
        data=[
            f"{val_text(m.get('n_train_pairs'))} (question, answer) pairs mined from MedQuAD (`qa.train_pairs`): a question with its own "
            "answer, with the same focus's answer to another question type, or with another focus's answer; the evaluation pairs come "
            "from held-out foci (`qa.eval_focus_frac`). No MEDIQA label is used.",
            "",
        ]
        + dataset_lines(["medquad"]),
        recipe=tuple(
            f"qa.{k}"
            for k in (
                "base_model",
                "train_pairs",
                "eval_pairs",
                "eval_focus_frac",
                *TRAIN_KNOBS,
                "train_precision",
                "predict_precision",
            )
        )
        + ("seed", "device"),
        recorded=recorded_rows(m, "qa", ("train_precision", "threads")),
        evaluation=["**Held-out MedQuAD foci** (`metrics/qa.json`):", ""]
        + md_table(
            ["pairs", "accuracy", "macro F1"],
            [[val_text(h.get("n")), val_text(h.get("accuracy")), val_text(h.get("macro_f1"))]],
        )
        + [f"MEDIQA answers scored (`qa_score`): {val_text(m.get('mediqa_answers_scored'))}.", ""]
        + downstream_rows(repo, ("qa",), {}),
        use=[
            "- Scores how well a text answers a question: `qa_score` per MEDIQA answer (feature group `qa`: a candidate of the analysis "
            "rows, built by analysis/dvc.yaml; no default system reads it, so `dvc repro` does not train it). Stage `qa_graded` "
            "fine-tunes it further on the judged LiveQA answers' grades (`metrics/qa_graded.json`)."
        ],
        limits=[
            "- Measured on MedQuAD pairs only (NIH FAQ pages, one answer per question type); on MEDIQA it is judged only through "
            "the downstream rows above.",
            _precision_line(m, "metrics/qa.json"),
        ],
    )
