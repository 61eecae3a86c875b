"""Seal model and step folders saved before their side files were checksummed (issue 46), instead of re-training:

    python -m medrank.serving.seal models/nli models/rqe models/cnn models/steps/* models/baseline models/mtl \
        models/system.json    (models/qa too where it exists)

Loading now refuses a `medrank_encoder.json`, a CNN `config.json`, a `step.json`, the MTL's `mtl.json`, the baseline's
`val.json` / `final.json` or `models/system.json` without its `record_sha256`. This
adds the record (and the sha256 of the CNN's vocab/IDF and of each step table) to folders written before. Run it only
on folders DVC reports unchanged (`dvc status` lists none of the stages that write them): the DVC cache's hashes are
then what vouches for each side file, which this tool cannot see. What it checks itself: the weights against the
fingerprint or sha256 recorded beside them, a cross-encoder's label names against its config.json (a file the
fingerprint covers), that every JSON and table reads. A folder already sealed is verified and left as it is. Then
`dvc commit` the stages whose outputs it changed.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Callable, Sequence

from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, read_sealed_json, sha256_file, write_sealed_json

log = logging.getLogger(__name__)

_REFUSE = "restore the folder with `dvc checkout` and run this again, or re-run its stage"


def _parse(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MedrankError(f"{path}: cannot read ({type(e).__name__}); {_REFUSE}") from None


def _read(path: Path) -> dict:
    record = _parse(path)
    if not isinstance(record, dict):
        raise MedrankError(f"{path}: not a JSON object; {_REFUSE}")
    return record


def seal_encoder(folder: Path) -> bool:
    """Seal a saved cross- or sentence encoder's medrank_encoder.json (and a bi_encoder folder inside). True if
    anything was written."""
    from medrank.encoders.weights import ENCODER_META, model_fingerprint, verify_saved

    wrote = False
    inner = folder / "bi_encoder"
    if (inner / ENCODER_META).is_file():
        wrote = seal_encoder(inner)
    meta_path = folder / ENCODER_META
    meta = _read(meta_path)
    if RECORD_SHA256 in meta:
        verify_saved(folder)
        return wrote
    fp = model_fingerprint(folder)
    if meta.get("fingerprint") != fp:
        raise MedrankError(f"{folder}: weights/config differ from the fingerprint in {meta_path}; {_REFUSE}")
    id2label = _read(folder / "config.json").get("id2label")
    if "label_names" in meta and isinstance(id2label, dict):
        labels = [id2label.get(str(i)) for i in range(len(id2label))]
        if labels != meta["label_names"]:
            raise MedrankError(f"{meta_path}: label_names {meta['label_names']} != config.json's {labels}; {_REFUSE}")
    write_sealed_json(meta_path, meta)
    return True


def seal_cnn(folder: Path) -> bool:
    """Seal a CNN's config.json written with only `weights_sha256` (vocab.json, idf.json unrecorded)."""
    from medrank.models.cnn import CNN_FILES, CnnConfig, CnnRanker

    path = folder / "config.json"
    raw = _read(path)
    if RECORD_SHA256 in raw:
        CnnRanker.load(folder)
        return False
    weights = raw.pop("weights_sha256", None)
    if weights != sha256_file(folder / "model.safetensors"):
        raise MedrankError(f"{folder}/model.safetensors: differs from the weights_sha256 in {path}; {_REFUSE}")
    try:
        CnnConfig(**raw)
    except TypeError as e:
        raise MedrankError(f"{path}: not a CNN config ({e}); {_REFUSE}") from None
    for name in CNN_FILES[1:]:  # vocab.json, idf.json: they read, at least
        _parse(folder / name)
    write_sealed_json(path, {**raw, "sha256": {name: sha256_file(folder / name) for name in CNN_FILES}})
    CnnRanker.load(folder)
    return True


def seal_step(folder: Path) -> bool:
    """Seal a models/steps/<step>/step.json written without checksums (its tables' sha256 added)."""
    import pandas as pd

    from medrank.steps import STEP_FILE

    path = folder / STEP_FILE
    meta = _read(path)
    if RECORD_SHA256 in meta:
        read_sealed_json(path, _REFUSE)
        return False
    names = meta.get("tables")
    if not isinstance(meta.get("params"), dict) or not isinstance(names, list):
        raise MedrankError(f"{path}: not a step file; {_REFUSE}")
    for name in names:
        try:
            pd.read_parquet(folder / f"{name}.parquet")
        except (OSError, ValueError) as e:
            raise MedrankError(f"{folder / name}.parquet: cannot read ({type(e).__name__}); {_REFUSE}") from None
    write_sealed_json(path, {**meta, "sha256": {n: sha256_file(folder / f"{n}.parquet") for n in names}})
    return True


def _seal_record(path: Path, load: Callable[[], object]) -> bool:
    """Seal one plain JSON record in place, then read it back through its loader (`load()`)."""
    raw = _read(path)
    if RECORD_SHA256 in raw:
        load()
        return False
    write_sealed_json(path, raw)
    load()
    return True


def seal_system(path: Path) -> bool:
    """Seal a models/system.json written before stage score sealed it."""
    from medrank.steps.system_step import read_system

    return _seal_record(path, lambda: read_system(path.parent))


def seal_baseline(folder: Path) -> bool:
    """Seal models/baseline's val.json and final.json."""
    from medrank.models.baseline import FittedBaseline

    wrote = False
    for name in ("val.json", "final.json"):
        if (folder / name).is_file():
            wrote = _seal_record(folder / name, lambda: FittedBaseline.load(folder / name)) or wrote
    return wrote


def seal_mtl(folder: Path) -> bool:
    """Seal models/mtl's mtl.json (its members' and val/'s too): the weights must match each record's
    model_sha256 first."""
    from medrank.models.mtl import MTLBag

    wrote = False
    for meta_path in sorted(folder.rglob("mtl.json")):
        meta = _read(meta_path)
        if RECORD_SHA256 not in meta:
            if meta.get("model_sha256") != sha256_file(meta_path.parent / "model.pt"):
                raise MedrankError(
                    f"{meta_path.parent}/model.pt: differs from the model_sha256 in {meta_path}; {_REFUSE}"
                )
            write_sealed_json(meta_path, meta)
            wrote = True
    for bag in (folder, folder / "val"):
        if (bag / "mtl.json").is_file():
            MTLBag.load(bag)
    return wrote


def seal(folder: str | Path) -> bool:
    """Seal one folder (or models/system.json) by what it holds; True if a file was written."""
    from medrank.encoders.weights import ENCODER_META
    from medrank.steps import STEP_FILE

    folder = Path(folder)
    if folder.name == "system.json" and folder.is_file():
        return seal_system(folder)
    if (folder / ENCODER_META).is_file():
        return seal_encoder(folder)
    if (folder / STEP_FILE).is_file():
        return seal_step(folder)
    if (folder / "config.json").is_file() and (folder / "vocab.json").is_file():
        return seal_cnn(folder)
    if (folder / "mtl.json").is_file():
        return seal_mtl(folder)
    if (folder / "final.json").is_file() or (folder / "val.json").is_file():
        return seal_baseline(folder)
    raise MedrankError(f"{folder}: not a saved encoder, CNN, step, MTL or baseline folder, nor a system.json")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m medrank.serving.seal", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    for folder in parser.parse_args(argv).folders:
        log.info("%s: %s", folder, "sealed" if seal(folder) else "already sealed (verified)")


if __name__ == "__main__":
    from medrank.stage.runner import run

    run(main)
