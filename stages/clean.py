"""DVC stage `clean`: raw datasets -> data/interim/clean/<table>.parquet + metrics/data.json (counts)."""

import logging
import time

from medrank import layout
from medrank.data.clean import build_tables
from medrank.data.schemas import TABLES
from medrank.io import write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

log = logging.getLogger("stages.clean")


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path).clean
    start = time.perf_counter()
    tables, counts = build_tables(layout.RAW, squad_max_articles=p.squad_max_articles, mednli_dir=p.mednli_dir)
    for name, schema in TABLES.items():
        write_parquet(tables[name], layout.CLEAN / f"{name}.parquet", schema)
    write_json(layout.metrics_file("data"), counts)
    log.info("clean: %d tables in %.1f s", len(tables), time.perf_counter() - start)


if __name__ == "__main__":
    run(main)
