"""Number and table formatting for the generated README / RESULTS blocks and model cards, and the metrics files they read."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import deque
from pathlib import Path
from typing import Iterator

from medrank.core.errors import MedrankError

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
    from medrank.core.io import read_text_capped

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
    return _tracked(obj, path, "")


# The report reads metrics files without a schema: a null, true or list where a number is formatted (`{v:.3f}`) was a
# traceback. The files' dicts and lists record each value read (file, key, value); when rendering fails, the last
# values read that are not numbers name the culprit (metrics_value_errors).
_RECENT: deque = deque(maxlen=256)


class _TrackedDict(dict):
    def __init__(self, items, path: Path, key: str) -> None:
        super().__init__(items)
        self._where = (path, key)

    def __getitem__(self, k):
        v = super().__getitem__(k)
        _RECENT.append((self._where[0], _join(self._where[1], k), v))
        return v

    def get(self, k, default=None):
        return self[k] if k in self else default

    def items(self):  # a list, not a view: each value read is recorded as the loop reaches it
        return list(_recorded_items(self))

    def values(self):
        return [v for _, v in _recorded_items(self)]


def _recorded_items(d: "_TrackedDict") -> Iterator[tuple]:
    for k in d:
        yield k, d[k]


class _TrackedList(list):
    def __init__(self, items, path: Path, key: str) -> None:
        super().__init__(items)
        self._where = (path, key)

    def __getitem__(self, i):
        v = super().__getitem__(i)
        if isinstance(i, int):
            _RECENT.append((self._where[0], _join(self._where[1], i % len(self)), v))
        return v

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def _join(key: str, k) -> str:
    return f"{key}.{k}" if key else str(k)


def _tracked(obj, path: Path, key: str):
    if isinstance(obj, dict):
        return _TrackedDict({k: _tracked(v, path, _join(key, k)) for k, v in obj.items()}, path, key)
    if isinstance(obj, list):
        return _TrackedList([_tracked(v, path, _join(key, i)) for i, v in enumerate(obj)], path, key)
    if isinstance(obj, float) and not math.isfinite(obj):
        return _NonFinite(obj, path, key)
    return obj


class _NonFinite(float):
    """A NaN or ±Infinity of a metrics file (JSON `NaN`, `Infinity`, `1e999`): a stage may write one where the report
    shows nothing, so it is refused only where the report formats it, naming the file and the key."""

    __slots__ = ("where",)

    def __new__(cls, value: float, path: Path, key: str) -> "_NonFinite":
        obj = super().__new__(cls, value)
        obj.where = (path, key)
        return obj

    def _refuse(self, *_):
        path, key = self.where
        raise MedrankError(
            f"{path}: {key}: expected a finite number, got {json.dumps(float(self))}; restore it with "
            f"`git checkout -- {path}` or re-run its stage (`dvc repro`)"
        )

    # every way a value reaches a table (`{v:.3f}`, str, rounding); repr is left alone for debugging
    __format__ = __str__ = __round__ = __int__ = __trunc__ = __floor__ = __ceil__ = _refuse


def _keeps_where(op: str):
    def method(self, *other):
        r = getattr(float, op)(self, *other)
        return _NonFinite(r, *self.where) if isinstance(r, float) and not math.isfinite(r) else r

    return method


# a difference or a mean of a NaN (`{a - b:+.3f}`, `sum(...) / n`) is refused naming the NaN's key, not shown as nan
for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "neg", "pos", "abs"):
    setattr(_NonFinite, f"__{_op}__", _keeps_where(f"__{_op}__"))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@contextlib.contextmanager
def metrics_value_errors() -> Iterator[None]:
    """Rendering from metrics files: a value of the wrong kind where a number is expected is one MedrankError line
    naming the file and the key, not a traceback."""
    _RECENT.clear()
    try:
        yield
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        # the culprit: the last value read of the kind the error names (NoneType.__format__, "got bool", ...), else of
        # any kind a number is never written as; strings are not suspects (a number as a string is refused at load)
        kinds = {"NoneType": type(None), "bool": bool, "list": list, "List": list, "dict": dict, "Dict": dict}
        named = tuple(t for name, t in kinds.items() if name in str(e)) or (type(None), bool, list)
        recent = [r for r in reversed(_RECENT) if isinstance(r[2], named) and (bool in named or r[2] is not True)]
        culprit = recent[0] if recent else None
        if culprit is None:
            raise MedrankError(
                f"cannot render the report from the metrics files ({type(e).__name__}: {e}); restore them with "
                "`git checkout -- metrics` or re-run their stages (`dvc repro`)"
            ) from None
        path, key, value = culprit
        raise MedrankError(
            f"{path}: {key}: expected a number, got {json.dumps(value)}; restore it with `git checkout -- {path}` "
            "or re-run its stage (`dvc repro`)"
        ) from None


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
    from medrank.core.io import read_text_capped

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
    if isinstance(v, bool):  # `true` where a number belongs (a list is shown as one): metrics_value_errors names it
        raise TypeError("a number expected, got bool")
    return "—" if v is None else str(v)


def fmt_metric(v) -> str:
    """A metric's cell (a number, or — when not measured): anything else is an error metrics_value_errors names."""
    if v is not None and not isinstance(v, (int, float)):
        raise TypeError(f"a number expected, got {type(v).__name__}")
    return fmt_num(v)


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


