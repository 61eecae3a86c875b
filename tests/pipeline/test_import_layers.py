"""Issue 62: medrank's subpackages form layers: each imports only from the layers below it (every `import`, at top
level, inside functions and under TYPE_CHECKING alike), so no package cycle can come back unseen."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "medrank"

# bottom first; a package may import from any package listed before it, never after it
LAYERS = (
    "core",  # errors, io, layout, frame, stash: what everything stands on
    "params",  # params.yaml's schema and the names every other package validates against
    "stage",  # a stage's entry (the params gate)
    "encoders",  # transformer encoders, caches, precision
    "text",  # cleaning and normalisation
    "data",  # acquisition, the MEDIQA / MedQuAD / SQuAD tables
    "task2",  # question entailment decisions
    "task3",  # answer tables, features, retrieval, the per-answer scores
    "selection",  # scorers, protocols, keep rules, the acceptance rule, nested LOSO's protocol
    "models",  # the baseline, the MTL, the CNN, their training and refits
    "steps",  # the inference path's fitted steps, shared by the stages that save them and `medrank rank`
    "serving",  # `medrank rank` / `serve` over the steps, the seal tool
    "reporting",  # README / RESULTS / cards from metrics
)


def package_imports() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: files}} over every medrank/<package>/ module."""
    out: dict[str, dict[str, set[str]]] = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE).parts
        if len(rel) < 2:
            continue  # medrank/cli.py and medrank/__init__.py sit above every layer
        src = rel[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for m in mods:
                parts = m.split(".")
                if parts[0] == "medrank" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir() and parts[1] != src:
                    out.setdefault(src, {}).setdefault(parts[1], set()).add(str(f.relative_to(REPO)))
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == set(LAYERS), f"give each package a layer in LAYERS: {sorted(packages ^ set(LAYERS))}"


def test_each_package_imports_only_from_the_layers_below_it():
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = [
        f"{src} -> {dst} ({', '.join(sorted(files))})"
        for src, targets in package_imports().items()
        for dst, files in targets.items()
        if rank[dst] > rank[src]
    ]
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    """A lazy import counts: the cycles came back through them before."""
    pkg = tmp_path / "medrank"
    for name, body in (("core", "def f():\n    from medrank.models.x import y\n"), ("models", "")):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
        (pkg / name / "a.py").write_text(body)
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "PACKAGE", pkg)
    monkeypatch.setattr(here, "REPO", tmp_path)
    assert package_imports() == {"core": {"models": {"medrank/core/a.py"}}}


@pytest.mark.checkout
def test_the_readme_map_lists_the_layers_in_their_order():
    """The README's "Where is what" tree names the packages bottom first, as LAYERS does (the map is the order)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tree = readme[readme.index("## Where is what") :].split("```")[1]
    listed = [line.split("/")[0].strip() for line in tree.splitlines() if line.startswith("  ") and "/" in line]
    assert listed == list(LAYERS)
