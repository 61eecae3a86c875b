"""DVC stage `normalize`: cleaned MEDIQA answers, RQE pairs and MedQuAD -> normalized texts + sentences, and the
normalize step of `medrank rank` (models/steps/normalize: the section and the vocabularies it read)."""

from __future__ import annotations

import logging
import time

from medrank.core import layout
from medrank.data.schemas import NORMALIZED_TABLES
from medrank.core.io import read_parquet, write_json, write_parquet
from medrank.steps.normalize_step import NormalizeStep
from medrank.params import load_params
from medrank.stage.runner import run
from medrank.text.coref import make_coref
from medrank.text.normalize import TABLES

log = logging.getLogger("stages.normalize")


def main(params_path: str = "params.yaml") -> None:
    params = load_params(params_path)
    p = params.normalize
    t0 = time.perf_counter()
    coref = make_coref(p.coref, p.stanza_dir)  # fail early, before the vocabularies are built
    step = NormalizeStep.fit(params)
    normalizer = step.normalizer
    metrics: dict = {
        "vocabulary": {
            "abbreviations": len(normalizer.abbreviations) if normalizer.abbreviations else 0,
            "concept_phrases": len(normalizer.concepts) if normalizer.concepts else 0,
            "concept_ambiguous_dropped": normalizer.concepts.n_ambiguous if normalizer.concepts else 0,
        }
    }
    log.info("vocabularies built in %.1fs", time.perf_counter() - t0)
    totals = {"texts": 0, "changed": 0, "expansions": 0, "concept_replacements": 0}
    for name, spec in TABLES.items():
        t1 = time.perf_counter()
        df = read_parquet(layout.CLEAN / f"{name}.parquet")
        out, stats = step.normalize(df, spec, coref, desc=name)
        assert len(out) == len(df), f"{name}: {len(df)} rows in, {len(out)} out"
        write_parquet(out, layout.NORMALIZED / f"{name}.parquet", NORMALIZED_TABLES[name])
        n_texts = sum(stats[c]["texts"] for c in spec.texts)
        for c in spec.texts:
            for k in totals:
                totals[k] += stats[c][k]
        metrics[name] = stats
        log.info("%s: %d rows, %d texts in %.1fs", name, len(df), n_texts, time.perf_counter() - t1)
    metrics["total"] = totals
    step.save()
    write_json(layout.metrics_file("normalize"), metrics)
    log.info("normalize: %d texts, %d changed, in %.1fs", totals["texts"], totals["changed"], time.perf_counter() - t0)


if __name__ == "__main__":
    run(main)
