"""The low-precision copies an encoder predicts with (`PrecisionCopies`): int8 (per-channel int8 Linear layers with
fp32 outlier channels, the sensitive layers kept in fp32: `quantize_int8`) or bf16 weights (`bf16_linears`)."""

from __future__ import annotations

import logging
import copy
import re
from typing import Callable

import torch

from medrank.core.errors import MedrankError

log = logging.getLogger(__name__)


# Linear layers that quantize_int8 leaves in fp32: regular expressions matched against the end of a module's dotted
# name (after a '.'); they name BERT-style layers (BertModel, *ForSequenceClassification). Chosen by measurement on
# models/nli: see quantize_int8.
INT8_FP32_LAYERS: tuple[str, ...] = (
    r"layer\.\d+\.output\.dense",  # the FFN output projection: the most sensitive (below)
    r"pooler\.dense",  # one vector per pair: nothing to gain
    r"classifier",  # the head: nothing to gain
)


INT8_OUTLIER_CHANNELS = 16  # input channels per Linear kept in fp32 (at most in_features // 16)


def int8_keeps_fp32(name: str, patterns: tuple[str, ...] = INT8_FP32_LAYERS) -> bool:
    """Whether quantize_int8 leaves the Linear called `name` (dotted module path) in fp32."""
    return any(re.search(rf"(^|\.){p}$", name) for p in patterns)


_Quantized = tuple[
    torch.Tensor, torch.Tensor, "torch.Tensor | None"
]  # (int8 input, per-token scales, outlier channels)


class _QuantizedInput:
    """The last input quantized by a group of Int8Linear layers seen reading one tensor (a BERT layer's query, key and
    value projections): the second and third reuse the first's int8 copy instead of redoing it. Keyed on the tensor
    object (held, so its id cannot be reused) and, outside inference mode, its version counter."""

    def __init__(self) -> None:
        self.key: tuple[torch.Tensor, int] | None = None
        self.value: _Quantized | None = None

    @staticmethod
    def _version(x: torch.Tensor) -> int:
        return -1 if x.is_inference() else x._version  # inference tensors have no version counter

    def get(self, x: torch.Tensor) -> _Quantized | None:
        k = self.key
        return self.value if k is not None and k[0] is x and k[1] == self._version(x) else None

    def put(self, x: torch.Tensor, value: _Quantized) -> None:
        self.key, self.value = (x, self._version(x)), value


class Int8Linear(torch.nn.Module):
    """A Linear computed as int8 x int8 -> int32 (`torch._int_mm`, VNNI kernels on x86) for CPU inference.

    Weights: int8 with one scale per output channel. Activations: int8 with one scale per token, computed at each
    call (symmetric, max|x| / 127), so a large token does not coarsen the others as torch.ao's per-tensor scale does.
    `outliers`: input channels whose activations are systematically large (BERT's LayerNorm outputs have a few, in
    every token); they are left out of the token scales and multiplied in fp32 with their exact weights, so they do
    not coarsen the step of every token's other channels. `shared`: the quantized-input cache of the layers seen
    reading the same tensor (same outlier channels, so the same int8 copy).
    """

    def __init__(
        self, linear: torch.nn.Linear, outliers: torch.Tensor | None = None, shared: _QuantizedInput | None = None
    ) -> None:
        super().__init__()
        w = linear.weight.detach().to("cpu", torch.float32)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        idx = torch.zeros(0, dtype=torch.long) if outliers is None else outliers.to("cpu", torch.long)
        keep = torch.ones(self.in_features)
        keep[idx] = 0.0
        w_int = w * keep  # outlier channels: zero in the int8 part, exact in the fp32 part
        scale = w_int.abs().amax(dim=1).clamp_min(1e-12) / 127
        bias = None if linear.bias is None else linear.bias.detach().to("cpu", torch.float32)
        self.register_buffer(
            "weight_int8", torch.round(w_int / scale[:, None]).to(torch.int8).t().contiguous()
        )  # (in, out)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", bias.clone() if bias is not None else None)
        self.register_buffer("outliers", idx)
        self.register_buffer("keep", keep if len(idx) else None)
        self.register_buffer("weight_outliers", w[:, idx].t().contiguous() if len(idx) else None)  # (k, out) fp32
        self.shared = shared

    def _quantize(self, x2: torch.Tensor) -> _Quantized:
        xm = x2 * self.keep if self.keep is not None else x2.clone()
        scale = (
            torch.maximum(xm.amax(dim=1, keepdim=True), xm.amin(dim=1, keepdim=True).neg_()).clamp_min_(1e-12).div_(127)
        )
        xo = x2.index_select(1, self.outliers) if self.keep is not None else None
        return xm.div_(scale).round_().to(torch.int8), scale, xo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()
        got = self.shared.get(x) if self.shared is not None else None
        if got is None:
            got = self._quantize(x2)
            if self.shared is not None:
                self.shared.put(x, got)
        xq, scale, xo = got
        y = torch._int_mm(xq, self.weight_int8) * self.weight_scale
        y.mul_(scale)
        if xo is not None:
            y.addmm_(xo, self.weight_outliers)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, outlier channels in fp32={len(self.outliers)}"


