"""The params sections' base model (unknown keys refused) and the checks of user-supplied files and folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class _Section(BaseModel):
    # strict: YAML `true` is not the int 1 and "yes" is not a bool (DVC hashes the file as written, so must we);
    # allow_inf_nan=False: `.inf` passes `gt=0` but trains NaN weights (every float of every section is finite)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Upper bounds (issue 46 #2): every number has one, far above what a real run uses and far below what exhausts the
# machine, so a typo (1e300 for a learning rate, 1e9 channels, 1e12 resamples) stops at the gate in one line naming the
# key, not minutes into a stage (after DVC has deleted its outputs) as a traceback or an out-of-memory kill.
MAX_COUNT = 10**7  # items of data: pairs, triplets, questions, articles, answers, vocabulary words, shard sizes, steps
MAX_EPOCHS = 1000  # epochs and patience
MAX_STEPS = 1000  # folds, seeds, negatives per question, windows, sentences / terms per text, answers kept
MAX_LR = 10.0  # learning rates (Adadelta's default is 1.0)
MAX_DECAY = 10.0  # weight decay, L2
MAX_WEIGHT = 1000.0  # loss weights
MAX_C = 1e6  # inverse regularisation strengths (LR, SVM)
MAX_WIDTH = 4096  # layer widths: channels, filters, hidden units, embedding dimensions
MAX_TOKENS = 8192  # tokens per text
MAX_TRAIN_BATCH = 4096  # training batch sizes
MAX_BATCH = 65536  # inference batch sizes (no gradients held)
MAX_THREADS = 1024  # threads, CPUs, Ray actors
MAX_WORKERS = 256  # forked local processes (each holds a model)
MAX_TIMEOUT_S = 86400.0  # a day
MAX_RESAMPLES = 10**6  # bootstrap resamples

PositiveInt = Annotated[int, Field(ge=1)]
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]  # a layer's width
Workers = Annotated[int, Field(ge=1, le=MAX_WORKERS)] | Literal["auto"]  # processes side by side; "auto" = every core
MAX_LIST_BYTES = 64 * 2**20  # a user-supplied word list larger than this is a mistake (a wrong path, /dev/zero, a dump)


def user_file(value: str | None, text: bool = True) -> str | None:
    """A user-supplied input file, checked when params are read (check_params, and each stage's start: before DVC has
    deleted anything): it exists and is a regular file; a text file (plain, or gzip-compressed when its name ends in
    .gz) is also under MAX_LIST_BYTES, uncompressed, and UTF-8. Every path param goes through this one rule."""
    if value is None:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{value}: no such file")
    if not path.is_file():
        raise ValueError(f"{value}: not a regular file")
    if text:
        _utf8_under_cap(value, path)
    return value


def _utf8_under_cap(value: str, path: Path) -> None:
    """Read the file (through gzip for *.gz) in chunks: under MAX_LIST_BYTES and valid UTF-8, else a ValueError."""
    import codecs
    import gzip
    import zlib

    cap = f"a text file is expected under {MAX_LIST_BYTES // 2**20} MiB"
    if not path.name.endswith(".gz") and path.stat().st_size > MAX_LIST_BYTES:
        raise ValueError(f"{value}: {path.stat().st_size} bytes, {cap}")
    decoder, seen, start = codecs.getincrementaldecoder("utf-8")(), 0, 0
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as f:
            while chunk := f.read(2**20):
                start, seen = seen - len(decoder.getstate()[0]), seen + len(chunk)  # the decoder's held-back bytes
                if seen > MAX_LIST_BYTES:
                    raise ValueError(f"{value}: more than {MAX_LIST_BYTES} bytes uncompressed, {cap}")
                decoder.decode(chunk)
            start = seen - len(decoder.getstate()[0])
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        raise ValueError(f"{value}: not UTF-8 text (byte offset {start + e.start})") from None
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{value}: not a readable gzip file ({type(e).__name__}: {e})") from None


def user_folder(value: str | None) -> str | None:
    if value is not None and not Path(value).expanduser().is_dir():
        raise ValueError(f"{value}: no such folder")
    return value


def _ray_installed(cls: type, backend: str) -> str:
    """backend ray needs the package: refused here, not after DVC has deleted the stage's outputs."""
    import importlib.util

    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("backend ray needs the package ray (pip install -e '.[ray]'), which is not installed")
    return backend


def _openvino_installed(precision: str) -> str:
    """The OpenVINO path needs its runtime: refused here (one line), not after DVC has deleted the stage's outputs."""
    import importlib.util

    if precision.startswith("openvino") and importlib.util.find_spec("openvino") is None:
        raise ValueError(
            f"precision {precision} needs the OpenVINO runtime (pip install openvino), which is not installed"
        )
    return precision


# Inference precision of an encoder: torch's kernels (fp32, bf16 autocast, int8 dynamic quantization) or the OpenVINO
# path's (medrank.encoders.openvino_path); auto = the hardware's torch choice (flags, never a timing), never OpenVINO;
# openvino-auto = the OpenVINO path at the hardware's precision on a CPU (torch's auto on a GPU).
# The name is part of every cache namespace, so each path keeps its own cached scores.
PredictPrecision = Annotated[  # cross-encoders
    Literal["auto", "fp32", "bf16", "int8", "openvino-auto", "openvino-bf16", "openvino-fp32"],
    AfterValidator(_openvino_installed),
]
EncodePrecision = Annotated[  # bi-encoders
    Literal["auto", "fp32", "bf16", "openvino-auto", "openvino-bf16", "openvino-fp32"],
    AfterValidator(_openvino_installed),
]


# The models medrank.data.sources.MODEL_SOURCES pins (a test holds the two equal): importing it here would make the
# pinned sources a dep of every stage.
PinnedModel = Literal["all-mpnet-base-v2"]
