"""Stage `agree` (analysis/dvc.yaml): group agree, the Task 3 README's own suggestion: how well each MEDIQA answer
agrees with the answers of the MedQuAD questions its question entails (stage retrieve's rows that pass
`rqe_threshold`), as the cosine of the encoder `agree.encoder` names (stage bienc's): the best and the mean over the
entailed answers
(medrank.task3.answer_scores.agreement_scores). Writes data/processed/agree_scores.parquet (split, qid, aid,
agree_max_cos, agree_mean_cos, n_entailed) and metrics/agree.json (AUC against the label per labelled source, beside
bienc_cos). A candidate of analysis.nested.variants (row with_agree); no default reads it.
"""

from __future__ import annotations

import logging
import time

from medrank.stage.runner import run

log = logging.getLogger("stages.agree")


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout
    from medrank.core.io import read_parquet, write_json, write_parquet
    from medrank.params import load_params
    from medrank.task3.answer_scores import AGREE_SCORES, agreement_scores, auc_by_source
    from medrank.task3.features import cap_questions

    p = load_params(params_path)
    t0 = time.perf_counter()
    answers = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    table, stats = agreement_scores(answers, read_parquet(layout.RETRIEVED), p)
    write_parquet(table, layout.AGREE_SCORES, AGREE_SCORES)
    bienc = read_parquet(layout.BIENC).merge(table[["split", "qid", "aid"]], on=["split", "qid", "aid"], how="right")
    columns = {c: table[c].to_numpy() for c in ("agree_max_cos", "agree_mean_cos")}
    metrics = {
        "answers": len(table),
        "model": p.encoder_of("agree").model,
        "answers_with_an_entailed_answer": int((table["n_entailed"] > 0).sum()),
        "encode": stats,
        "auc": auc_by_source(answers, {"bienc_cos": bienc["bienc_cos"].to_numpy(), **columns}),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(layout.metrics_file("agree"), metrics)
    log.info(
        "agree: %d answers (%d with an entailed answer) in %.1fs",
        len(table),
        metrics["answers_with_an_entailed_answer"],
        metrics["seconds"],
    )


if __name__ == "__main__":
    run(main)