METRICS_DIR = Path("metrics")  # where dvc.yaml's stages write them; `--metrics-dir` may name a copy elsewhere
MAX_NAMED = 10  # missing files named in the one error line


def expected_metrics(repo: str | Path) -> list[str]:
    """File names of the metrics/ files the stages of `repo`'s dvc.yaml write (none without a dvc.yaml)."""
    stages = load_repo_yaml(Path(repo) / "dvc.yaml").get("stages") or {}
    bodies = [s.get("do", s) for s in stages.values() if isinstance(s, dict)]  # a foreach stage's: its `do`
    declared = [m for s in bodies if isinstance(s, dict) for m in s.get("metrics") or []]
    paths = [Path(m if isinstance(m, str) else next(iter(m))) for m in declared if isinstance(m, (str, dict)) and m]
    # a templated path (`foreach`, `${item}`) names no one file: not expected by name
    return sorted({p.name for p in paths if p.parent == METRICS_DIR and "${" not in p.name})


def check_metrics_dir(metrics_dir: str | Path, repo: str | Path | None = None) -> None:
    """A metrics folder to render from: it exists and holds every metrics file `repo`'s dvc.yaml declares. A typo, an
    empty folder or another folder of JSON files (`models`) rendered every table from nothing and wiped the documents."""
    d = Path(metrics_dir)
    if not d.is_dir():
        raise MedrankError(f"{d}: no such metrics folder (expected the folder of metrics/*.json files, e.g. metrics)")
    if not any(d.glob("*.json")):
        raise MedrankError(
            f"{d}: holds no metrics *.json file (run `dvc repro`, or `dvc pull`, first); nothing written"
        )
    # `dvc repro` writes each of these and the report reads each (headline, RESULTS, cards, timings): one missing is a
    # section gone from the documents. analysis/dvc.yaml's are not required: that pipeline is run apart, and the
    # report leaves out (or marks "not measured") what it lacks.
    expected = expected_metrics(repo) if repo is not None else []
    missing = [name for name in expected if not (d / name).exists()]
    if missing:
        named = ", ".join(missing[:MAX_NAMED]) + (
            f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
        )
        raise MedrankError(
            f"{d}: not a complete metrics folder: lacks {len(missing)} of the {len(expected)} metrics files "
            f"{Path(repo) / 'dvc.yaml'} declares ({named}); run their stages (`dvc repro`) or pass the folder they "
            "write (e.g. metrics); nothing written"
        )


def read_metrics(metrics_dir: str | Path) -> dict[str, dict]:
    return {f.stem: load_metrics_file(f) for f in sorted(Path(metrics_dir).glob("*.json"))}


def acceptance_text(a: dict | None, brief: bool = False) -> str:
    """An acceptance cell: adopted or not, the margins (in noise bands) on the worst source and at the worst rate, and
    what stopped it."""
    v = (a or {}).get("verdict")
    if not v:
        return "—"
    head = "**adopted**" if v["adopt"] else "refused"
    if a.get("incumbent") not in (None, "default"):  # the default challenged a simpler row: its group stays or goes
        head = "the default's group stays" if a.get("default_stands") else "**the default's group goes**"
    margins = f"{v['margin']['worst_source']:+.1f} / {v['margin']['worst_prior']:+.1f} bands"
    why = f"; {v['why']}" if not v["adopt"] and not brief else ""
    return f"{head} ({margins}{' on the worst source / rate' if brief else ''}{why})"
