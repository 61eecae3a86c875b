"""Which tree the repository-consistency checks read: the working tree, or the committed one (HEAD).

Those checks compare claims with what they were made from: the generated documents (README.md, RESULTS.md,
docs/pipeline.md, the model cards) with metrics/ and dvc.lock; the frozen noise band's dvc.lock entry with
params.yaml and the entries of the stages it reads. A user's own `dvc repro` of the committed code legitimately
rewrites metrics/, plots/, submissions/ and dvc.lock (another CPU kind fine-tunes other weights), which is no defect:
when every tracked file that differs from HEAD is such an output (or a document `medrank report` rewrites from them)
and the check's claims are untouched, the check reads HEAD's files, a snapshot by `git archive` (git state unchanged).
Otherwise it reads the working tree: a fresh clone (CI: the tree is HEAD, so committed drift fails), a developer's
edit of code, params or hand-written text (what it reproduces must match its documents), claims the user refreshed
(`medrank report`, the band's `python -m stages.noise_band && dvc commit -f analysis/dvc.yaml:noise_band`: then checked as theirs), or
no git to compare with (a tarball, a repo whose HEAD has no dvc.lock such as the slow set's tiny repo): never a skip.
Untracked files never count (a venv inside the checkout, a plot file named by other chosen training sets)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

import yaml

from tests.conftest import REPO

LOCKS = ("dvc.lock", "analysis/dvc.lock")
GENERATED_DOCS = ("README.md", "RESULTS.md", "docs/pipeline.md", "docs/model_cards")  # what `medrank report` writes
BAND = ("metrics/noise_band.json", "metrics/noise_band_seconds.json")  # the frozen band's outputs (dvc.yaml)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--no-optional-locks", *args], cwd=repo, capture_output=True)


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def repro_outputs(repo: Path = REPO) -> tuple[str, ...]:
    """The paths `dvc repro` writes: the locks and every out / metrics / plots entry of dvc.yaml and analysis/dvc.yaml
    (a templated `${...}` name: its folder)."""
    out = list(LOCKS)
    for name in ("dvc.yaml", "analysis/dvc.yaml"):
        f = repo / name
        doc = yaml.safe_load(f.read_text(encoding="utf-8")) if f.is_file() else None
        for st in ((doc or {}).get("stages") or {}).values():
            st = st.get("do", st)  # a foreach stage's body
            for entry in (e for key in ("outs", "metrics", "plots") for e in st.get(key) or []):
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                out.append(path.split("${")[0].rsplit("/", 1)[0] if "${" in path else path)
    return tuple(p.rstrip("/") for p in out if p)


def changed_files(repo: Path = REPO) -> list[str] | None:
    """The tracked files whose working-tree content differs from HEAD (deleted ones included); None when there is no
    committed record to compare with: no git, `repo` not the top of its work tree, no commit, or no dvc.lock at HEAD."""
    try:
        top = _git(repo, "rev-parse", "--show-toplevel")
    except OSError:  # no git installed
        return None
    if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != repo.resolve():
        return None
    if _git(repo, "cat-file", "-e", "HEAD:dvc.lock").returncode != 0:
        return None
    diff = _git(repo, "diff", "--name-only", "--no-renames", "-z", "HEAD", "--")
    if diff.returncode != 0:
        return None
    return [p for p in diff.stdout.decode().split("\0") if p]


def _lock_entries(text: str | bytes, stages: Iterable[str]) -> list:
    locked = (yaml.safe_load(text) or {}).get("stages") or {}
    return [locked.get(s) for s in stages]


def checked_tree(
    tmp_path: Path, claims: Iterable[str] = GENERATED_DOCS, lock_stages: Iterable[str] = (), repo: Path = REPO
) -> Path:
    """The root whose files a consistency check reads: `repo`, or a snapshot of its HEAD under `tmp_path` when its
    working tree differs from HEAD only by a repro's outputs and the generated documents, none of them under `claims`
    (paths) and no dvc.lock / analysis/dvc.lock entry of `lock_stages` changed (the check's own claims: refreshed ones are checked as
    they are)."""
    changed = changed_files(repo)
    if not changed:
        return repo
    if not all(_under(f, (*repro_outputs(repo), *GENERATED_DOCS)) for f in changed) or any(
        _under(f, claims) for f in changed
    ):
        return repo
    lock_stages = tuple(lock_stages)
    for lock in ("dvc.lock", "analysis/dvc.lock"):
        if lock_stages and lock in changed:
            head = _git(repo, "show", f"HEAD:{lock}").stdout
            now = (repo / lock).read_bytes() if (repo / lock).is_file() else b""
            if _lock_entries(head, lock_stages) != _lock_entries(now, lock_stages):
                return repo
    return snapshot(repo, tmp_path / "HEAD")


def snapshot(repo: Path, dest: Path) -> Path:
    """HEAD's tracked files in `dest` (`git archive`: nothing of `repo` or its git state changes), itself a git repo
    without commits (`dvc dag`, which draws docs/pipeline.md's DAG, wants one)."""
    tar = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=repo, capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def described(root: Path, repo: Path = REPO) -> str:
    """A failure message's note on which files were compared."""
    if root == repo:
        return ""
    return (
        f" (the committed files, HEAD, in {root}: the working tree differs only by a `dvc repro`'s outputs,"
        " so these are what is wrong in the repository)"
    )
