"""One place for atomic file writes and parquet/JSON/CSV I/O."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from medrank.core.errors import MedrankError
from medrank.core.forking import hold, let_go

log = logging.getLogger(__name__)

_UMASK = os.umask(0)
os.umask(_UMASK)

# Names of what atomic_path / atomic_dir leave behind when killed: `.<name>.<8 mkstemp chars>.tmp` (files),
# `.<name>.<8>.staging` (folders being built, or the replaced copy being removed), `.<name>.old-<8 hex>`
# (the replaced copy while renameat2 is unavailable). Only these are ever swept.
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:[a-z0-9_]{8}\.(?:tmp|staging)|(?P<old>old)-[0-9a-f]{8})$")


def _hold(path: Path) -> int:
    """Open `path` (a file or a folder) and take an exclusive flock on it: the mark of a live owner, which
    sweep_leftovers respects; the kernel drops it when the process dies. Returns the fd (close it to let go)."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # just created by us: nobody else can hold it
    return hold(fd)  # forked workers drop their copy: the flock lives exactly as long as this process holds it


def _owner_alive(path: Path) -> bool:
    """True if a running process holds `path`'s flock (an atomic_path / atomic_dir still being written)."""
    try:
        fd = os.open(
            path,
            os.O_RDONLY
            | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() and not path.is_symlink() else 0)
            | os.O_NOFOLLOW,
        )
    except OSError:
        return False  # gone, or a link: not ours to judge by its target
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def _fsync_path(path: Path) -> None:
    """fsync a file or a folder (some filesystems refuse folder fsync: nothing more can be done there)."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held to the rename: a concurrent sweep leaves this file alone
    hold(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        _fsync_path(tmp_path)  # data on disk before the name points at it: a crash never leaves a short file
        os.replace(tmp_path, path)
        _fsync_path(path.parent)  # the rename itself survives a power loss
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
        let_go(fd)


# ---------------------------------------------------------------- whole folders


def _renameat2() -> Callable | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _renameat2()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2); False where the kernel or filesystem cannot."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(new: Path, target: Path) -> Path | None:
    """Put folder `new` at `target` so that every instant has a complete `target` (or its `.old` copy);
    returns where the replaced copy now is (None if there was none)."""
    if not target.exists():
        os.rename(new, target)
        replaced = None
    elif _exchange(new, target):
        replaced = new
    else:  # crash between the two renames: _recover() puts the `.old` copy back at the next start
        replaced = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
        os.rename(target, replaced)
        os.rename(new, target)
    _fsync_path(target.parent)
    return replaced


def _recover(target: Path) -> None:
    """A run killed mid-swap (fallback path) left no `target` but its `.old` copy: put that back."""
    if target.exists() or target.is_symlink() or not target.parent.is_dir():
        return
    olds = sorted(
        p for p in target.parent.iterdir() if (m := _LEFTOVER.match(p.name)) and m["old"] and m["name"] == target.name
    )
    if olds:
        log.warning("%s: missing after an interrupted swap; restoring %s", target, olds[-1].name)
        os.rename(olds[-1], target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _fsync_tree(root: Path) -> None:
    for d, _, files in os.walk(root, topdown=False):
        for f in files:
            if not os.path.islink(os.path.join(d, f)):
                _fsync_path(Path(d, f))
        _fsync_path(Path(d))


PIPELINE_FILES = ("dvc.yaml", "analysis/dvc.yaml")  # the default pipeline, and the ablation / selection tables


def declared_outputs(stage: str | None = None, dvcfiles: Sequence[str | os.PathLike] = PIPELINE_FILES) -> list[Path]:
    """Outs, metrics and plots that the pipeline files declare (for one stage, or all), relative to the project
    folder (a stage's `wdir` applied); [] without any pipeline file."""
    import yaml

    out = []
    for dvcfile in dvcfiles:
        try:
            text = Path(dvcfile).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        stages = (yaml.safe_load(text) or {}).get("stages") or {}
        for name, st in stages.items():
            if stage is not None and name != stage:
                continue
            base = Path(dvcfile).parent / st.get("wdir", ".")
            st = st.get("do", st)  # foreach/matrix: templated paths are skipped below
            for key in ("outs", "metrics", "plots"):
                for e in st.get(key) or []:
                    p = next(iter(e)) if isinstance(e, dict) else e
                    if isinstance(p, str) and "${" not in p:
                        out.append(Path(os.path.normpath(base / p)))
    return out


def _check_owned(path: Path, owns: Callable[[Path], bool], what: str) -> None:
    """Refuse (one MedrankError line) to replace a folder this stage does not own."""
    root = Path.cwd()
    full = Path(os.path.abspath(path))
    if full == root:
        raise MedrankError(f"{path}: refusing to replace the project folder itself")
    if root not in full.parents:
        raise MedrankError(f"{path}: refusing to replace a folder outside the project ({root})")
    for other in declared_outputs():
        if full in Path(os.path.abspath(other)).parents:
            raise MedrankError(f"{path}: refusing to replace a folder that holds another declared output ({other})")
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise MedrankError(f"{path}: refusing to replace: not a folder")
    if path.is_dir() and any(path.iterdir()) and not owns(path):
        raise MedrankError(f"{path}: refusing to replace a non-empty folder that is not {what}")


@contextlib.contextmanager
def atomic_dir(
    path: str | os.PathLike, owns: Callable[[Path], bool], what: str = "this stage's output"
) -> Iterator[Path]:
    """Yield an empty staging folder beside `path`; if the block succeeds, fsync it and swap it in atomically.

    A crash at any instant leaves `path` complete (old or new); `owns(path)` must accept an existing non-empty
    `path` (`what` names that content in the error), else nothing is touched.
    """
    path = Path(os.path.normpath(path))
    _check_owned(path, owns, what)
    _recover(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".staging", dir=path.parent))
    os.chmod(staging, 0o777 & ~_UMASK)  # mkdtemp makes 0700; the swapped-in folder gets normal permissions
    held = _hold(staging)  # to the swap and the clean-up: a second run's sweep leaves a live staging folder alone
    replaced = None
    try:
        yield staging
        _fsync_tree(staging)
        replaced = _swap_in(staging, path)
    finally:
        # the failed build, or (after the swap) the replaced copy; a kill here leaves it to sweep_leftovers
        for p in (staging, replaced):
            if p is not None and p.exists():
                shutil.rmtree(p, ignore_errors=True)
        let_go(held)


