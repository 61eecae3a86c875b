"""Each DVC stage's code deps are its import closure (medrank/ and stages/ modules, top level or inside functions):
tests/pipeline/test_layout.py checks dvc.yaml and analysis/dvc.yaml against it, and `python -m tests.helpers.deps`
rewrites their lists to match (adds what a stage imports, drops what it no longer does)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def imports(path: Path) -> set[str]:
    """medrank/stages modules a file imports anywhere (top level or inside functions), with their packages."""
    out: set[str] = set()
    pkg = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for n in names:
            if n.split(".")[0] in ("medrank", "stages"):
                parts = n.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in out if module_file(m) is not None}


def closure(module: str) -> set[Path]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(imports(module_file(m)))
    return {module_file(m).relative_to(REPO) for m in seen}


def has_code(path: Path) -> bool:
    """An __init__.py that does more than mark a package (imports, definitions)."""
    return any(
        isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
        for n in ast.parse(path.read_text()).body
    )


def sync(dvcfile: str) -> None:
    """Rewrite `dvcfile`'s stage deps (code .py entries only) to each stage's closure."""
    path = REPO / dvcfile
    text = path.read_text()
    stages = yaml.safe_load(text)["stages"]
    pending = {}
    for name, st in stages.items():
        module = (st.get("do") or st)["cmd"].split()[2]
        needed = {str(p) for p in closure(module) if p.name != "__init__.py" or has_code(REPO / p)}
        declared = {next(iter(d)) if isinstance(d, dict) else d for d in (st.get("do") or st).get("deps") or []}
        pending[name] = (
            sorted(p for p in needed if p not in declared),
            {d for d in declared if d.endswith(".py") and d not in needed},
        )
    out, current = [], None
    for line in text.split("\n"):
        m = re.match(r"^  ([A-Za-z_0-9]+):", line)
        if m and m.group(1) in stages:
            current = m.group(1)
        entry = line.strip()[2:].split()[0] if line.strip().startswith("- ") else ""
        if current and entry.endswith(".py") and entry in pending[current][1]:
            continue
        out.append(line)
        if current and entry.endswith(".py") and pending[current][0]:
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(f"{indent}- {a}" for a in pending[current][0])
            pending[current] = ([], pending[current][1])
    new = "\n".join(out)
    if new != text:
        path.write_text(new)


if __name__ == "__main__":
    for f in ("dvc.yaml", "analysis/dvc.yaml"):
        sync(f)
