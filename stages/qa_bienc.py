"""DVC stage `qa_bienc` (analysis/dvc.yaml): a question -> answer bi-encoder fine-tuned for relevance, cross-fitted,
then cos(question, answer) of every MEDIQA answer (feature group qa_bienc): Task 3's counterpart of the RQE bi-encoder.

Step one learns MedQuAD: (question, its answer, an answer of the same focus and another question type) triplets
with in-batch negatives (`qa_bienc.medquad_triplets`; no MEDIQA text). Step two is cross-fitted: with `fold_by:
source` (default) each labelled source is a fold and the test questions are dealt over the folds; fold model f starts
from step one, learns the labelled MEDIQA answers outside fold f (label: reference score >= 3) and, with
`qa_bienc.judged`, the judged LiveQA answers of the train_liveqa questions outside fold f (grade >= 3), and scores the
answers of the questions in fold f. So no question is scored by a model that learned it, and no labelled source by a
model that saw any of its labels (what LOSO and nested LOSO assume: with random question folds, `fold_by: question`,
a source's other questions' labels reach its scores). Writes data/processed/qa_bienc_scores.parquet (split, qid, aid,
qa_bienc_cos), metrics/qa_bienc.json (AUC of each step's cosine on each labelled source beside the zero-shot
bi-encoder's) and plots/qa_bienc (dvclive: training loss per step and fold).
"""

from __future__ import annotations

import copy
import logging
import time

import numpy as np
import pyarrow as pa

from medrank import layout
from medrank.answer_scores import auc_by_source, qa_pairs
from medrank.crossfit import crossfit, source_folds
from medrank.data.judged import judged_answers, question_folds
from medrank.data.mining import medquad_qa_triplets
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.errors import MedrankError
from medrank.features import cap_questions
from medrank.io import read_parquet, write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

log = logging.getLogger("stages.qa_bienc")
QA_BIENC_SCORES = pa.schema(
    [("split", pa.string()), ("qid", pa.string()), ("aid", pa.string()), ("qa_bienc_cos", pa.float64())]
)


def cosines(model: SentenceEncoder, pairs: list[tuple[str, str]], batch_size: int) -> np.ndarray:
    """cos(question, answer) of each pair (unit vectors; fp32)."""
    if not pairs:
        return np.zeros(0)
    q = model.encode([a for a, _ in pairs], "fp32", batch_size)
    a = model.encode([b for _, b in pairs], "fp32", batch_size)
    return np.einsum("ij,ij->i", q, a).astype(float)


