"""The OpenVINO inference path of the encoders (issue 47): precision `openvino-bf16` / `openvino-fp32`.

The torch module is converted once per weights version (`openvino.convert_model`, dynamic batch and width) and
compiled for the CPU at the precision's inference hint; the graph fuses attention and runs oneDNN's AMX / AVX-512
bf16 kernels. The stage's thread count runs as that many streams of one thread each, with one batch in flight per
stream (`OpenVinoModel.map`): these encoders' matrices are too small to keep two threads busy on one batch (on 2
cores 1.1x one 2-thread stream for the NLI cross-encoder, 1.0-1.3x for the mpnet bi-encoder:
benchmarks/results/extraction-openvino-streams-*, bienc-streams-*), and a batch's outputs are
the same bits whichever stream runs it. A served request's few texts would make one batch and so run on one
stream: serving cuts them into width-pure pieces that every stream shares (`encoders.batching.request_batches`).
The same tokenized, length-sorted, padded batches go in as on the torch path, and the outputs come back as torch
tensors, so pooling and probabilities are computed as before. The precision's name is part of each cache namespace
(encoders.cache.namespace_name), so a cache written by the torch path is never read as this path's, and the choice
is explicit in params.yaml (`auto` never picks it).
"""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np
import torch

from medrank.core.errors import MedrankError

K = TypeVar("K")  # a batch's key: where its outputs go

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
            "pip install openvino (or choose fp32 / bf16)"
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
    """A compiled OpenVINO model of a torch module on `streams` streams sharing `threads` threads (default: one
    thread per stream, as many as torch's thread count, the stage's explicit choice). `map` runs keyed batches
    (dicts of int64 tensors), one in flight per stream; outputs come back as float32 torch tensors."""

    def __init__(
        self,
        module: torch.nn.Module,
        example: dict[str, torch.Tensor],
        precision: str,
        streams: int | None = None,
        threads: int | None = None,
    ) -> None:
        ov = require_openvino(precision)
        self.names = list(example)
        threads = max(1, int(threads or streams or torch.get_num_threads()))  # default: one per stream
        self.streams = max(1, int(streams or threads))
        with torch.no_grad(), warnings.catch_warnings():
            # the trace fixes Python-level branches (padding, causal) that are constant for these encoders
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            graph = ov.convert_model(module.eval(), example_input={k: v.cpu() for k, v in example.items()})
        config = {
            "INFERENCE_PRECISION_HINT": OPENVINO_PRECISIONS[precision],
            "PERFORMANCE_HINT": "THROUGHPUT",
            "NUM_STREAMS": self.streams,
            "INFERENCE_NUM_THREADS": threads,  # one per stream unless asked otherwise (benchmarks/extraction.py)
        }
        self.compiled = ov.Core().compile_model(graph, "CPU", config)
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))  # capped at the cores there are
        self.jobs = ov.AsyncInferQueue(self.compiled, self.streams)
        self.n_outputs = len(self.compiled.outputs)
        self.busy = threading.Lock()  # one map at a time: the queue's callback and requests are shared

    def map(self, batches: Iterable[tuple[K, dict[str, torch.Tensor]]]) -> Iterator[tuple[K, list[torch.Tensor]]]:
        """(key, outputs) of each (key, batch), in the order they finish; up to `streams` batches run at once while
        the caller collates the next and stores the last."""
        with self.busy:
            finished: queue.SimpleQueue = queue.SimpleQueue()
            # the request's buffers are reused: copy the outputs out in the callback
            self.jobs.set_callback(
                lambda req, key: finished.put(
                    (key, [np.array(req.get_output_tensor(i).data, dtype=np.float32) for i in range(self.n_outputs)])
                )
            )
            sent = got = 0
            try:
                for key, batch in batches:
                    self.jobs.start_async({k: batch[k].cpu().numpy() for k in self.names}, key)  # waits for a stream
                    sent += 1
                    while not finished.empty():
                        got += 1
                        yield self._tensors(finished.get())
            finally:  # also when the caller stops early: nothing still running into the next map's callback
                self.jobs.wait_all()
            while not finished.empty():
                got += 1
                yield self._tensors(finished.get())
            if got != sent:
                raise MedrankError(f"OpenVINO returned {got} of {sent} batches")

    @staticmethod
    def _tensors(done: tuple[K, list[np.ndarray]]) -> tuple[K, list[torch.Tensor]]:
        key, outputs = done
        return key, [torch.from_numpy(o) for o in outputs]


def openvino_model(
    precision: str, device: torch.device, build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]
) -> OpenVinoModel:
    """Convert and compile `build()`'s (module, example batch) for `precision`; the CPU only."""
    if device.type != "cpu":
        raise MedrankError(f"precision {precision} runs on the CPU only (device {device}): choose fp32 / bf16 there")
    module, example = build()
    return OpenVinoModel(module, example, precision)
