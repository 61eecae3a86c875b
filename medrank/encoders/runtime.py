"""The run's settings that decide the bits: torch and BLAS threads, deterministic kernels, seeds, and what the
stage records about them (`runtime_info`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator

import torch

from medrank.encoders.hardware import cpu_flags, time_min

log = logging.getLogger(__name__)


# environment variables that change which kernels (and so which float rounding) run on a CPU
_ISA_ENV = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_CORETYPE",
)


def runtime_info(device: str | torch.device | None = None, **extra: Any) -> dict[str, Any]:
    """Where a stage's numbers were computed: CPU flags, ATen's kernel level, torch version, threads, ISA overrides
    (+ `extra`, e.g. precision). Outputs at the same precision agree bit for bit only where these agree."""
    info: dict[str, Any] = {
        "device": str(device) if device is not None else "cpu",
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__.split("+")[0],
        "threads": torch.get_num_threads(),
    }
    isa = {k: os.environ[k] for k in _ISA_ENV if os.environ.get(k)}
    if isa:
        info["isa_env"] = isa
    if str(extra.get("precision") or "").startswith("openvino"):  # the OpenVINO path's kernels are its version's
        from importlib.metadata import version

        info["openvino"] = version("openvino")
        info["openvino_streams"] = torch.get_num_threads()  # of one thread each (openvino_path.OpenVinoModel)
    return {**info, **extra}


@contextlib.contextmanager
def deterministic_torch() -> Iterator[None]:
    """Training under `torch.use_deterministic_algorithms` (warn where an op has no deterministic kernel): on CUDA it
    replaces atomics-based kernels (embedding / index_add backward) and needs a fixed cuBLAS workspace; CPU kernels are
    already run-to-run deterministic at a fixed thread count, so CPU results are unchanged. State is restored after."""
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when a cuBLAS handle is made
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


# BLAS threads of the scikit-learn fits whose float sums BLAS splits per thread (the question-type classifier's lbfgs:
# a threaded ddot over ~450k coefficients moves qtype_agree by 1e-14 between 1 and 2 threads). Fixed, not "every
# core": 2 is what the committed outputs were computed with.
BLAS_THREADS = 2


@contextlib.contextmanager
def fixed_blas_threads(n: int = BLAS_THREADS) -> Iterator[None]:
    """numpy/scipy BLAS (OpenBLAS, MKL) at `n` threads inside the block, whatever the core count (torch untouched)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=n, user_api="blas"):
        yield


def set_threads(n: int | None = None) -> int:
    """Use `n` threads, else every core this process may run on (torch's default counts physical cores of the host)."""
    if not n:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, int(n)))
    return torch.get_num_threads()


def pick_threads(step: Callable[[], Any], requested: int | None = None, rounds: int = 1) -> int:
    """Set and return torch's CPU thread count: `requested`, else the faster of 1 and all cores for `step`.

    On shared machines OpenMP teams stall when a core is taken by another process (measured here under load
    8 on 2 cores: 1 thread 0.6 s/step, 2 threads 1-6 s/step), so one thread can beat two; timed, not assumed.
    """
    if requested:
        torch.set_num_threads(requested)
        return requested
    most = max(1, torch.get_num_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    candidates = sorted({1, most})
    if len(candidates) == 1:
        return most
    best: dict[int, float] = {}
    for n in candidates:  # warm-up per count: oneDNN builds kernels per team size
        torch.set_num_threads(n)
        step()
    for _ in range(rounds):
        for n in candidates:
            torch.set_num_threads(n)
            best[n] = min(best.get(n, float("inf")), time_min(step, 1))
    # more threads must win clearly (10%) to be worth their sensitivity to load
    choice = most if best[most] < 0.9 * best[1] else 1
    torch.set_num_threads(choice)
    log.info("thread probe: %s → %d thread(s)", ", ".join(f"{n}: {t * 1000:.0f} ms" for n, t in best.items()), choice)
    return choice


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) RNGs."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
