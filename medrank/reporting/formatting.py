"""Number and table formatting for the generated README / RESULTS blocks and model cards, and the metrics files they read."""

from __future__ import annotations

import json
import re
from pathlib import Path

from medrank.errors import MedrankError

MAX_METRICS_BYTES = 16 << 20  # a metrics file (the largest is ~45 KB): a link to /dev/zero is refused, never read whole
MAX_REPO_FILE_BYTES = 16 << 20  # README.md, RESULTS.md, dvc.yaml, dvc.lock, params.yaml (dvc.lock: ~85 KB)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)", re.IGNORECASE)
_CONFLICT = re.compile(r"^(?:<{7}|={7}|>{7})(?: |$)")


TASK3_COLUMNS = [
    ("accuracy", "Accuracy"),
    ("precision", "Precision"),
    ("mrr", "MRR"),
    ("spearman", "Spearman (official)"),
    ("spearman_true", "Spearman (true)"),
]


def load_metrics_file(path: Path) -> dict:
    """A metrics file as a JSON object; a truncated, non-UTF-8 or non-object file (what a merge conflict or a full disk
    leaves) is one error line naming it and the way back."""
    from medrank.io import read_text_capped

    fix = f"restore it with `git checkout -- {path}` or re-run its stage (`dvc repro`)"
    try:  # size-checked first: a metrics file linked to /dev/zero is one line, not an unbounded read
        obj = json.loads(read_text_capped(path, MAX_METRICS_BYTES, "a metrics file"))
    except json.JSONDecodeError as e:
        raise MedrankError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    except MedrankError as e:
        raise MedrankError(f"{e}; {fix}") from None
    except OSError as e:  # a folder named *.json, no permission
        raise MedrankError(f"{path}: cannot be read as a metrics file ({e.strerror or e}); {fix}") from None
    if not isinstance(obj, dict):
        raise MedrankError(f"{path}: expected a JSON object of metrics, got {type(obj).__name__}; {fix}")
    found = _number_as_string(obj)
    if found is not None:  # the tables format numbers (`{v:.3f}`): a string there was a traceback
        raise MedrankError(
            f"{path}: {found[0]}: the number {found[1]!r} is written as a string (a JSON number is expected); {fix}"
        )
    return obj


def _number_as_string(obj, key: str = "") -> tuple[str, str] | None:
    """(dotted key, value) of the first string value in `obj` that spells a number, else None."""
    if isinstance(obj, str):
        return (key, obj) if _NUMBER.fullmatch(obj.strip()) else None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = _number_as_string(v, f"{key}.{k}" if key else str(k))
        if found is not None:
            return found
    return None


def read_repo_text(path: Path, what: str) -> str:
    """A repository text file the report reads (README.md, RESULTS.md, dvc.yaml, ...): capped, UTF-8, else one line."""
    from medrank.io import read_text_capped

    try:
        return read_text_capped(path, MAX_REPO_FILE_BYTES, what)
    except OSError as e:  # a folder, no permission
        raise MedrankError(f"{path}: cannot be read as {what} ({e.strerror or e})") from None


def load_repo_yaml(path: Path) -> dict:
    """dvc.yaml / dvc.lock / params.yaml as a mapping ({} when absent). An unresolved merge (conflict markers), a file
    that is not YAML or not a mapping is one line naming it (`dvc dag --md` said only `failed: ['  4   acquire:']`)."""
    import yaml

    if not path.exists():
        return {}
    text = read_repo_text(path, f"a {path.name} file")
    for n, line in enumerate(text.splitlines(), start=1):
        if _CONFLICT.match(line):
            raise MedrankError(
                f"{path}: line {n}: a merge conflict marker ({line.split()[0]}); resolve the conflict first, nothing written"
            )
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise MedrankError(f"{path}: {where}not valid YAML ({problem}); nothing written") from None
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise MedrankError(f"{path}: expected a YAML mapping, got {type(obj).__name__}; nothing written")
    return obj


def fmt_num(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "—" if v is None else str(v)


def flat_keys(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_keys(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def pm_text(d: dict | None) -> str:
    """A CV cell: mean ± sd."""
    return "—" if not d else f"{d['mean']:.3f} ± {d['sd']:.3f}"


def loso_text(d: dict | None, metric: str = "accuracy") -> str:
    """A LOSO cell: the mean over held-out sources (the worst source's value and name)."""
    m = (d or {}).get(metric)
    return "—" if not m else f"{m['mean']:.3f} ({m['worst']:.3f} {m['worst_source']})"


def shift_text(d: dict | None, metric: str = "accuracy") -> str:
    """A prior-shift cell (experiment.PriorShift summary): the band over the positive rates, worst first, each with its
    rate, e.g. "0.712 at 20% – 0.851 at 65%"."""
    m = (d or {}).get(metric)
    if not m:
        return "—"
    by = {float(k): v for k, v in m["by_prior"].items()}
    best = max(by, key=by.get)
    return f"{m['worst']:.3f} at {m['worst_prior']:.0%} – {m['best']:.3f} at {best:.0%}"


def acc_text(d: dict | None) -> str:
    """An RQE CV cell: accuracy mean ± sd over folds."""
    return "—" if not d or d.get("accuracy") is None else f"{d['accuracy']:.3f} ± {d.get('accuracy_sd') or 0:.3f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (
        ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        + ["| " + " | ".join(r) + " |" for r in rows]
        + [""]
    )


def check_metrics_dir(metrics_dir: str | Path) -> None:
    """A metrics folder to render from: it exists and holds metrics JSON files. A typo (`--metrics-dir metric`) or an
    empty folder would render every table empty and wipe the tracked documents, so it is refused before any write."""
    d = Path(metrics_dir)
    if not d.is_dir():
        raise MedrankError(f"{d}: no such metrics folder (expected the folder of metrics/*.json files, e.g. metrics)")
    if not any(d.glob("*.json")):
        raise MedrankError(
            f"{d}: holds no metrics *.json file (run `dvc repro`, or `dvc pull`, first); nothing written"
        )


def read_metrics(metrics_dir: str | Path) -> dict[str, dict]:
    return {f.stem: load_metrics_file(f) for f in sorted(Path(metrics_dir).glob("*.json"))}