def _calibrate(
    model: torch.nn.Module, names: list[str], seed: int = 0
) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """Per Linear in `names`, the input channels with the largest |activation| on a fixed batch of random token ids
    (data-free calibration: BERT's outlier channels show on any input), and the groups of Linears that read one
    tensor. Nothing where the model cannot be run so."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    peak: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}  # held to the end: ids of freed tensors could be reused

    def hook(name: str) -> Callable[[torch.nn.Module, tuple], None]:
        def record(_mod: torch.nn.Module, args: tuple) -> None:
            inputs[name] = args[0]
            a = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0)
            peak[name] = torch.maximum(peak[name], a) if name in peak else a

        return record

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    try:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(min(1000, vocab // 2), vocab, (16, 64), generator=g)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception as e:  # not a token-id model: no outlier channels, plain per-token int8
        log.warning(
            "int8: no calibration forward for %s (%s): no fp32 outlier channels", type(model).__name__, type(e).__name__
        )
        return {}, []
    finally:
        for h in handles:
            h.remove()
    channels = {n: peak[n].topk(min(INT8_OUTLIER_CHANNELS, peak[n].numel() // 16)).indices.sort().values for n in peak}
    groups: list[list[str]] = []
    for n in inputs:
        same = next((g for g in groups if inputs[g[0]] is inputs[n]), None)
        if same is None:
            groups.append([n])
        else:
            same.append(n)
    return channels, [g for g in groups if len(g) > 1]


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of `model` for int8 inference (the model itself is untouched): every Linear becomes an `Int8Linear`
    (int8 weights per output channel, int8 activations per token, the 16 input channels with the largest activations
    on a random-token calibration batch in fp32), except those matching INT8_FP32_LAYERS, which stay fp32 nn.Linear:
    the FFN output projections, the pooler and the classifier.

    Measured on models/nli (MiniLM-L6 NLI, 2026-11-24, real sentence pairs, max |Δp| vs fp32 over 400 pairs; the
    precision probe accepts 0.02): torch.ao dynamic int8 of every Linear (the previous recipe: per-tensor weights,
    7-bit per-tensor activations) 0.21; with per-channel weights 0.22, and 8-bit activations 0.068; per-token
    activations 0.030, + the outlier channels 0.016 (all other Linears int8). Leaving one group of Linears in fp32
    with everything else int8 showed the FFN output projection as the most sensitive: its weights alone, in int8,
    move p by up to 0.029 (a few input columns are 30-55x the median, so their rows' int8 steps are coarse), and its
    inputs (GELU outputs) have per-token spikes that no fixed channel set catches. With it in fp32: 0.006; over
    three 1000-pair samples 0.009, 0.014, 0.014 (bf16 0.003-0.005), at 1.29x fp32's pairs/s on 2 cores (bf16: 1.9x;
    benchmarks/results/extraction-int8-2026-11-24.txt). On models/rqe the same recipe is 0.058 off (bf16 0.018): rejected
    there by the probe, which checks each model on its own batch. A layer that reads the same tensor as the one before (query,
    key, value) reuses its int8 copy (+5% pairs/s); the copy keeps that cache, so run one forward at a time on it.
    """
    if not isinstance(model, torch.nn.Module):
        raise MedrankError(f"quantize_int8: expected a torch.nn.Module, got {type(model).__name__}")
    out = copy.deepcopy(model).to("cpu").float().eval()
    names = [n for n, m in out.named_modules() if isinstance(m, torch.nn.Linear) and not int8_keeps_fp32(n)]
    outliers, groups = _calibrate(out, names)
    shared: dict[str, _QuantizedInput] = {}
    for group in groups:  # one input, so one set of outlier channels and one int8 copy
        cache = _QuantizedInput()
        for n in group:
            outliers[n], shared[n] = outliers[group[0]], cache
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = out.get_submodule(parent) if parent else out
        setattr(owner, child, Int8Linear(getattr(owner, child), outliers.get(name), shared.get(name)))
    return out


