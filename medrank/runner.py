"""Run a stage or CLI entry point: logging set up, MedrankError -> one line on stderr, exit 2."""

from __future__ import annotations

import logging
import sys
from typing import Callable


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")


def run(main: Callable[[], object]) -> None:
    """Call `main()`; exit 0 on success, 2 with a single clear line on MedrankError."""
    from medrank.errors import MedrankError

    setup_logging()
    try:
        main()
    except MedrankError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
