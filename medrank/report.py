"""README results block rendered from the committed metrics files (never typed by hand)."""

from __future__ import annotations

import json
from pathlib import Path

from medrank.errors import MedrankError
from medrank.io import write_text

START, END = "<!-- results:start -->", "<!-- results:end -->"
TASK3_COLUMNS = [("accuracy", "Accuracy"), ("precision", "Precision"), ("mrr", "MRR"), ("spearman", "Spearman (official)"), ("spearman_true", "Spearman (true)")]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "—" if v is None else str(v)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def render_results(metrics_dir: str | Path = "metrics") -> str:
    """Markdown tables: Task 3 validation systems side by side, then every other metrics file."""
    metrics_dir = Path(metrics_dir)
    lines = []
    task3 = sorted(metrics_dir.glob("task3_val_*.json"))
    if task3:
        lines += ["**MEDIQA Task 3, validation (25 questions; swings ±0.1, see cross-validation rows where present)**", ""]
        lines += ["| system | " + " | ".join(h for _, h in TASK3_COLUMNS) + " |", "|---" * (len(TASK3_COLUMNS) + 1) + "|"]
        for f in task3:
            m = _load(f)
            lines.append(f"| {f.stem.removeprefix('task3_val_')} | " + " | ".join(_fmt(m.get(k)) for k, _ in TASK3_COLUMNS) + " |")
        lines.append("")
    for f in sorted(set(metrics_dir.glob("*.json")) - set(task3)):
        flat = _flat(_load(f))
        if not flat:
            continue
        lines += [f"<details><summary><code>{f.name}</code></summary>", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(flat.items())]
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _with_results(readme: Path, metrics_dir: str | Path) -> tuple[str, str]:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise MedrankError(f"{readme}: missing the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return text, f"{head}{START}\n{render_results(metrics_dir)}{END}{tail}"


def readme_is_current(readme: str | Path = "README.md", metrics_dir: str | Path = "metrics") -> bool:
    text, new = _with_results(Path(readme), metrics_dir)
    return text == new


def update_readme(readme: str | Path = "README.md", metrics_dir: str | Path = "metrics") -> bool:
    """Replace the results block in README; return True if it changed."""
    text, new = _with_results(Path(readme), metrics_dir)
    if new != text:
        write_text(readme, new)
    return new != text
