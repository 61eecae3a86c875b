"""DVC stage `clean`: raw datasets -> data/interim/clean/<table>.parquet + metrics/data.json (counts)."""

import logging
import time
from pathlib import Path

from medrank.data.clean import build_tables
from medrank.data.schemas import TABLES
from medrank.io import write_json, write_parquet
from medrank.params import load_params
from medrank.runner import run

log = logging.getLogger("stages.clean")


def main() -> None:
    p = load_params().clean
    start = time.perf_counter()
    tables, counts = build_tables(p.raw_dir, squad_max_articles=p.squad_max_articles, mednli_dir=p.mednli_dir)
    out_dir = Path(p.out_dir)
    for name, schema in TABLES.items():
        write_parquet(tables[name], out_dir / f"{name}.parquet", schema)
    write_json("metrics/data.json", counts)
    log.info("clean: %d tables in %.1f s", len(tables), time.perf_counter() - start)


if __name__ == "__main__":
    run(main)
