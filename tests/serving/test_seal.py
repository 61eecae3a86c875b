"""medrank.serving.seal: folders saved before side files were checksummed are refused at load, and sealed without re-training
(weights checked against their own record first)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, sha256_file, write_json
from medrank.serving.seal import main as seal_main

pytestmark = pytest.mark.usefixtures("one_thread")


def _unseal(path: Path, drop: tuple[str, ...] = (), **add) -> None:
    """Rewrite a record as the previous version saved it: no record_sha256 (nor `drop`), `add` added."""
    record = json.loads(path.read_text())
    write_json(path, {**{k: v for k, v in record.items() if k not in (RECORD_SHA256, *drop)}, **add})


def test_old_encoder_cnn_and_step_folders_are_refused_then_sealed(tiny_base, tmp_path):
    from medrank.data import squad_sentences as ss
    from medrank.encoders.cross_encoder import META_FILE, CrossEncoder
    from medrank.models.cnn import CnnRanker
    from medrank.models.word2vec import WordVectors
    from medrank.params import Params, step_params
    from medrank.steps import load_step, save_step

    ce = CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=5, precision="fp32")
    ce.save(tmp_path / "rqe", extra_meta={"task": "rqe"})
    _unseal(tmp_path / "rqe" / META_FILE)
    vectors = WordVectors(["flu", "virus"], np.ones((2, 4), dtype="f4"))
    CnnRanker.create(vectors, ss.Idf({"flu": 1}, 2), {"n_filters": 4, "hidden_size": 4, "conv_width": 3}, seed=0).save(
        tmp_path / "cnn"
    )
    _unseal(
        tmp_path / "cnn" / "config.json", ("sha256",), weights_sha256=sha256_file(tmp_path / "cnn/model.safetensors")
    )
    docs = pd.DataFrame({"doc": ["a", "b"]})
    save_step("retrieve", step_params(Params(), "retrieve"), {"medquad": docs}, models_dir=tmp_path)
    step = tmp_path / "steps" / "retrieve"
    _unseal(step / "step.json", ("sha256",))

    for load in (
        lambda: CrossEncoder.load(tmp_path / "rqe", device="cpu", lazy=True, task="rqe"),
        lambda: CnnRanker.load(tmp_path / "cnn"),
        lambda: load_step("retrieve", tmp_path),
    ):
        with pytest.raises(MedrankError, match="no record_sha256"):
            load()
    seal_main([str(tmp_path / "rqe"), str(tmp_path / "cnn"), str(step)])
    assert CrossEncoder.load(tmp_path / "rqe", device="cpu", lazy=True, task="rqe").num_labels == 2
    assert CnnRanker.load(tmp_path / "cnn").encoder.words[-2:] == ["flu", "virus"]
    assert load_step("retrieve", tmp_path).tables["medquad"].equals(docs)
    seal_main([str(tmp_path / "rqe"), str(tmp_path / "cnn"), str(step)])  # sealed already: verified, unchanged


def test_seal_refuses_weights_that_differ_from_their_record(tiny_base, tmp_path):
    from medrank.encoders.cross_encoder import META_FILE, CrossEncoder

    CrossEncoder.from_base(str(tiny_base), 2, 32, device="cpu", seed=5, precision="fp32").save(tmp_path / "m")
    _unseal(tmp_path / "m" / META_FILE, label_names=["1", "0"])  # reordered by hand before sealing
    with pytest.raises(MedrankError, match=r"label_names \['1', '0'\] != config.json's \['0', '1'\]"):
        seal_main([str(tmp_path / "m")])
    _unseal(tmp_path / "m" / META_FILE, label_names=["0", "1"])
    w = tmp_path / "m" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(MedrankError, match="weights/config differ from the fingerprint"):
        seal_main([str(tmp_path / "m")])
    assert RECORD_SHA256 not in json.loads((tmp_path / "m" / META_FILE).read_text())


def test_old_decision_files_are_refused_then_sealed(tmp_path, monkeypatch, capsys):
    """Issue 64: models/system.json, models/mtl/mtl.json (its members' too) and models/baseline/*.json are sealed by
    their stages; ones saved before are refused by `medrank rank` until sealed in place, which changes no decision."""
    from medrank.cli import main
    from tests.conftest import error_lines
    from tests.helpers.tiny_project import FIXTURES, build_tiny_project, use_tiny_baseline

    root = build_tiny_project(tmp_path / "proj")
    use_tiny_baseline(root)  # system.json: the baseline; models/mtl stays beside it
    models = root / "models"
    monkeypatch.chdir(root)
    rank = ["rank", str(FIXTURES / "rank_input.json"), "--models", str(models), "--all"]
    assert main(rank) == 0
    want = capsys.readouterr().out
    old = [models / "system.json", *sorted((models / "mtl").rglob("mtl.json")), *sorted(models.glob("baseline/*.json"))]
    for path in old:
        _unseal(path)
    with pytest.raises(SystemExit) as e:
        main(rank)
    assert e.value.code == 2 and "no record_sha256" in error_lines(capsys.readouterr().err)[0]
    seal_main([str(models / "system.json"), str(models / "mtl"), str(models / "baseline")])
    assert all(RECORD_SHA256 in json.loads(p.read_text()) for p in old)
    assert main(rank) == 0 and capsys.readouterr().out == want
    mtl_json = models / "mtl" / "mtl.json"
    _unseal(mtl_json, model_sha256="0" * 64)  # weights that do not match their record: never sealed
    with pytest.raises(MedrankError, match="model.pt: differs from the model_sha256"):
        seal_main([str(models / "mtl")])
