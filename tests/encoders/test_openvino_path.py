"""The OpenVINO inference path (precision openvino-bf16 / openvino-fp32) on tiny models: within tolerance of torch's
fp32, the same bits on a repeat, its own cache namespace, never picked by auto, and one error line without its
runtime."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from medrank.core.errors import MedrankError
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.encoders.extract import cached_extract, choose_precision, open_cache
from medrank.encoders.sentence_encoder import SentenceEncoder

pytest.importorskip("openvino")
pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared

PAIRS = [("a b c", "c d"), ("e f", "g h i j"), ("a b c", "c d"), ("k", "l m n o p q")]


@pytest.fixture(scope="module")
def nli(tiny_base) -> CrossEncoder:
    """A 3-way head (seeded) on the tiny random BERT base."""
    return CrossEncoder.from_base(str(tiny_base), 3, 48, device="cpu", precision="fp32")


@pytest.mark.parametrize("precision", ["openvino-fp32", "openvino-bf16"])
def test_cross_encoder_probs_and_pooled_vectors_within_tolerance_of_fp32(nli, precision):
    ref, ref_emb = nli.predict(PAIRS, precision="fp32", return_embeddings=True, show_progress=False)
    got, emb = nli.predict(PAIRS, precision=precision, return_embeddings=True, show_progress=False)
    assert got.shape == ref.shape and emb.shape == ref_emb.shape and got.dtype == np.float32
    tol = 1e-4 if precision == "openvino-fp32" else 0.02
    assert np.abs(got - ref).max() <= tol
    assert np.abs(emb - ref_emb).max() <= max(tol, 0.05 * np.abs(ref_emb).max())
    again = nli.predict(PAIRS[::-1], precision=precision, show_progress=False)[::-1]
    assert np.array_equal(again, got)  # the same bits whatever the order the pairs come in
    assert nli.last_predict_stats["precision"] == precision


def test_streams_give_the_same_bits_as_one_stream_in_any_finishing_order(nli):
    """The stage's threads run as streams of one thread each, a batch in flight per stream: each batch's outputs
    are the same bits as on one stream, and map returns every key once whatever order the batches finish in."""
    import torch

    from medrank.encoders.openvino_path import OpenVinoModel, PairLogitsAndPooled
    from medrank.encoders.runtime import runtime_info

    enc = nli._encode(PAIRS * 6)
    batches = [np.arange(i, i + 3) for i in range(0, 24, 3)]
    example = nli._collate(enc, batches[0][:2])
    outputs = {}
    for streams in (1, 2):
        model = OpenVinoModel(PairLogitsAndPooled(nli.model.eval()), example, "openvino-bf16", streams=streams)
        assert model.compiled.get_property("NUM_STREAMS") == streams
        got = dict(model.map((b, nli._collate(enc, batches[b])) for b in range(len(batches))))
        assert sorted(got) == list(range(len(batches)))
        outputs[streams] = got
    for b in range(len(batches)):
        assert all(torch.equal(x, y) for x, y in zip(outputs[1][b], outputs[2][b]))
    assert runtime_info("cpu", precision="openvino-bf16")["openvino_streams"] == torch.get_num_threads()


def test_sentence_encoder_vectors_within_tolerance_of_fp32(tiny_base):
    bi = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    texts = ["what causes anemia", "leg pain: a cramp or an injury", "x"]
    ref = bi.encode(texts, "fp32")
    got = bi.encode(texts, "openvino-bf16")
    assert got.shape == ref.shape and np.abs((got * ref).sum(1) - 1).max() < 0.02
    assert np.abs(bi.encode(texts, "openvino-fp32") - ref).max() < 1e-4


@pytest.mark.parametrize("precision", ["fp32", "openvino-fp32", "openvino-bf16"])
def test_a_served_call_is_shared_by_the_streams_with_the_same_bits_for_any_share(tiny_base, precision):
    """Issue 65: a served question's texts made one batch, padded to the longest, on one of the OpenVINO streams.
    Served (`parts` > 1), each text is padded to its own width and the call is shared by the streams; the vectors are
    the same bits for any number of parts (the server's threads), in any input order, and within float noise of the
    stages' batching (on the real mpnet, OpenVINO fp32: equal, or within 1.1e-7)."""
    bi = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    texts = ["what causes anemia in older adults", "leg pain", "x"] + [f"answer {i} " + "word " * i for i in range(8)]
    stage = bi.encode(texts, precision)
    bi.parts = 2
    served = bi.encode(texts, precision)
    assert np.abs(served - stage).max() < 1e-5
    for parts in (3, 11):
        bi.parts = parts
        assert np.array_equal(bi.encode(texts, precision), served), parts
        assert np.array_equal(bi.encode(texts[::-1], precision), served[::-1]), parts


@pytest.mark.parametrize("precision", ["openvino-fp32", "openvino-bf16"])
def test_an_openvino_request_holds_a_bounded_share_of_a_batch_with_the_same_bits(tiny_base, monkeypatch, precision):
    """Issue 63 (peak RSS): each OpenVINO stream keeps the activations of the request it runs, so a request holds at
    most batching.OPENVINO_REQUEST_TOKENS; a batch's rows are split, each chunk padded to the batch's width, and the
    vectors stay the same bits (all-mpnet-base-v2 at width 256: 3.0 -> 2.1 GiB peak, the bits equal)."""
    from medrank.encoders import batching

    bi = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    texts = ["what causes anemia in older adults", "leg pain", "x"] + [f"answer {i} " + "word " * i for i in range(20)]
    whole: list[int] = []
    ref = bi.encode(texts, precision, batch_size=16, progress=whole.append)
    monkeypatch.setattr(batching, "OPENVINO_REQUEST_TOKENS", 32)  # one row a request at width 32, two at 16
    split: list[int] = []
    assert np.array_equal(bi.encode(texts, precision, batch_size=16, progress=split.append), ref)
    assert len(whole) == 2 and len(split) > 2 * len(whole) and sum(split) == len(texts)


@pytest.mark.parametrize("precision", ["openvino-fp32", "openvino-bf16"])
def test_a_cross_encoder_request_holds_a_bounded_share_of_a_batch_with_the_same_bits(nli, monkeypatch, precision):
    """The cross-encoder's OpenVINO path sends the same bounded requests as the sentence encoder's (one helper,
    batching.openvino_requests): a batch's pairs split, each chunk at the batch's width, probabilities and pooled
    vectors the same bits."""
    from medrank.encoders import batching
    from medrank.encoders.openvino_path import OpenVinoModel

    pairs = PAIRS + [(f"question {i} " + "word " * i, "an answer " + "token " * (i % 5)) for i in range(20)]
    sizes: list[int] = []
    real_map = OpenVinoModel.map

    def counted(self, keyed):
        return real_map(self, ((k, sizes.append(len(batch["input_ids"])) or batch) for k, batch in keyed))

    monkeypatch.setattr(OpenVinoModel, "map", counted)
    ref = nli.predict(pairs, batch_size=16, precision=precision, return_embeddings=True, show_progress=False)
    whole, sizes[:] = list(sizes), []
    monkeypatch.setattr(batching, "OPENVINO_REQUEST_TOKENS", 32)  # one pair a request at width 32, two at 16
    got = nli.predict(pairs, batch_size=16, precision=precision, return_embeddings=True, show_progress=False)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
    assert len(whole) == 2 and len(sizes) > 2 * len(whole) and sum(sizes) == sum(whole) == len(set(pairs))
    assert max(sizes) <= 2


@pytest.mark.parametrize("precision", ["fp32", "openvino-fp32"])
def test_the_sentence_encoder_reports_progress_per_batch_the_openvino_path_too(
    tiny_base, tmp_path, monkeypatch, precision
):
    """Issue 63: bienc showed no line for 11 minutes: its bar moved once per 16,384-text shard, after the shard."""
    from medrank.encoders.extract import cached_sentence_embeddings

    bi = SentenceEncoder(str(tiny_base), device="cpu", max_length=32)
    texts = [f"text number {i} " + "word " * (i % 7) for i in range(40)]
    done: list[int] = []
    out = bi.encode(texts, precision, batch_size=8, progress=done.append)
    assert len(done) == 5 and sum(done) == len(texts)  # one call per batch, as each is done
    assert np.array_equal(out, bi.encode(texts, precision, batch_size=8))  # progress changes no bit
    updates: list[int] = []

    class Bar:  # the tqdm bar cached_sentence_embeddings moves
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            updates.append(n)

    monkeypatch.setattr("medrank.encoders.extract.tqdm", Bar)
    cached_sentence_embeddings(bi, texts, tmp_path, precision, 8, shard_size=None)
    assert len(updates) == 5 and sum(updates) == len(texts)


def test_the_runtime_is_part_of_the_cache_namespace_and_auto_never_picks_it(tmp_path, nli):
    torch_cache = open_cache(nli, "nli", tmp_path, "bf16")
    ov_cache = open_cache(nli, "nli", tmp_path, "openvino-bf16")
    assert torch_cache.dir != ov_cache.dir and ov_cache.dir.name.endswith("-openvino-bf16-L48")
    out, stats = cached_extract(nli, PAIRS, ov_cache, "openvino-bf16", show_progress=False)
    assert stats.computed == 3  # nothing read from the torch path's namespace
    # auto reuses a cached precision, but never the OpenVINO path's: it is chosen only by name
    assert choose_precision(nli, "auto", tmp_path, "nli", PAIRS) in ("fp32", "bf16")


def test_a_local_pool_runs_the_openvino_path_in_this_process(tmp_path, nli, monkeypatch):
    """Forked workers would each convert the model again for one stream: the OpenVINO path computes every shard in
    this process (its streams are the parallelism), with the bits of no pool at all."""
    from medrank.core import forking
    from medrank.encoders.distributed import LocalPool, forked_workers

    def no_fork(*_a, **_k):
        raise AssertionError("the OpenVINO path forked")

    monkeypatch.setattr(forking, "fork_pool", no_fork)
    pairs = [(f"a {i} b", f"c d {i % 3}") for i in range(12)]

    def extract(folder: str, backend=None):
        cache = open_cache(nli, "nli", tmp_path / folder, "openvino-bf16")
        return cached_extract(nli, pairs, cache, "openvino-bf16", shard_size=4, show_progress=False, backend=backend)

    alone, _ = extract("alone")
    pooled, stats = extract("pooled", LocalPool(2))
    assert stats.computed == 12 and all(np.array_equal(alone[k], pooled[k]) for k in alone)
    assert forked_workers(LocalPool(2), "openvino-bf16") is None and forked_workers(LocalPool(2), "bf16") == 2


def test_openvino_auto_is_the_hardware_precision_on_the_openvino_path(monkeypatch, tmp_path, nli, tiny_base):
    """openvino-auto: openvino-bf16 where bf16 is faster by the CPU's flags, else openvino-fp32; torch's auto choice
    on a GPU (OpenVINO runs on the CPU only). The cache namespace is the resolved name, never "openvino-auto"."""
    import torch

    from medrank.encoders import hardware

    for fast, want in [(True, "openvino-bf16"), (False, "openvino-fp32")]:
        monkeypatch.setattr(hardware, "bf16_faster", lambda _dev, fast=fast: fast)
        assert hardware.hardware_precision("cpu", "openvino-auto") == want
        assert hardware.probe_precision("cpu", "openvino-auto").choice == want
        assert choose_precision(nli, "openvino-auto", tmp_path, "nli", PAIRS) == want
        assert hardware.hardware_precision(torch.device("cuda"), "openvino-auto") == ("bf16" if fast else "fp32")
    ce = CrossEncoder.from_base(str(tiny_base), 3, 48, device="cpu", precision="openvino-auto")
    assert ce.resolve_precision(PAIRS) == "openvino-fp32"


def test_a_missing_runtime_is_one_error_line(monkeypatch, tiny_base):
    real_import = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError("No module named 'openvino'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    fresh = CrossEncoder.from_base(str(tiny_base), 3, 48, device="cpu", precision="fp32")
    with pytest.raises(
        MedrankError, match=r"^precision openvino-bf16 needs the OpenVINO runtime.*pip install openvino"
    ):
        fresh.predict(PAIRS, precision="openvino-bf16", show_progress=False)


def test_params_refuse_openvino_without_its_runtime(monkeypatch):
    import importlib.util

    from medrank.params import EmbedParams

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "openvino" else find_spec(n, *a))
    with pytest.raises(ValueError, match="precision openvino-bf16 needs the OpenVINO runtime"):
        EmbedParams(precision="openvino-bf16")
    assert EmbedParams(precision="bf16").precision == "bf16"


def test_openvino_runs_on_the_cpu_only():
    import torch

    from medrank.encoders.hardware import hardware_precision, probe_precision

    with pytest.raises(MedrankError, match="precision openvino-bf16 runs on CPU only"):
        probe_precision(torch.device("cuda"), "openvino-bf16")
    with pytest.raises(MedrankError, match="precision openvino-fp32 runs on CPU only"):
        hardware_precision(torch.device("cuda"), "openvino-fp32")
