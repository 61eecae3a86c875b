"""The params sections' base model (unknown keys refused) and the checks of user-supplied files and folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    # strict: YAML `true` is not the int 1 and "yes" is not a bool (DVC hashes the file as written, so must we);
    # allow_inf_nan=False: `.inf` passes `gt=0` but trains NaN weights (every float of every section is finite)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


PositiveInt = Annotated[int, Field(ge=1)]
Workers = Annotated[int, Field(ge=1)] | Literal["auto"]  # processes side by side; "auto" = every core
MAX_LIST_BYTES = 64 * 2**20  # a user-supplied word list larger than this is a mistake (a wrong path, /dev/zero, a dump)


def user_file(value: str | None, text: bool = True) -> str | None:
    """A user-supplied input file, checked when params are read (check_params, and each stage's start: before DVC has
    deleted anything): it exists and is a regular file; a text list is also under MAX_LIST_BYTES and UTF-8."""
    if value is None:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{value}: no such file")
    if not path.is_file():
        raise ValueError(f"{value}: not a regular file")
    if text:
        size = path.stat().st_size
        if size > MAX_LIST_BYTES:
            raise ValueError(f"{value}: {size} bytes, a word list is expected under {MAX_LIST_BYTES // 2**20} MiB")
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{value}: not UTF-8 text (byte offset {e.start})") from None
    return value


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


# The models medrank.data.sources.MODEL_SOURCES pins (a test holds the two equal): importing it here would make the
# pinned sources a dep of every stage.
PinnedModel = Literal["all-mpnet-base-v2"]
