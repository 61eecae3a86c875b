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
import time
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
    from medrank.core import layout
    from medrank.core.errors import MedrankError
    from medrank.core.io import declared_outputs, sweep_leftovers
    from medrank.core.stash import keep_last_good, restore

    setup_logging()
    flushing = False
    try:
        stage = stage_name(main)
        if stage and main.__module__ == "__main__":  # a stage process (python -m stages.X), not a caller's test
            die_with_parent()
        with stage_lock(stage) if stage else contextlib.nullcontext():
            if stage:
                seen = gate_params(stage)
                outputs = declared_outputs(stage)
                stash = stash_dir(stage)
                restore(stash)  # what a killed run of this stage moved aside: the last good outputs, back first
                sweep_leftovers(outputs)  # temp files / staging folders a killed run left beside or inside them
                kept = {p for p in outputs if p in layout.KEPT_OUTPUTS}
                with keep_last_good(stash, [p for p in outputs if p not in kept]):
                    main()
                    params_unchanged(stage, seen)
                log_peak_rss(stage)
            else:
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
        # files go through medrank.core.io's temp file + rename, so a full disk leaves the previous files, not halves
        _fail(
            f"{e.strerror}{f' writing {e.filename}' if e.filename else ''} (files are written to a temp file and renamed: none is left half-written)"
        )


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def peak_rss_mib() -> tuple[int, int]:
    """(this process's peak RSS, its largest waited-for child's: forked workers, subprocesses) in MiB (Linux KiB)."""
    import resource

    return tuple(resource.getrusage(who).ru_maxrss // 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def log_peak_rss(stage: str) -> None:
    """One line a stage ends with: its peak RSS (benchmarks/experiment.py reads it into the per-stage table)."""
    own, child = peak_rss_mib()
    logging.getLogger("medrank.stage").info("stage %s: peak RSS %d MiB (its largest worker: %d MiB)", stage, own, child)


def stash_dir(stage: str) -> Path:
    """Where a running stage keeps its last good outputs (medrank.core.stash): beside the stage locks."""
    return lock_dir().parent / "medrank-stash" / stage


def die_with_parent(poll_s: float = 0.5) -> None:
    """SIGTERM (and SIGHUP) unwind the stage, so its last good outputs go back (a plain SIGTERM would end it with no
    clean-up), and the stage ends itself once the process that started it is gone: a `dvc repro` killed outright must
    not leave an orphan that goes on to rewrite outputs dvc.lock will never record. DVC runs the cmd as `$SHELL -c cmd`;
    bash execs the command but dash (Debian's /bin/sh, which CI has when SHELL is unset or /bin/sh) stays between as a
    parent that outlives dvc, so the watch goes up through such shells (`_starters`) and checks each link of the chain.
    Polled from a daemon thread (not prctl's PDEATHSIG, which fires when the forking *thread* of the parent ends)."""
    import signal
    import threading

    def _unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _unwind)
    me = os.getpid()
    chain = _starters(me)

    def _watch() -> None:
        while all(_ppid(pid) == ppid for pid, ppid in chain):
            time.sleep(poll_s)
        if os.getpid() == me:
            print("error: the process that started this stage is gone (killed?): stopping", file=sys.stderr)
            os.kill(me, signal.SIGTERM)

    threading.Thread(target=_watch, name="medrank-die-with-parent", daemon=True).start()


_SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish", "ash", "busybox"})


def _ppid(pid: int) -> int | None:
    """The parent of `pid` (os.getppid for this process; /proc elsewhere), None once it is gone or unreadable."""
    if pid == os.getpid():
        return os.getppid()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[1])


def _starters(pid: int) -> list[tuple[int, int]]:
    """(process, its parent) links from `pid` up to the first process that is not a shell running `-c`: the stage's own
    parent, and above it each wrapping shell's. A link that changes (its parent died and it was re-parented) means the
    starter is gone. Without /proc only the stage's own parent is watched."""
    chain = [(pid, os.getppid())]
    while len(chain) < 8:
        parent = chain[-1][1]
        try:
            argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        except OSError:
            break
        if os.path.basename(argv[0].decode(errors="replace")).lstrip("-") not in _SHELLS or b"-c" not in argv[1:]:
            break
        grand = _ppid(parent)
        if grand is None or grand <= 1:
            break
        chain.append((parent, grand))
    return chain


