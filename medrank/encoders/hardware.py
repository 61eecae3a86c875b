"""Which device and precision run here: the device, the CPU's flags, native bf16, and the one choice of fp32 / bf16 /
int8 per device.

The choice is the hardware's (`hardware_precision`: flags, never a timing), so outputs do not depend on machine load;
`probe_precision` checks a real batch against fp32 and keeps bf16 only within the tolerance.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)


# torch's kernels (bf16 autocast, int8 dynamic quantization) and the OpenVINO path's (encoders.openvino_path)
PRECISIONS = ("fp32", "bf16", "int8", "openvino-bf16", "openvino-fp32")


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' → cuda when available, else cpu; an explicit device that is absent is an error."""
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MedrankError(f"device '{device}' requested but CUDA is not available (use device: auto or cpu)")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise MedrankError("device 'mps' requested but MPS is not available (use device: auto or cpu)")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise MedrankError(f"unknown device '{device}' (expected auto, cpu, cuda, cuda:N or mps)")
    return torch.device(device)


def _cpuinfo(field: str) -> str:
    """The first `field` line's value in /proc/cpuinfo ('' where /proc is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(field)), "")


def cpu_flags() -> list[str]:
    """The CPU features that decide whether bf16/int8 kernels are fast (empty where /proc is absent)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "avx_vnni")
    have = set(_cpuinfo("flags").split())
    return [f for f in wanted if f in have]


def cpu_vendor() -> str:
    """GenuineIntel, AuthenticAMD, ... ('' where /proc is absent)."""
    return _cpuinfo("vendor_id")


