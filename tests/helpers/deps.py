"""Each DVC stage's code deps: its stage module plus the medrank package folders its import closure touches (medrank/
and stages/ modules, imported at top level or inside functions; DVC hashes a folder as a whole).
tests/pipeline/test_layout.py checks dvc.yaml and analysis/dvc.yaml against it, and `python -m tests.helpers.deps`
rewrites their lists to match (adds a folder a stage now imports from, drops one it no longer does)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DVC_FILES = ("dvc.yaml", "analysis/dvc.yaml")


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


def needed_files(module: str) -> set[str]:
    """The source files a stage's module runs: its import closure (package markers without code left out)."""
    return {p.as_posix() for p in closure(module) if p.name != "__init__.py" or has_code(REPO / p)}


def folder_of(path: str) -> str:
    """The dep that covers a source file: its top-level package folder (medrank/<package>), else the file itself."""
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "medrank" and len(parts) > 2 else path


def code_deps(module: str) -> list[str]:
    """A stage's code deps: its stage module first, then the package folders (and files directly in medrank/)."""
    own = module.replace(".", "/") + ".py"
    return [own, *sorted({folder_of(p) for p in needed_files(module)} - {own})]


def is_code(entry: str) -> bool:
    return entry.startswith(("medrank/", "stages/"))


def stage_deps(dvcfile: str) -> dict[str, tuple[str, list[str]]]:
    """Each stage's (module, declared deps) in a dvc.yaml (a foreach stage's template once)."""
    out = {}
    for name, st in yaml.safe_load((REPO / dvcfile).read_text(encoding="utf-8"))["stages"].items():
        st = st.get("do") or st
        out[name] = (st["cmd"].split()[2], [next(iter(d)) if isinstance(d, dict) else d for d in st.get("deps") or []])
    return out


def sync(dvcfile: str) -> None:
    """Rewrite `dvcfile`'s code deps (entries under medrank/ and stages/) to each stage's code_deps, in their place."""
    path = REPO / dvcfile
    text = path.read_text(encoding="utf-8")
    wanted = {name: code_deps(module) for name, (module, _) in stage_deps(dvcfile).items()}
    out, current = [], None
    for line in text.split("\n"):
        m = re.match(r"^  ([A-Za-z_0-9]+):", line)
        if m and m.group(1) in wanted:
            current = m.group(1)
        entry = line.strip()[2:].split()[0] if line.strip().startswith("- ") else ""
        if current and is_code(entry):
            if wanted[current]:  # the stage's first code entry: the whole list goes here
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(f"{indent}- {d}" for d in wanted[current])
                wanted[current] = []
            continue
        out.append(line)
    new = "\n".join(out)
    if new != text:
        path.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    for f in DVC_FILES:
        sync(f)