def lock_dir() -> Path:
    """Where stage locks live: the project's .dvc/tmp (git- and DVC-ignored; each `dvc exp` workspace has its own), else
    a folder in the temp dir keyed by the project's path."""
    if Path(".dvc").is_dir():
        return Path(".dvc", "tmp", "medrank-locks")
    return Path(tempfile.gettempdir(), f"medrank-locks-{hashlib.sha256(str(Path.cwd()).encode()).hexdigest()[:12]}")


@contextlib.contextmanager
def stage_lock(stage: str) -> Iterator[None]:
    """One run of a stage at a time in a project: a second one (by hand beside `dvc repro`, say) refuses with one line
    before it sweeps or writes anything. The flock goes with the process (its forked workers drop their copies and die
    with it: medrank.core.forking), so a killed run never leaves it stuck."""
    from medrank.core.errors import MedrankError
    from medrank.core.forking import hold, let_go

    path = lock_dir() / f"{stage}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _lock_owner(fd, path)
        os.close(fd)
        raise MedrankError(
            f"stage {stage} is already running in this project ({owner}, lock {path}): wait for it to finish"
        ) from None
    hold(fd)
    try:
        # one write of a fixed width, never a truncate: the file never reads empty once it has been written
        os.pwrite(fd, f"{os.getpid():<{_PID_WIDTH}}".encode(), 0)
        yield
    finally:
        let_go(fd)


_PID_WIDTH = 20


def _lock_owner(fd: int, path: Path, wait_s: float = 1.0) -> str:
    """Who holds `path`'s flock, in words that are true: the pid in the file while that process is alive and has the
    file open; else a live process found holding it open (/proc); else that it could not be read. The winner of a
    race writes its pid just after its flock, and the file may still hold a previous (dead) run's pid until then, so a
    pid that does not check out is read again for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        text = os.pread(fd, _PID_WIDTH, 0).decode(errors="replace").strip()
        if text.isdigit() and _has_open(int(text), path, fd) is not False:
            return f"process {text}"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    holders = [pid for pid in _pids() if _has_open(pid, path, fd)]
    if holders:
        return f"process {', '.join(map(str, holders))}"
    return "a process whose id could not be read"


def _pids() -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    except OSError:
        return []


def _has_open(pid: int, path: Path, own_fd: int) -> bool | None:
    """True / False: whether live process `pid` has `path` open (this process's `own_fd`, the asker's, aside); None
    where that cannot be seen (no /proc, another user's process) but the process is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        target = os.stat(path)
        for name in os.listdir(f"/proc/{pid}/fd"):
            if pid == os.getpid() and name == str(own_fd):
                continue
            try:
                st = os.stat(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return True
    except OSError:
        return None
    return False


def gate_params(stage: str) -> bytes | None:
    """The check_params gate again at the stage's own start (`dvc repro -s X` and `python -m stages.X` skip the
    check_params stage): params.yaml whole, every value the schema bounds, before anything is swept or written. The
    bytes it checked (None without a params.yaml), for `params_unchanged` at the stage's end."""
    from medrank.core import layout
    from medrank.params import load_params

    if not layout.PARAMS_FILE.is_file():
        return None
    seen = layout.PARAMS_FILE.read_bytes()
    if stage != "check_params":
        load_params(layout.PARAMS_FILE)
    return seen


def params_unchanged(stage: str, seen: bytes | None) -> None:
    """Refuse to end a stage whose params.yaml changed while it ran: DVC would record outputs computed from the old
    values under the new ones. A second `dvc exp run` in the same workspace does this (DVC applies its `-S` while the
    first run's stage runs: docs/reliability.md); the stage's last good outputs then go back."""
    from medrank.core import layout
    from medrank.core.errors import MedrankError

    now = layout.PARAMS_FILE.read_bytes() if layout.PARAMS_FILE.is_file() else None
    if now != seen:
        raise MedrankError(
            f"params.yaml changed while stage {stage} ran (a second `dvc exp run` in this workspace?): its outputs "
            "would not match what dvc.lock records, so the last good ones are kept; queue experiments instead "
            "(`dvc exp run --queue -S ...`, then `dvc queue start`)"
        )


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
