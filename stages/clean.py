"""DVC stage `clean`: raw datasets -> data/interim/clean/<table>.parquet + metrics/data.json (counts)."""

import logging
import time
from pathlib import Path

from medrank.core import layout
from medrank.data.clean import build_tables
from medrank.data.schemas import TABLES
from medrank.core.io import atomic_dir, write_json, write_parquet
from medrank.params import load_params
from medrank.stage.runner import run

log = logging.getLogger("stages.clean")


def is_clean_dir(path: Path) -> bool:
    """A folder holding only the table parquets of medrank.data.schemas.TABLES."""
    names = {f"{name}.parquet" for name in TABLES}
    return all(p.name in names and p.is_file() for p in path.iterdir())


def main(params_path: str = "params.yaml") -> None:
    p = load_params(params_path).clean
    start = time.perf_counter()
    tables, counts = build_tables(layout.RAW, squad_max_articles=p.squad_max_articles, mednli_dir=p.mednli_dir)
    # all tables swap in together (never a mix of two runs); the counts follow only once they are in place
    with atomic_dir(layout.CLEAN, owns=is_clean_dir, what="clean's (only the table parquets)") as staging:
        for name, schema in TABLES.items():
            write_parquet(tables[name], staging / f"{name}.parquet", schema)
    write_json(layout.metrics_file("data"), counts)
    log.info("clean: %d tables in %.1f s", len(tables), time.perf_counter() - start)


if __name__ == "__main__":
    run(main)
