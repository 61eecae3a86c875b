"""DVC stage `bienc`: zero-shot bi-encoder cosines of every MEDIQA answer (with `bienc.judged`, every judged LiveQA
answer too: medrank.data.judged) and of its heading with the question, and the question-type agreement of the
question and the heading.

One pass of the encoder `bienc.encoder` names in the encoders table (mean pooling, unit vectors) over the normalized
questions, answers (truncated to its `max_length` tokens) and answer headings (`answer_scores.answer_heading`: the
"focus (aspect)" title a CHiQA answer starts with). Vectors go through a content-addressed cache (data/cache/bienc, persist),
so a re-run encodes only texts it has not seen. The question types come from a classifier fitted on the clean
MedQuAD table (seed `seed`; `answer_scores.answer_qtype_scores`). Writes data/processed/bienc.parquet (split, qid,
aid, bienc_cos, heading_cos, qtype_agree, qtype_match), read by the baseline and mtl stages (feature groups `bienc`,
`heading`, `qtype`), and metrics/bienc.json.
"""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.task3.answer_scores import BIENC_SCORES, bienc_metrics, qtype_training_questions, score_answers
from medrank.data.judged import judged_answers, with_judged
from medrank.encoders.sentence_encoder import SentenceEncoder
from medrank.task3.features import cap_questions
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.task3.qtype import QuestionTypes
from medrank.params import load_params, step_params
from medrank.stage.runner import run
from medrank.steps import save_step

log = logging.getLogger("stages.bienc")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    bp = p.bienc
    t0 = time.perf_counter()
    answers = labelled = cap_questions(read_parquet(layout.ANSWERS), p.max_questions_per_split)
    # bienc.judged: the judged LiveQA answers too (baseline.judged_rows trains on them)
    judged = judged_answers(read_parquet(layout.JUDGED), answers) if bp.judged else None
    answers = with_judged(answers, judged)[["split", "qid", "aid", "question_norm", "answer_norm", "judged"]]
    enc = p.encoder_of("bienc")
    bi = SentenceEncoder(enc.model, device=p.device, max_length=enc.max_length)
    qtypes = QuestionTypes(qtype_training_questions(), p.seed)
    table, stats = score_answers(answers, p, bi, qtypes=qtypes)
    write_parquet(table, layout.BIENC, BIENC_SCORES)
    save_step("answer_scores", step_params(p, "answer_scores"), qtypes.tables())  # the classifier, fitted
    metrics = bienc_metrics(answers, labelled, table, bi, p, stats)
    write_json(layout.metrics_file("bienc"), {**metrics, "seconds": round(time.perf_counter() - t0, 1)})
    log.info("bienc: %d answers in %.1fs (%s)", len(answers), time.perf_counter() - t0, stats)


if __name__ == "__main__":
    run(main)
