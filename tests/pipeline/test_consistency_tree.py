"""tests/helpers/committed.py: which tree the consistency checks (documents = metrics, the frozen band recorded for
the committed data) read. A user's own `dvc repro` of the committed code (other metrics on another CPU kind) is
checked as committed; a fresh clone, a developer's edit, refreshed claims and a tree without git as they are.
End to end on a copy of this checkout: tests/pipeline/test_user_repro.py (slow)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import GIT
from tests.helpers.committed import BAND, checked_tree

DVC_YAML = {
    "stages": {
        "train": {"cmd": "python -m stages.train", "outs": ["models/m"], "metrics": [{"metrics/train.json": {}}]},
        "noise_band": {"cmd": "python -m stages.noise_band", "frozen": True, "metrics": ["metrics/noise_band.json"]},
        "plot": {"cmd": "python -m stages.plot", "plots": [{"plots/curves": {"cache": False}}]},
    }
}
LOCK = {"schema": "2.0", "stages": {"train": {"outs": [{"path": "models/m", "md5": "aaa"}]}, "noise_band": {"x": 1}}}
FILES = {
    "dvc.yaml": yaml.safe_dump(DVC_YAML),
    "dvc.lock": yaml.safe_dump(LOCK),
    "params.yaml": "seed: 0\n",
    "README.md": "# r\n<!-- headline:start -->\n0.5\n<!-- headline:end -->\n",
    "docs/model_cards/m.md": "card 0.5\n",
    "docs/notes.md": "by hand\n",
    "metrics/train.json": '{"accuracy": 0.5}\n',
    "metrics/noise_band.json": '{"accuracy": 0.01}\n',
    "plots/curves/loss.tsv": "step\tloss\n0\t1\n",
    "stages/train.py": "print(1)\n",
}
REPRO = {  # what a repro on another CPU kind rewrites (the frozen band's entry and file stay)
    "metrics/train.json": '{"accuracy": 0.6}\n',
    "dvc.lock": yaml.safe_dump({**LOCK, "stages": {**LOCK["stages"], "train": {"outs": [{"md5": "bbb"}]}}}),
    "plots/curves/loss.tsv": "step\tloss\n0\t2\n",
}


def _repo(tmp_path: Path, files: dict[str, str] = FILES, git: bool = True) -> Path:
    repo = tmp_path / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    if git:
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
        subprocess.run([*GIT, "commit", "-qm", "committed"], cwd=repo, check=True)
    return repo


def _edit(repo: Path, files: dict[str, str | None]) -> None:
    for name, text in files.items():
        if text is None:
            (repo / name).unlink()
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)


def _reads(tmp_path: Path, repo: Path) -> tuple[str, str]:
    """('head' or 'tree') for the documents' check and for the band's, each as its test calls the helper."""
    docs = checked_tree(tmp_path / "docs", repo=repo)
    band = checked_tree(tmp_path / "band", claims=BAND, lock_stages=("noise_band",), repo=repo)
    for root in (docs, band):
        if root != repo:  # a snapshot of HEAD: the committed files, the working tree untouched
            assert {
                p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and ".git" not in p.parts
            } == set(FILES)
            assert all((root / n).read_text() == t for n, t in FILES.items())
    return tuple("tree" if root == repo else "head" for root in (docs, band))


@pytest.mark.parametrize(
    "edits, expected",
    [
        ({}, ("tree", "tree")),  # a fresh clone (CI): HEAD is the tree, committed drift fails
        (REPRO, ("head", "head")),  # a user's own repro: checked as committed
        # ... with a file the repro removed or added (other training sets, other plot names), a venv inside the checkout
        (
            {**REPRO, "plots/curves/loss.tsv": None, "plots/curves/new.tsv": "x\n", "venv/bin/python": "x"},
            ("head", "head"),
        ),
        # ... then `medrank report`: the documents are the user's, checked against the user's metrics
        ({**REPRO, "README.md": "# r\n<!-- headline:start -->\n0.6\n<!-- headline:end -->\n"}, ("tree", "head")),
        ({**REPRO, "docs/model_cards/m.md": "card 0.6\n"}, ("tree", "head")),
        # ... then the band's refresh: checked as the user's
        ({**REPRO, "metrics/noise_band.json": '{"accuracy": 0.02}\n'}, ("head", "tree")),
        (
            {"dvc.lock": yaml.safe_dump({**LOCK, "stages": {**LOCK["stages"], "noise_band": {"x": 2}}})},
            ("head", "tree"),
        ),
        # a developer's edit of code, params or hand-written text: the working tree, whatever else changed
        ({**REPRO, "stages/train.py": "print(2)\n"}, ("tree", "tree")),
        ({**REPRO, "params.yaml": "seed: 1\n"}, ("tree", "tree")),
        ({**REPRO, "docs/notes.md": "edited\n"}, ("tree", "tree")),
        ({**REPRO, "dvc.yaml": yaml.safe_dump({"stages": {}})}, ("tree", "tree")),
    ],
)
def test_the_checks_read_head_only_after_a_repro_of_the_committed_code(tmp_path, edits, expected):
    repo = _repo(tmp_path)
    _edit(repo, edits)
    before = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert _reads(tmp_path, repo) == expected
    after = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert before == after and all((repo / n).is_file() for n in edits if edits[n] is not None)


def test_without_a_committed_record_the_checks_read_the_working_tree(tmp_path):
    """No git (a tarball), a checkout inside another repo, a HEAD without dvc.lock (the slow set's tiny repo, whose
    repro wrote the lock): nothing to compare with, so the working tree is checked (never a skip: CI runs them)."""
    plain = _repo(tmp_path / "plain", git=False)
    _edit(plain, REPRO)
    assert _reads(tmp_path / "plain", plain) == ("tree", "tree")
    outer = _repo(tmp_path / "outer")
    inner = outer / "inner"
    _edit(inner, {**FILES, **REPRO})
    assert _reads(tmp_path / "outer", inner) == ("tree", "tree")
    tiny = _repo(tmp_path / "tiny", {n: t for n, t in FILES.items() if n != "dvc.lock"})
    _edit(tiny, REPRO)
    assert _reads(tmp_path / "tiny", tiny) == ("tree", "tree")
