"""Run a stage or CLI entry point: logging set up, MedrankError -> one line on stderr, exit 2."""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import Callable


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")


def stage_name(main: Callable) -> str | None:
    """`acquire` for stages.acquire.main (also when run as `python -m stages.acquire`); None outside stages/."""
    module = main.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec else ""
    return module.removeprefix("stages.") if module.startswith("stages.") else None


def run(main: Callable[[], object]) -> None:
    """Call `main()`; exit 0 on success, 2 with a single clear line on MedrankError or a full device, 130 on Ctrl-C."""
    from medrank.errors import MedrankError
    from medrank.io import declared_outputs, sweep_leftovers

    setup_logging()
    flushing = False
    try:
        stage = stage_name(main)
        if stage:  # temp files / staging folders a killed run of this stage left beside or inside its outputs
            sweep_leftovers(declared_outputs(stage))
        main()
        flushing = True  # stdout is buffered: a full device or a closed pipe shows at this flush, not at the print
        sys.stdout.flush()
    except MedrankError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        _closed_pipe()
    except OSError as e:
        if e.errno not in _FULL:
            raise
        if flushing:
            _fail(f"cannot write to stdout ({e.strerror})")
        # files go through medrank.io's temp file + rename, so a full disk leaves the previous files, not halves
        _fail(f"{e.strerror}{f' writing {e.filename}' if e.filename else ''} (files are written to a temp file and renamed: none is left half-written)")


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _fail(message: str) -> None:
    _silence_stdout()  # else the interpreter's own flush at exit prints a second traceback
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _closed_pipe() -> None:
    """`medrank rank ... | head`: the reader left; nothing to say (the shell's code for SIGPIPE)."""
    _silence_stdout()
    sys.exit(141)


def _silence_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
