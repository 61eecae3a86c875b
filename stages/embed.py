"""DVC stage `embed`: NLI sentence grids ([CLS] vectors + probabilities) and ANLI (paper 4.4-4.5).

For every candidate answer A and each entailed answer E of its question (retrieved MedQuAD answers, plus
higher-ranked candidates on train splits), writes data/processed/embeddings/nli_grid.parquet and
metrics/embed.json. Sentence pairs go through the content-addressed cache: only unseen pairs are computed.
"""

import logging
import time

from medrank.core import layout
from medrank.encoders.runtime import set_threads
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.distributed import extraction_backend, forked_workers
from medrank.task3.grids import NLI_GRID, candidate_answers, grid_metrics, precision_check
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.steps.grid_step import GridStep
from medrank.params import load_params
from medrank.stage.runner import run

log = logging.getLogger("stages.embed")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path)
    ep = p.embed
    t0 = time.perf_counter()
    threads = set_threads()
    retrieved = read_parquet(layout.RETRIEVED)
    answers = read_parquet(layout.ANSWERS, columns=["split", "qid", "aid", "reference_rank", "answer_sentences"])
    answers = candidate_answers(answers, retrieved, ep.max_answers_per_question)
    backend = extraction_backend(ep.backend, ep.ray, ep.workers)
    model = CrossEncoder.load(layout.NLI_MODEL, device=p.device, precision=ep.precision, task="nli")
    step = GridStep.fit(p, model, p.device)
    grids = step.grids(answers, retrieved, layout.CACHE_EMBED, shard_size=ep.shard_size, backend=backend)
    write_parquet(grids.rows, layout.NLI_GRID, NLI_GRID)
    step.save()
    check = precision_check(grids, model, ep, p.seed, layout.CACHE_EMBED)
    metrics = grid_metrics(
        grids,
        model,
        check,
        ep,
        threads=model.threads or threads,
        workers=forked_workers(backend, grids.precision),
        seconds=round(time.perf_counter() - t0, 2),
    )
    write_json(layout.metrics_file("embed"), metrics)
    log.info(
        "embed: %d answer pairs, %d cells (%d computed) at %s in %.1fs",
        metrics["answer_pairs"],
        metrics["grid_cells"],
        grids.stats["nli"].computed,
        grids.precision,
        metrics["seconds"],
    )


if __name__ == "__main__":
    run(main)