def sweep_leftovers(outputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Remove what killed atomic_path/atomic_dir runs left beside or inside `outputs` (only our temp names, and only
    those no running process holds: a second run beside a live one never deletes the live one's temp files)."""
    removed = []
    for out in map(Path, outputs):
        _recover(out)
        found = [
            p
            for p in (out.parent.iterdir() if out.parent.is_dir() else ())
            if (m := _LEFTOVER.match(p.name)) and m["name"] == out.name
        ]
        if out.is_dir() and not out.is_symlink():
            for d, dirs, files in os.walk(out):
                hits = [Path(d, n) for n in dirs + files if _LEFTOVER.match(n)]
                dirs[:] = [n for n in dirs if not _LEFTOVER.match(n)]  # removed whole, not walked
                for p in hits:
                    m = _LEFTOVER.match(p.name)
                    if m["old"] and not p.with_name(m["name"]).exists():
                        _recover(p.with_name(m["name"]))
                    else:
                        found.append(p)
        for p in found:
            if _owner_alive(p):
                log.info("leaving %s: a running process is still writing it", p)
            elif p.exists() or p.is_symlink():
                log.info("removing leftover of an interrupted run: %s", p)
                _remove(p)
                removed.append(p)
    return removed


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    # numpy scalars and arrays appear in metrics dicts
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# A JSON record's checksum of its own other keys: side files (a model's labels, max_length, the sha256 of its
# vocabularies; a step's params and tables) are verified where they are read, as the weights are. Against damage and
# hand edits, not against someone who rewrites the whole record.
RECORD_SHA256 = "record_sha256"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default).encode()


def record_sha256(record: dict) -> str:
    """sha256 of `record`'s keys but RECORD_SHA256, as they read back from JSON (numpy scalars, tuples normalised)."""
    body = json.loads(_canonical({k: v for k, v in record.items() if k != RECORD_SHA256}))
    return hashlib.sha256(_canonical(body)).hexdigest()


def write_sealed_json(path: str | os.PathLike, record: dict) -> None:
    """write_json of `record` with its RECORD_SHA256 (read it back with read_sealed_json)."""
    write_json(path, {**record, RECORD_SHA256: record_sha256(record)})


def read_sealed_json(path: str | os.PathLike, restore: str) -> dict:
    """A record write_sealed_json wrote, verified; a missing, truncated, unsealed or edited one is one MedrankError
    line naming the file, then `restore` (the way back)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # a truncated file, a stray byte (UnicodeDecodeError is a ValueError)
        raise MedrankError(f"{path}: cannot read ({type(e).__name__}); {restore}") from None
    if not isinstance(record, dict):
        raise MedrankError(f"{path}: not a JSON object; {restore}")
    recorded = record.get(RECORD_SHA256)
    if recorded is None:
        raise MedrankError(
            f"{path}: no {RECORD_SHA256} (saved before side files were checksummed, or edited); {restore}"
        )
    if recorded != record_sha256(record):
        raise MedrankError(f"{path}: edited or damaged since it was saved ({RECORD_SHA256} differs); {restore}")
    return record


def write_parquet(df: pd.DataFrame, path: str | os.PathLike, schema: pa.Schema) -> None:
    """Write `df` with an explicit schema (columns in schema order, extra columns rejected)."""
    extra = set(df.columns) - set(schema.names)
    missing = set(schema.names) - set(df.columns)
    if extra or missing:
        raise MedrankError(f"{path}: columns do not match schema (missing {sorted(missing)}, extra {sorted(extra)})")
    table = pa.Table.from_pandas(df[schema.names], schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise MedrankError(f"{path}: file not found (run the stage that produces it, e.g. `dvc repro`)")
    return pq.read_table(path, columns=columns).to_pandas()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_text_capped(path: str | os.PathLike, max_bytes: int, what: str) -> str:
    """UTF-8 text of a user-supplied file, refused (one line) when larger than `max_bytes` or not UTF-8; a BOM is dropped."""
    path = Path(path)
    too_big = f"more than {what} can be (at most {max_bytes / 2**20:.0f} MiB)"
    if not path.is_file():  # a pipe (/dev/stdin, <(...)): no size to look at; never hold more than the cap
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise MedrankError(f"{path}: {too_big}")
        return decode_utf8(data, path)
    size = path.stat().st_size
    if size > max_bytes:
        raise MedrankError(f"{path}: {size / 2**20:.1f} MiB, {too_big}")
    return decode_utf8(path.read_bytes(), path)


def decode_utf8(data: bytes, name: str | os.PathLike) -> str:
    """`data` as text; not UTF-8 -> one line naming `name` and the offending byte's offset in the file."""
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise MedrankError(
            f"{name}: not UTF-8 text (byte 0x{data[bom + e.start]:02x} at offset {bom + e.start}: {e.reason})"
        ) from None