def main(params_path: str = "params.yaml") -> None:
    import torch
    from dvclive import Live

    p = load_params(params_path)
    qp = p.qa_bienc
    t0 = time.perf_counter()
    torch.set_num_threads(qp.threads)
    answers = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    a_pairs = qa_pairs(answers)
    labelled = answers["reference_score"].notna().to_numpy()
    a_label = (answers["reference_score"].fillna(0).to_numpy(dtype=float) >= 3).astype(int)
    judged = judged_answers(read_parquet(layout.JUDGED), answers) if qp.judged else answers.iloc[:0]
    keys = answers[["split", "qid"]].drop_duplicates()
    folds = (
        source_folds(keys, layout.LABELLED_SPLITS, p.seed)
        if qp.fold_by == "source"
        else question_folds(keys, qp.folds, p.seed)
    )
    n_folds = int(folds.max()) + 1
    fold_of = dict(zip(zip(keys["split"], keys["qid"]), folds))
    a_fold = np.array([fold_of[k] for k in zip(answers["split"], answers["qid"])])
    j_fold = np.array([fold_of[("train_liveqa", q)] for q in judged["qid"]], dtype=int)
    j_pairs, j_label = qa_pairs(judged), (judged["reference_score"].to_numpy(dtype=float) >= 3).astype(int)
    seconds: dict[str, float] = {}
    knobs = dict(
        warmup_ratio=qp.warmup_ratio, weight_decay=qp.weight_decay, precision=qp.train_precision, show_progress=True
    )

    with Live(dir=str(layout.plots_dir("qa_bienc")), dvcyaml=None, save_dvc_exp=False) as live:
        live.log_params(qp.model_dump())
        base = SentenceEncoder(qp.base_model, device=p.device, max_length=qp.max_length)
        zero_shot = cosines(base, a_pairs, qp.batch_size_encode)
        triplets = medquad_qa_triplets(read_parquet(layout.MEDQUAD), qp.medquad_triplets, np.random.default_rng(p.seed))
        if triplets:
            ts = time.perf_counter()
            q, pos, neg = (list(x) for x in zip(*triplets))
            hist = base.fit_ranking(
                q, pos, neg, epochs=qp.epochs, lr=qp.lr, batch_size=qp.batch_size, seed=p.seed, **knobs
            )
            for h in hist:
                live.log_metric("medquad/train/loss", h["train_loss"], plot=False)
            seconds["step one (MedQuAD)"] = round(time.perf_counter() - ts, 1)
        step_one = cosines(base, a_pairs, qp.batch_size_encode)
        fold_stats: list[dict] = []

        def fit_fold(f: int, train: list[np.ndarray]) -> SentenceEncoder:
            ts = time.perf_counter()
            a_train, j_train = np.intersect1d(train[0], np.flatnonzero(labelled)), train[1]
            pairs = [a_pairs[i] for i in a_train] + [j_pairs[i] for i in j_train]
            y = np.concatenate([a_label[a_train], j_label[j_train]])
            if len(np.unique(y)) < 2:
                raise MedrankError(
                    f"qa_bienc: fold {f} leaves {len(y)} training answers of one class (use fewer folds)"
                )
            model = copy.deepcopy(base)
            for h in model.fit(
                pairs,
                y,
                epochs=qp.crossfit_epochs,
                lr=qp.crossfit_lr,
                batch_size=qp.batch_size,
                seed=p.seed + f,
                **knobs,
            ):
                live.log_metric(f"fold{f}/train/loss", h["train_loss"], plot=False)
            fold_stats.append(
                {
                    "fold": f,
                    "n_mediqa_learned": int(len(a_train)),
                    "n_judged_learned": int(len(j_train)),
                    "n_scored": int((a_fold == f).sum()),
                    "seconds": round(time.perf_counter() - ts, 1),
                }
            )
            log.info(
                "qa_bienc fold %d: learned %d MEDIQA + %d judged answers (%.0fs)",
                f,
                len(a_train),
                len(j_train),
                time.perf_counter() - ts,
            )
            return model

        def score_fold(model: SentenceEncoder, rows: np.ndarray) -> np.ndarray:
            return cosines(model, [a_pairs[i] for i in rows], qp.batch_size_encode)

        score = crossfit(n_folds, a_fold, [a_fold, j_fold], fit_fold, score_fold) if qp.crossfit_epochs else step_one
    write_parquet(answers[["split", "qid", "aid"]].assign(qa_bienc_cos=score), layout.QA_BIENC_SCORES, QA_BIENC_SCORES)
    # stage bienc's cosine (the default model) is beside these in RESULTS, from metrics/bienc.json: not read here, so a
    # bienc option does not re-run this stage
    columns = {
        f"zero-shot {qp.base_model}": zero_shot,
        "step one (MedQuAD)": step_one,
        "cross-fitted (qa_bienc_cos)": score,
    }
    write_json(
        layout.metrics_file("qa_bienc"),
        {
            "auc": auc_by_source(answers, columns),
            "n_triplets": len(triplets),
            "fold_by": qp.fold_by,
            "folds": fold_stats,
            "train_precision": qp.train_precision,
            "threads": qp.threads,
            "seconds": {**seconds, "total": round(time.perf_counter() - t0, 1)},
        },
    )
    log.info(
        "qa_bienc: %s (%.0fs)",
        {k: v.get("pooled") for k, v in auc_by_source(answers, columns).items()},
        time.perf_counter() - t0,
    )


if __name__ == "__main__":
    run(main)
