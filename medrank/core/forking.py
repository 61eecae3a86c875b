"""Forked worker pools that die with their parent and never carry its locks.

A forked worker inherits every fd of its parent, and a `flock` belongs to the open file, not to the process: a worker
left running after its stage was killed (SIGKILL skips the pool's own clean-up) kept the stage's lock and its temp
files' flocks, so the next run refused with "already running (process <the dead pid>)" while orphans computed on.
Here every worker (1) asks the kernel to SIGKILL it when its parent dies (Linux `PR_SET_PDEATHSIG`; elsewhere a thread
polls `os.getppid()`), (2) exits at once if the parent died before that request took effect, and (3) closes its copies
of the flocked fds its parent registered with `hold`, so only the parent ever holds them.
"""

from __future__ import annotations

import ctypes
import multiprocessing.pool
import os
import signal
import sys
import threading
import time

_HELD: set[int] = set()  # this process's flocked fds (stage lock, temp files, staging folders); a fork copies the set
_PR_SET_PDEATHSIG = 1


def hold(fd: int) -> int:
    """Register a flocked fd: forked workers close their copy of it. Returns `fd`."""
    _HELD.add(fd)
    return fd


def let_go(fd: int) -> None:
    """Close a registered fd (its flock goes with it, once no worker holds a copy)."""
    _HELD.discard(fd)
    os.close(fd)


def _die_with(parent: int) -> None:
    """Pool initializer: tie this worker's life to `parent` and drop the parent's flocks."""
    for fd in list(_HELD):  # the copies only: the parent's own fds, and so its locks, stay as they are
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the stage runner's unwinding handlers are for the parent alone
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _watch(parent)
    else:
        _watch(parent)
    if os.getppid() != parent:  # the parent died between the fork and the request: no signal will ever come
        os._exit(1)


def _watch(parent: int) -> None:
    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=poll, daemon=True, name="medrank-parent-watch").start()


def fork_pool(workers: int) -> multiprocessing.pool.Pool:
    """A `multiprocessing` pool of `workers` forked processes that die with this one (use it as a context manager)."""
    import multiprocessing as mp

    return mp.get_context("fork").Pool(workers, initializer=_die_with, initargs=(os.getpid(),))
