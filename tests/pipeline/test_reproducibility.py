"""Reproducibility on CPUs (docs/reproducibility.md): what a stage's numbers may depend on besides its params.

Fixed here: the training precision `auto` follows the hardware (not a timed probe that load can flip), training is
run-to-run identical at a fixed thread count, inference does not depend on the thread count, BLAS-threaded sklearn
fits run at a fixed BLAS thread count, word2vec (one worker) is identical across processes, and every stage
that computes with torch can say where it ran (`runtime_info`). The pipeline-level checks (a tiny `dvc repro`
re-run under another core count and another precision) are in tests/pipeline/test_pipeline_smoke.py.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from medrank.encoders import hardware, runtime
from medrank.encoders.hardware import native_bf16
from medrank.encoders.runtime import BLAS_THREADS, deterministic_torch, fixed_blas_threads, runtime_info
from medrank.encoders.cross_encoder import CrossEncoder
from tests.conftest import REPO
from tests.helpers.models import FIXTURES


@pytest.fixture(scope="module")
def pairs():
    import pandas as pd

    df = pd.read_csv(FIXTURES / "pairs.tsv", sep="\t")
    return list(zip(df["text_a"], df["text_b"])), df["label"].to_numpy()


def _fit(tiny_base, pairs, threads: int, precision: str = "fp32") -> CrossEncoder:
    x, y = pairs
    ce = CrossEncoder.from_base(
        str(tiny_base), 2, 32, device="cpu", seed=3, label_names=["no", "yes"], precision="fp32"
    )
    ce.fit(x, y, epochs=2, lr=3e-3, batch_size=8, seed=3, precision=precision, threads=threads, show_progress=False)
    return ce


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_training_is_run_to_run_identical_at_a_fixed_thread_count(tiny_base, pairs, restore_threads):
    assert _fit(tiny_base, pairs, 1).fingerprint == _fit(tiny_base, pairs, 1).fingerprint


def test_train_precision_auto_follows_the_hardware_not_a_timing(tiny_base, pairs, monkeypatch, restore_threads):
    """`auto` trains in bf16 exactly where the CPU's flags say bf16 beats fp32 (hardware.bf16_faster); nothing is timed (a timed choice flipped
    with the load on shared cores, and the weights with it)."""

    def no_timing(*a, **kw):
        if kw.get("forward") is not None:
            raise AssertionError("the training precision must not be chosen by timing")
        return hardware.PrecisionReport("cpu", a[1] if len(a) > 1 else "auto", "fp32")

    monkeypatch.setattr("medrank.encoders.cross_encoder.probe_precision", no_timing)
    ce = _fit(tiny_base, pairs, 1, precision="auto")
    assert ce.train_precision == ("bf16" if hardware.bf16_faster("cpu") else "fp32")
    # a CPU whose oneDNN is capped below bf16 (an emulated older CPU) trains in fp32
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert not native_bf16("cpu") and _fit(tiny_base, pairs, 1, precision="auto").train_precision == "fp32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert native_bf16("cpu") == bool({"avx512_bf16", "amx_bf16"} & set(hardware.cpu_flags()))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_inference_does_not_depend_on_the_thread_count(tiny_base, pairs, precision, restore_threads):
    """Stages that score with every core (embed, retrieve, bienc) give the same bits on a 1-core and a 2-core machine."""
    x, _ = pairs
    ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=3, precision=precision)
    out = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        out[n] = ce.predict(x, batch_size=16, show_progress=False, precision=precision)
    np.testing.assert_array_equal(out[1], out[2])


def test_deterministic_torch_restores_the_global_state():
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    with deterministic_torch():
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    ) == before


def test_fixed_blas_threads_whatever_the_core_count():
    from threadpoolctl import threadpool_info, threadpool_limits

    for outer in (1, 4):
        with threadpool_limits(outer, user_api="blas"), fixed_blas_threads():
            blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
            assert blas and all(i["num_threads"] == BLAS_THREADS for i in blas)


def test_runtime_info_names_flags_kernels_and_isa_overrides(monkeypatch):
    for k in runtime._ISA_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    info = runtime_info("cpu", precision="bf16")
    assert info["cpu_flags"] == hardware.cpu_flags() and info["precision"] == "bf16"
    assert info["aten_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "NO AVX", "SVE256", "SVE")
    assert info["isa_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"} and info["threads"] == torch.get_num_threads()


def test_word2vec_is_identical_across_processes(tmp_path):
    """gensim trains on worker threads that race for batches (its default, 3 workers, gave different vectors run to
    run: the CNN's labels moved with them); one worker, and a hash that is not salted per process (gensim seeds
    vectors of words added later from it), give the same vectors in two processes with different hash salts."""
    import inspect
    import os

    from medrank.models.word2vec import train_word2vec

    assert inspect.signature(train_word2vec).parameters["workers"].default == 1  # what stage cnn_word2vec uses
    code = (
        "import sys, numpy as np\nfrom medrank.models.word2vec import train_word2vec\n"
        "texts = ['the cat sat on the mat. the dog sat on the log.', 'a cat and a dog met on a mat. the log was wet.'] * 500\n"
        "v = train_word2vec(texts, dim=8, window=2, min_count=1, epochs=2, seed=13)\n"
        "np.save(sys.argv[1], v.vectors); open(sys.argv[1] + '.txt', 'w').write(' '.join(v.words))\n"
    )
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt, "PYTHONPATH": str(REPO)}
        r = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / f"{salt}.npy")], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "1.npy.txt").read_text() == (tmp_path / "2.npy.txt").read_text()
    np.testing.assert_array_equal(np.load(tmp_path / "1.npy"), np.load(tmp_path / "2.npy"))
