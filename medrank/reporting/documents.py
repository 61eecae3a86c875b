"""README.md, docs/pipeline.md and RESULTS.md blocks and the model cards, rendered from the repo itself (never typed by hand).

README.md holds the headline table (`headline` block); docs/pipeline.md beside it holds `dvc dag --md` (`dag` block);
RESULTS.md holds every other table (`results` block) and the stages' seconds (`timings` block: machine-dependent,
refreshed by `update_docs`, never part of the drift check). Each block sits between `<!-- NAME:start -->` and
`<!-- NAME:end -->`; the prose around the markers is hand-written and left alone. The model cards (docs/model_cards/, medrank/reporting/cards.py) are whole
generated files, one per `artifacts:` entry of the README's repository's dvc.yaml.
"""

from __future__ import annotations

from pathlib import Path

from medrank.core.errors import MedrankError
from medrank.core.io import write_text
from medrank.reporting.card_base import CARDS_DIR
from medrank.reporting.cards import pending_cards
from medrank.reporting.formatting import check_metrics_dir, load_repo_yaml, read_repo_text
from medrank.reporting.headline import render_headline
from medrank.reporting.results import render_results
from medrank.reporting.timings import render_timings


def render_dag(repo: str | Path = ".") -> str:
    """`dvc dag --md` of the repo (the mermaid graph docs/pipeline.md shows)."""
    import subprocess
    import sys

    for name in REPO_YAML:  # what DVC reads to draw the graph: a conflict-marked file is named, not DVC's last line
        load_repo_yaml(Path(repo) / name)
    r = subprocess.run([sys.executable, "-m", "dvc", "dag", "--md"], cwd=repo, capture_output=True, text=True)
    if r.returncode != 0:
        raise MedrankError(f"dvc dag --md failed in {repo}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout.rstrip() + "\n"


REPO_YAML = ("dvc.yaml", "dvc.lock", "params.yaml", "analysis/dvc.yaml", "analysis/dvc.lock")

# Which generated blocks each document must hold (the DAG is rendered in the README's own repository).
README_BLOCKS = ("headline",)
PIPELINE_DOC = Path("docs") / "pipeline.md"  # relative to the README's folder: the DAG and what each stage does
PIPELINE_BLOCKS = ("dag",)

RESULTS_BLOCKS = ("results", "timings")
UNCHECKED_BLOCKS = frozenset({"timings"})  # what a re-run on another machine changes: refreshed, never a drift


def _render(block: str, repo: Path, metrics_dir: str | Path) -> str:
    if block == "dag":
        return render_dag(repo.resolve())
    return {"headline": render_headline, "results": render_results, "timings": render_timings}[block](metrics_dir)


def _split(doc: Path, text: str, block: str) -> tuple[str, str]:
    """(text up to and including the block's start marker, text from its end marker on)."""
    start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise MedrankError(f"{doc}: needs exactly one {start} ... {end} pair")
    head, rest = text.split(start, 1)
    return head + start, end + rest.split(end, 1)[1]


def _read(doc: Path) -> str:
    if not doc.is_file():
        raise MedrankError(f"{doc}: not found (run from the repository root, or pass its path)")
    return read_repo_text(doc, "a document")  # a latin-1 byte is one line naming the file and the byte's offset


def _refreshed(doc: Path, blocks: tuple[str, ...], repo: Path, metrics_dir: str | Path) -> tuple[str, str]:
    """(current text, text with every block in `blocks` re-rendered; `repo`: the README's folder)."""
    text = new = _read(doc)
    for block in blocks:
        head, tail = _split(doc, new, block)
        new = f"{head}\n{_render(block, repo, metrics_dir)}{tail}"
    return text, new


def _pending(
    readme: str | Path, results: str | Path, metrics_dir: str | Path, cards: str | Path | None, check: bool = False
) -> list[tuple[Path, str | None]]:
    """(document, its re-rendered text) for each document whose generated text is out of date; (card, None) for a
    generated card whose artifact left dvc.yaml. Cards: `cards`, else docs/model_cards/ beside the README; the DAG:
    docs/pipeline.md beside the README. `check`: the drift check, blind to the UNCHECKED_BLOCKS."""

    repo = Path(readme).parent
    check_metrics_dir(metrics_dir, repo)
    out: list[tuple[Path, str | None]] = []
    docs = ((Path(readme), README_BLOCKS), (repo / PIPELINE_DOC, PIPELINE_BLOCKS), (Path(results), RESULTS_BLOCKS))
    for doc, blocks in docs:
        compared = tuple(b for b in blocks if not (check and b in UNCHECKED_BLOCKS))
        text, new = _refreshed(doc, compared, repo, metrics_dir)
        for block in sorted(set(blocks) - set(compared)):
            _split(doc, text, block)  # not compared, but its markers must be there
        if new != text:
            out.append((doc, new))
    return out + pending_cards(repo, Path(cards) if cards else repo / CARDS_DIR, metrics_dir)


def stale_docs(
    readme: str | Path = "README.md",
    results: str | Path = "RESULTS.md",
    metrics_dir: str | Path = "metrics",
    cards: str | Path | None = None,
) -> list[Path]:
    """The documents whose generated text differs from metrics/ (or from dvc.yaml / dvc.lock: the DAG in
    docs/pipeline.md, the cards), missing cards included; the timings block is not compared (it only has to be there)."""
    return [doc for doc, _ in _pending(readme, results, metrics_dir, cards, check=True)]


def update_docs(
    readme: str | Path = "README.md",
    results: str | Path = "RESULTS.md",
    metrics_dir: str | Path = "metrics",
    cards: str | Path | None = None,
) -> list[Path]:
    """Re-render README's headline block, docs/pipeline.md's DAG block, RESULTS.md's results and timings blocks and the
    model cards (a card whose artifact is gone is removed); returns the files that changed."""
    pending = _pending(readme, results, metrics_dir, cards)
    for doc, new in pending:
        if new is None:
            doc.unlink()
        else:
            write_text(doc, new)
    return [doc for doc, _ in pending]
