"""A stage's last good outputs, kept aside while it runs: put back if it fails or is killed, dropped once it succeeds.

Every output in dvc.yaml is `persist: true`, so DVC never deletes one before the stage's own gate has run (DVC removes
a stage's other outputs before it starts its command, and `cache: false` ones, the submissions and metrics, are in no
DVC cache). The stage runner moves them aside itself, after the params gate and the stage lock: a stage that fails
(bad params, a refused input, an error, Ctrl-C, SIGTERM, its `dvc repro` killed) leaves the previous outputs as they
were, which is what `dvc.lock` still records. A run killed outright (SIGKILL, power loss) leaves its stash behind; the
stage's next start puts it back before anything else. The outputs a stage reads back (the extraction caches, acquire's
and clean's folders, which swap themselves in: `layout.KEPT_OUTPUTS`) are never moved.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

log = logging.getLogger(__name__)

MANIFEST = "stash.json"  # written before anything moves: a stash without one holds nothing to put back


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def restore(folder: str | os.PathLike) -> list[Path]:
    """Put back what a failed or killed run left in `folder`: each stashed output replaces what the run left at its
    place (an output that did not exist before the run is removed). The outputs put back, in order."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if folder.exists():  # a stash whose manifest was never written, or one being dropped: nothing was moved
            shutil.rmtree(folder)
        return []
    entries = json.loads(manifest.read_text(encoding="utf-8"))
    restored = []
    for entry in entries:
        target, kept = Path(entry["path"]), folder / entry["name"]
        if kept.exists() or kept.is_symlink():
            _remove(target)  # what the failed run wrote there (or nothing)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(kept, target)
            restored.append(target)
        elif not entry["existed"]:
            _remove(target)  # a first run's partial output: no last good one to put back
    manifest.unlink()
    shutil.rmtree(folder)
    if restored:
        log.info("put back the last good outputs of an interrupted or failed run: %s", ", ".join(map(str, restored)))
    return restored


@contextlib.contextmanager
def keep_last_good(folder: str | os.PathLike, outputs: Iterable[str | os.PathLike]) -> Iterator[None]:
    """Move `outputs` into `folder` (renames: same file system), run the block, then drop them; if the block raises
    (SystemExit and KeyboardInterrupt too), put them back. Only the process that stashed acts: a forked worker that
    unwinds through this frame leaves the stash alone."""
    folder = Path(folder)
    restore(folder)  # a killed run's stash, if one is left: it goes back first
    outputs = [Path(os.path.normpath(p)) for p in outputs]
    entries = [
        {"path": str(p), "name": f"{i}-{p.name}", "existed": p.exists() or p.is_symlink()}
        for i, p in enumerate(outputs)
    ]
    folder.mkdir(parents=True)
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(entries), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    owner = os.getpid()
    for entry in entries:
        if entry["existed"]:
            os.replace(entry["path"], folder / entry["name"])
    try:
        yield
    except BaseException:
        if os.getpid() == owner:
            restore(folder)
        raise
    if os.getpid() == owner:
        (folder / MANIFEST).unlink()  # from here the stash is garbage: a kill mid-removal puts nothing back
        shutil.rmtree(folder)