def bf16_linears(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose Linear weights and biases are stored in bf16, every other tensor shared with `model`.

    Under CPU/CUDA bf16 autocast a Linear casts its fp32 weight to bf16 at every call (autocast caches the cast only
    for weights that require grad); stored in bf16 the cast is skipped and the outputs are the same bits, because
    the cast is the same round-to-nearest either way (tests/encoders check it). Only for use under that autocast."""
    shared = {
        id(t): t
        for m in model.modules()
        if not isinstance(m, torch.nn.Linear)
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    }
    out = copy.deepcopy(model, shared)
    for m in out.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(m.weight.detach().to(torch.bfloat16), requires_grad=False)
            if m.bias is not None:
                m.bias = torch.nn.Parameter(m.bias.detach().to(torch.bfloat16), requires_grad=False)
    return out.eval()


def _weights_version(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter of `model` is updated in place (an optimizer step) or replaced."""
    return (id(model), *((id(p), p._version) for p in model.parameters()))


class PrecisionCopies:
    """Mixin of the encoders: `inference_model(precision)` is `self.model`, or a copy made for the precision on first
    use: int8 (`quantize_int8`, kept until `_int8_model` is reset, after training or to free memory) or bf16
    (`bf16_linears`, rebuilt when the weights have changed since, e.g. between evaluations during training);
    `openvino_model(precision, build)` the OpenVINO path's compiled model, rebuilt likewise."""

    model: torch.nn.Module
    _int8_model: torch.nn.Module | None = None
    _bf16_model: tuple[tuple, torch.nn.Module] | None = None
    _openvino_models: dict[str, tuple[tuple, object]] | None = None

    def openvino_model(self, precision: str, build: Callable[[], tuple[torch.nn.Module, dict]]):
        """The OpenVINO path's compiled model for `precision` (encoders.openvino_path), converted from `build()`'s
        (module, example batch) on first use and again when the weights have changed since."""
        from medrank.encoders.openvino_path import openvino_model

        version = _weights_version(self.model)
        if self._openvino_models is None:
            self._openvino_models = {}
        cached = self._openvino_models.get(precision)
        if cached is None or cached[0] != version:
            cached = self._openvino_models[precision] = (version, openvino_model(precision, self.device, build))
        return cached[1]

    def inference_model(self, precision: str) -> torch.nn.Module:
        if precision == "bf16":
            version = _weights_version(self.model)
            if self._bf16_model is None or self._bf16_model[0] != version:
                self._bf16_model = (version, bf16_linears(self.model))
            return self._bf16_model[1]
        if precision != "int8":
            return self.model
        if self._int8_model is None:
            self._int8_model = quantize_int8(self.model)
        return self._int8_model
