"""Bring every pinned source into data/raw: local mirrors first, then the upstream URL; sha256 always."""

from __future__ import annotations

import errno
import fnmatch
import gzip
import hashlib
import io
import logging
import shutil
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Iterable

from tqdm import tqdm

from medrank.data.sources import SOURCES, Source
from medrank.core.errors import MedrankError
from medrank.core.io import atomic_dir, sha256_file, write_json

log = logging.getLogger(__name__)


def tar_content_digest(members: Iterable[tuple[str, bytes]]) -> str:
    """Hash of sorted 'path NUL sha256(bytes)' lines: independent of how the archive was packed."""
    lines = sorted(f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in members)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _snapshot_members(tgz: bytes, src: Source) -> list[tuple[str, bytes]]:
    """Files of a repo snapshot tarball (top folder stripped) selected by the source's glob."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        for m in tar:
            if not m.isfile():
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if fnmatch.fnmatch(rel, src.upstream_path) and rel not in src.exclude:
                out.append((rel, tar.extractfile(m).read()))
    return out


def _pack_deterministic(members: list[tuple[str, bytes]], prefix: str, dest: Path) -> None:
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name, data in sorted(members):
                info = tarfile.TarInfo(f"{prefix}/{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))


def download_to(url: str, out: IO[bytes], timeout_s: float) -> str:
    """Stream `url` into `out` (nothing held whole in memory); returns the sha256 of the bytes written."""
    req = urllib.request.Request(url, headers={"User-Agent": "medrank-acquire"})
    h = hashlib.sha256()
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # pinned https URLs
        total = int(resp.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], leave=False) as bar:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
    return h.hexdigest()


def _download(url: str, timeout_s: float) -> bytes:
    buf = io.BytesIO()
    download_to(url, buf, timeout_s)
    return buf.getvalue()


def fetch_upstream(src: Source, dest: Path, timeout_s: float) -> None:
    """Download `src` from its pinned URL into `dest`, verifying content before anything is kept."""
    data = _download(src.url, timeout_s)
    if src.kind == "file":
        got = hashlib.sha256(data).hexdigest()
        if got != src.sha256:
            raise MedrankError(f"{src.path}: sha256 mismatch for {src.url} (expected {src.sha256}, got {got})")
        dest.write_bytes(data)
    elif src.kind == "gzip":
        got = hashlib.sha256(data).hexdigest()
        if got != src.content_sha256:
            raise MedrankError(
                f"{src.path}: content sha256 mismatch for {src.url} (expected {src.content_sha256}, got {got})"
            )
        with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
            gz.write(data)
    elif src.kind == "tarball":
        members = _snapshot_members(data, src)
        got = tar_content_digest(members)
        if got != src.content_sha256:
            raise MedrankError(
                f"{src.path}: content digest mismatch for {src.url} (expected {src.content_sha256}, got {got})"
            )
        _pack_deterministic(members, src.member_prefix or src.repo.split("/")[1], dest)
    else:  # pragma: no cover - registry is static
        raise MedrankError(f"{src.path}: unknown source kind {src.kind!r}")


def _from_mirror(src: Source, mirrors: list[Path], dest: Path) -> str | None:
    for mirror in mirrors:
        cand = mirror / src.path
        if not cand.is_file():
            continue
        size = cand.stat().st_size  # before copying or hashing: a 3 GB (sparse) file is refused at once
        if size != src.size:
            raise MedrankError(
                f"{cand}: {size} bytes, the pinned file has {src.size}; the mirror copy is not the pinned file"
            )
        try:
            shutil.copyfile(cand, dest)
        except OSError as e:  # a full disk is about the file being written, not the mirror file being read
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise OSError(e.errno, e.strerror, str(dest)) from None
            raise
        got = sha256_file(dest)  # hash the copy, not the mirror: what is verified is what is kept
        if got != src.sha256:
            raise MedrankError(
                f"{cand}: sha256 mismatch (expected {src.sha256}, got {got}); the mirror copy is not the pinned file"
            )
        return str(mirror)
    return None


def is_raw_dir(path: Path) -> bool:
    """A folder acquire wrote (it has acquire's MANIFEST.json)."""
    return (path / "MANIFEST.json").is_file()


def acquire(
    out_dir: str | Path,
    mirrors: list[str | Path],
    download: bool = True,
    timeout_s: float = 60.0,
    sources: tuple[Source, ...] = SOURCES,
) -> list[dict]:
    """Materialise every source under `out_dir`; all or nothing: every file is fetched and verified in a staging
    folder beside it, which then replaces `out_dir` in one atomic swap (medrank.core.io.atomic_dir)."""
    present = [Path(m) for m in mirrors if Path(m).is_dir()]
    for m in mirrors:
        if not Path(m).is_dir():
            log.info("mirror %s not found: skipped", m)
    manifest = []
    with atomic_dir(out_dir, owns=is_raw_dir, what="acquire's (no MANIFEST.json)") as staging:
        for src in tqdm(sources, desc="acquire", unit="file"):
            dest = staging / src.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            origin = _from_mirror(src, present, dest)
            if origin is None:
                if not download:
                    raise MedrankError(
                        f"{src.path}: not in any mirror ({', '.join(map(str, mirrors)) or 'none listed'}) and acquire.download is false"
                    )
                try:
                    fetch_upstream(src, dest, timeout_s)
                except (urllib.error.URLError, TimeoutError, OSError) as e:
                    reason = getattr(e, "reason", e)
                    raise MedrankError(
                        f"{src.path}: not in any mirror and download from {src.url} failed ({reason})"
                    ) from None
                origin = src.url
            manifest.append(
                {
                    "path": src.path,
                    "sha256": sha256_file(dest),
                    "bytes": dest.stat().st_size,
                    "origin": origin,
                    "license": src.license,
                }
            )
        write_json(staging / "MANIFEST.json", manifest)
    return manifest
