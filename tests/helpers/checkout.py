"""Which tests read the checkout's own files (README, docs, metrics/, dvc.yaml, dvc.lock, params.yaml, data/,
models/, or run a command in the checkout): they must carry the `checkout` marker, because the slow set runs exactly
those again inside the tiny repo after its `dvc repro` (tests/pipeline/test_pipeline_smoke.py). Found from the source:
`REPO / <path>` outside the code folders, `cwd=REPO`, `checked_tree(...)` (tests/helpers/committed.py) and
`Path("<output folder>/...")` in a module that never changes its working folder; a helper's finding counts for every
test that calls it."""

from __future__ import annotations

import ast
from pathlib import Path

CODE = {"tests", "medrank", "stages", ".."}  # REPO / "tests" ...: code, the same in every checkout
OUTPUTS = {"data", "models", "metrics", "plots", "submissions", "docs", "analysis"}
FILES = {"README.md", "RESULTS.md", "dvc.yaml", "dvc.lock", "params.yaml"}


def _repo_names(tree: ast.Module) -> set[str]:
    """The names bound to the checkout's root: `from tests.conftest import REPO` or `REPO = Path(__file__)...parents[n]`."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "tests.conftest":
            names |= {a.asname or a.name for a in n.names if a.name == "REPO"}
        elif isinstance(n, ast.Assign) and "__file__" in ast.unparse(n.value) and "parents[" in ast.unparse(n.value):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name) and t.id == "REPO"}
    return names


def _reads(node: ast.AST, names: set[str], relative: bool) -> list[str]:
    out = []
    for n in ast.walk(node):
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Div)
            and isinstance(n.left, ast.Name)
            and n.left.id in names
        ):
            first = n.right.value.split("/")[0] if isinstance(n.right, ast.Constant) else None
            if first not in CODE:
                out.append(ast.unparse(n))
        elif isinstance(n, ast.keyword) and n.arg == "cwd" and isinstance(n.value, ast.Name) and n.value.id in names:
            out.append(f"cwd={n.value.id}")
        elif (  # tests/helpers/committed.py: the checkout's tree (or its HEAD), unless given another repo
            isinstance(n, ast.Call)
            and ast.unparse(n.func).split(".")[-1] == "checked_tree"
            and not any(k.arg == "repo" for k in n.keywords)
        ):
            out.append("checked_tree()")
        elif (
            relative
            and isinstance(n, ast.Call)
            and ast.unparse(n.func) == "Path"
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)
            and n.args[0].value.split("/")[0] in OUTPUTS | FILES
        ):
            out.append(ast.unparse(n))
    return out


def _marked(decorators: list[ast.expr], mark: str) -> bool:
    return any(mark in ast.unparse(d).replace("pytest.mark.", " ").split() for d in decorators)


def _module_marks(tree: ast.Module) -> set[str]:
    marks = set()
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets):
            src = ast.unparse(n.value)
            marks |= {m for m in ("checkout", "slow") if f"mark.{m}" in src}
    return marks


def unmarked_checkout_readers(path: Path) -> list[str]:
    """`<test or module>: <what it reads>` for each test of `path` that reads the checkout without the marker."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    marks = _module_marks(tree)
    if marks & {"checkout", "slow"}:  # the slow tests build their own tiny repo (and compare it with this checkout)
        return []
    names = _repo_names(tree)
    # a test that moves to tmp_path (itself or by an autouse fixture) reads its own copy of a relative path
    moves = any(
        "chdir" in ast.unparse(n) and "autouse=True" in ast.unparse(n.decorator_list)
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    )
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = {name: _reads(f, names, not moves and "chdir" not in ast.unparse(f)) for name, f in funcs.items()}
    calls = {
        name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        for name, f in funcs.items()
    }
    changed = True
    while changed:  # a helper's reads are its callers' reads
        changed = False
        for name in funcs:
            for callee in calls[name] & funcs.keys():
                if found[callee] and not set(found[callee]) <= set(found[name]):
                    found[name] = sorted(set(found[name]) | set(found[callee]))
                    changed = True
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if reads := _reads(node, names, not moves):
            out.append(f"{path}: module level: {reads} (mark the module: pytestmark = pytest.mark.checkout)")
    for name, f in funcs.items():
        if name.startswith("test") and found[name] and not _marked(f.decorator_list, "checkout"):
            out.append(f"{path}::{name}: {found[name]} (add @pytest.mark.checkout)")
    return out