def _isa_cap() -> str:
    """oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA=AVX512_CORE, ...): 'ALL' when none is set."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 in hardware (CUDA with bf16; a CPU with AVX-512-bf16 or AMX), not emulated."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    if dev.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if dev.type == "cpu":
        # an ISA cap (ONEDNN_MAX_CPU_ISA=AVX512_CORE, ...) turns oneDNN's bf16 kernels into emulation
        cap = _isa_cap()
        capped = cap not in ("ALL", "DEFAULT") and not any(s in cap for s in ("BF16", "AMX"))
        return not capped and bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))
    return False


@dataclass
class PrecisionReport:
    """Which precision a pass runs with and why (hardware flags; max |dp| of the choice vs fp32 on a real batch)."""

    device: str
    requested: str
    choice: str
    timings: dict[str, float] = field(default_factory=dict)
    max_prob_diff: dict[str, float] = field(default_factory=dict)
    cpu_flags: list[str] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "requested": self.requested,
            "choice": self.choice,
            "timings_s": {k: round(v, 5) for k, v in self.timings.items()},
            "max_prob_diff": {k: round(v, 5) for k, v in self.max_prob_diff.items()},
            "cpu_flags": self.cpu_flags,
            "reason": self.reason,
        }


def time_min(fn: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def probe_precision(
    device: str | torch.device,
    requested: str = "auto",
    *,
    forward: Callable[[str], torch.Tensor] | None = None,
    tolerance: float = 0.02,
) -> PrecisionReport:
    """The precision a pass runs with: a requested one (fp32, bf16, int8), or for 'auto' the hardware's choice
    (`hardware_precision`: flags, never a timing, so the load on the machine cannot change an output) kept only if a
    real batch (`forward(precision)` -> probs) stays within `tolerance` of fp32. int8 is never chosen for you: request
    it (benchmarks/extraction.py measures every precision on your machine and says which is fastest)."""
    dev = device if isinstance(device, torch.device) else resolve_device(str(device))
    flags = cpu_flags() if dev.type == "cpu" else []
    if requested not in ("auto", "openvino-auto", *PRECISIONS):
        raise MedrankError(f"precision '{requested}': expected auto, openvino-auto, {', '.join(PRECISIONS)}")
    if requested == "openvino-auto":
        choice = openvino_auto(dev)
        return PrecisionReport(str(dev), requested, choice, cpu_flags=flags, reason=f"requested: {choice} by the flags")
    if requested != "auto":
        if requested not in ("fp32", "bf16") and dev.type != "cpu":
            raise MedrankError(f"precision {requested} runs on CPU only")
        return PrecisionReport(str(dev), requested, requested, cpu_flags=flags, reason="requested")
    choice = hardware_precision(dev)
    reason = (
        f"hardware: {choice} ({'bf16 faster than fp32 by its flags' if choice == 'bf16' else 'no fast bf16 kernels'})"
    )
    diffs: dict[str, float] = {}
    if choice != "fp32" and forward is not None:
        try:
            ref, got = forward("fp32").float().cpu(), forward(choice).float().cpu()
            diffs[choice] = float((got - ref).abs().max())
        except (RuntimeError, NotImplementedError) as e:
            log.info("precision %s unavailable here: %s", choice, e)
            diffs[choice] = float("inf")
        if diffs[choice] > tolerance:
            reason = f"{choice} rejected: max prob diff {diffs[choice]:.3f} > {tolerance}; fp32"
            choice = "fp32"
    log.info("precision on %s (flags %s): %s", dev, ",".join(flags) or "-", reason)
    return PrecisionReport(str(dev), requested, choice, {}, diffs, flags, reason)


def bf16_faster(device: str | torch.device) -> bool:
    """Whether bf16 beats fp32 on `device`, by its flags alone: CUDA with bf16; a CPU with AMX-bf16 (Intel Sapphire
    Rapids on), or an AMD CPU with AVX-512-bf16 (Zen 4 on: 1.86x sentence-transformers in bf16 on the developers' EPYC).
    An Intel CPU with AVX-512-bf16 but no AMX computes bf16 natively yet slower than fp32 (a Xeon measured here: bf16
    matmul peak 155 GFLOP/s against fp32's 288, extraction 94 against 150 pairs/s)."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    if dev.type == "cuda" or not native_bf16(dev):
        return native_bf16(dev)
    cap = _isa_cap()
    amx = "amx_bf16" in cpu_flags() and (cap in ("ALL", "DEFAULT") or "AMX" in cap)
    return amx or cpu_vendor() == "AuthenticAMD"


def hardware_precision(device: str | torch.device, requested: str = "auto") -> str:
    """fp32 or bf16: a requested one, or ('auto') bf16 where its flags say `device` computes it faster than fp32
    (`bf16_faster`), else fp32. Decided by the hardware, never by a timing inside a stage: load on shared cores flipped
    timed choices, and every stage downstream followed the flip. The choice is recorded in each stage's metrics."""
    if requested not in ("auto", "fp32", "bf16", "openvino-auto", "openvino-bf16", "openvino-fp32"):
        raise MedrankError(
            f"precision '{requested}': expected auto, fp32, bf16, openvino-auto, openvino-bf16 or openvino-fp32"
        )
    if requested == "openvino-auto":
        return openvino_auto(device)
    if requested != "auto":
        if requested.startswith("openvino") and torch.device(str(device)).type != "cpu":
            raise MedrankError(f"precision {requested} runs on CPU only")
        return requested
    return "bf16" if bf16_faster(device) else "fp32"


def openvino_auto(device: str | torch.device) -> str:
    """'openvino-auto': the OpenVINO path at the hardware's precision on a CPU (openvino-bf16 where `bf16_faster` by
    its flags, else openvino-fp32); on a GPU, where OpenVINO does not run, torch's 'auto' choice."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    torch_choice = hardware_precision(dev)
    return f"openvino-{torch_choice}" if dev.type == "cpu" else torch_choice


def pick_precision(device: str | torch.device, requested: str = "auto", **probe_kw: Any) -> str:
    """The precision to run with on `device`: a requested one, or the hardware's ('auto'; see probe_precision)."""
    return probe_precision(device, requested, **probe_kw).choice
