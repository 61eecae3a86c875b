"""The OpenVINO inference path of the encoders (issue 47): precision `openvino-bf16` / `openvino-fp32`.

The torch module is converted once per weights version (`openvino.convert_model`, dynamic batch and width) and
compiled for the CPU at the precision's inference hint and at torch's thread count; the graph fuses attention and
runs oneDNN's AMX / AVX-512 bf16 kernels. The same tokenized, length-sorted, padded batches go in as on the torch
path, and the outputs come back as torch tensors, so pooling and probabilities are computed as before. The
precision's name is part of each cache namespace (encoders.cache.namespace_name), so a cache written by the torch
path is never read as this path's, and the choice is explicit in params.yaml (`auto` never picks it).
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import torch

from medrank.core.errors import MedrankError

# precision name -> OpenVINO's INFERENCE_PRECISION_HINT
OPENVINO_PRECISIONS = {"openvino-bf16": "bf16", "openvino-fp32": "f32"}


def is_openvino(precision: str | None) -> bool:
    return precision in OPENVINO_PRECISIONS


def require_openvino(precision: str):
    """The openvino module, or one error line saying how to get it."""
    try:
        import openvino
    except ImportError:
        raise MedrankError(
            f"precision {precision} needs the OpenVINO runtime, which is not installed: "
            "pip install 'medrank[openvino]' (or choose fp32 / bf16)"
        ) from None
    return openvino


class PairLogitsAndPooled(torch.nn.Module):
    """A sequence classifier as one graph: (logits, the classifier's input vector) of a tokenized batch."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        sink: list[torch.Tensor] = []
        hook = self.model.classifier.register_forward_pre_hook(lambda _m, args: sink.append(args[0]))
        try:
            kw = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw).logits
        finally:
            hook.remove()
        x = sink[0]
        return logits, (x[:, 0] if x.dim() == 3 else x)  # RoBERTa-style heads take the sequence


class LastHidden(torch.nn.Module):
    """A bare encoder as one graph: its last hidden states of a tokenized batch (pooled outside, as on torch)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OpenVinoModel:
    """A compiled OpenVINO model of a torch module: call it with the torch path's batch (a dict of int64 tensors);
    returns its outputs as float32 torch tensors."""

    def __init__(self, module: torch.nn.Module, example: dict[str, torch.Tensor], precision: str) -> None:
        ov = require_openvino(precision)
        self.names = list(example)
        with torch.no_grad(), warnings.catch_warnings():
            # the trace fixes Python-level branches (padding, causal) that are constant for these encoders
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            graph = ov.convert_model(module.eval(), example_input={k: v.cpu() for k, v in example.items()})
        config = {
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
            "INFERENCE_NUM_THREADS": torch.get_num_threads(),  # the stage's explicit thread count, as torch's
            "PERFORMANCE_HINT": "LATENCY",  # one stream: batches one after another, as on the torch path
        }
        self.compiled = ov.Core().compile_model(graph, "CPU", config)
        self.request = self.compiled.create_infer_request()

    def __call__(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        got = self.request.infer({k: batch[k].cpu().numpy() for k in self.names})
        return [torch.from_numpy(np.array(got[o], dtype=np.float32)) for o in self.compiled.outputs]


def openvino_model(
    precision: str, device: torch.device, build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]
) -> OpenVinoModel:
    """Convert and compile `build()`'s (module, example batch) for `precision`; the CPU only."""
    if device.type != "cpu":
        raise MedrankError(f"precision {precision} runs on the CPU only (device {device}): choose fp32 / bf16 there")
    module, example = build()
    return OpenVinoModel(module, example, precision)
