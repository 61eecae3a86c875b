"""Number and table formatting for the generated README / RESULTS blocks and model cards, and the metrics files they read."""

from __future__ import annotations

import json
from pathlib import Path

from medrank.errors import MedrankError


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
    from medrank.io import decode_utf8

    fix = f"restore it with `git checkout -- {path}` or re-run its stage (`dvc repro`)"
    try:
        obj = json.loads(decode_utf8(path.read_bytes(), path))
    except json.JSONDecodeError as e:
        raise MedrankError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {fix}") from None
    except MedrankError as e:
        raise MedrankError(f"{e}; {fix}") from None
    if not isinstance(obj, dict):
        raise MedrankError(f"{path}: expected a JSON object of metrics, got {type(obj).__name__}; {fix}")
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
