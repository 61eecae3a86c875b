"""Run a stage or CLI entry point: logging set up, MedrankError -> one line on stderr, exit 2."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator


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
        with stage_lock(stage) if stage else contextlib.nullcontext():
            if stage:  # temp files / staging folders a killed run of this stage left beside or inside its outputs
                gate_params(stage)
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
        _fail(
            f"{e.strerror}{f' writing {e.filename}' if e.filename else ''} (files are written to a temp file and renamed: none is left half-written)"
        )


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def lock_dir() -> Path:
    """Where stage locks live: the project's .dvc/tmp (git- and DVC-ignored; each `dvc exp` workspace has its own), else
    a folder in the temp dir keyed by the project's path."""
    if Path(".dvc").is_dir():
        return Path(".dvc", "tmp", "medrank-locks")
    return Path(tempfile.gettempdir(), f"medrank-locks-{hashlib.sha256(str(Path.cwd()).encode()).hexdigest()[:12]}")


@contextlib.contextmanager
def stage_lock(stage: str) -> Iterator[None]:
    """One run of a stage at a time in a project: a second one (by hand beside `dvc repro`, say) refuses with one line
    before it sweeps or writes anything. The flock goes with the process, so a killed run never leaves it stuck."""
    from medrank.errors import MedrankError

    path = lock_dir() / f"{stage}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise MedrankError(
                f"stage {stage} is already running in this project (process {owner}, lock {path}): wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def gate_params(stage: str) -> None:
    """The check_params gate again at the stage's own start (`dvc repro -s X` and `python -m stages.X` skip the
    check_params stage): params.yaml whole, every value the schema bounds, before anything is swept or written."""
    from medrank import layout
    from medrank.params import load_params

    if stage != "check_params" and layout.PARAMS_FILE.is_file():
        load_params(layout.PARAMS_FILE)


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
