"""Model cards: one markdown file per trained model declared under `artifacts:` in dvc.yaml, plus an index.

Rendered by `medrank report` beside the README / RESULTS blocks and held current by the same drift check
(`stale_docs`). Every number is read at generation time: evaluation from metrics/*.json (and the score stage's
error-analysis CSVs), the training recipe from dvc.lock (the params the committed models were trained with; from
params.yaml, marked, for a stage never run), the data files from medrank/data/sources.py. A value no file holds
reads "not measured". The card's skeleton and the prose that holds no number are templates (medrank/reporting/templates/);
the sections built from numbers (what a model is for, where it stops) live in card_encoders.py / card_rankers.py, per
artifact name; an artifact without a section still gets a card from dvc.yaml and its stage's metrics files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Callable

from medrank.core.errors import MedrankError
from medrank.reporting.card_base import (
    CARDS_DIR,
    Card,
    HEADER,
    INDEX,
    MARK,
    MISSING,
    NOT_MEASURED,
    Repo,
    code_text,
    lock_file,
    md_cell,
    out_path,
)
from medrank.reporting.card_encoders import gated_note, nli_card, qa_card, rqe_card
from medrank.reporting.card_rankers import cnn_card, mtl_card
from medrank.reporting.formatting import flat_keys, fmt_num, md_table


CARDS: dict[str, Callable[[Repo, dict], Card]] = {
    "nli-cross-encoder": nli_card,
    "rqe-cross-encoder": rqe_card,
    "qa-cross-encoder": qa_card,
    "mtl-reranker": mtl_card,
    "cnn-reranker": cnn_card,
}


def _generic(repo: Repo, art: dict) -> Card:
    """An artifact without a section here: its dvc.yaml entry, its stage's params and metrics files in full."""
    stage = repo.stage_of(art["path"])
    files = [out_path(f) for f in ((repo.dvc.get("stages") or {}).get(stage or "") or {}).get("metrics") or []]
    ev = []
    for f in files:
        flat = flat_keys(repo.metrics.get(Path(f).stem) or {})
        ev += [f"<details><summary><code>{f}</code></summary>", "", "| key | value |", "|---|---|"] + [
            f"| {k} | {fmt_num(v)} |" for k, v in sorted(flat.items())
        ]
        ev += ["", "</details>", ""] if flat else [f"| — | {NOT_MEASURED} |", "", "</details>", ""]
    return Card(
        data=[f"{NOT_MEASURED}: no section for this artifact in `medrank/reporting/` yet.", ""],
        recipe=tuple(repo.declared_params(stage)),
        evaluation=ev or [f"{NOT_MEASURED}: stage `{stage}` declares no metrics file.", ""],
        use=[f"- {art.get('desc') or NOT_MEASURED}"],
    )


def render_card(repo: Repo, name: str, art: dict) -> str:
    """Markdown of one artifact's card."""
    card = CARDS.get(name, _generic)(repo, art)
    stage = repo.stage_of(art.get("path", ""))
    cmd = ((repo.dvc.get("stages") or {}).get(stage or "") or {}).get("cmd")
    what = [
        [
            "path",
            f"`{art.get('path')}` (type: {art.get('type', NOT_MEASURED)}; a DVC output, not in git: `dvc repro`, or `dvc pull` from a remote)",
        ],
        ["produced by", f"stage `{stage}` (`{cmd}`)" if stage else "no stage of dvc.yaml outputs it"],
        [
            "DVC hash",
            f"`{h}` ({lock_file(stage)})"
            if (h := repo.locked_hash(stage, art.get("path", "")))
            else f"{NOT_MEASURED} (stage not in dvc.lock)",
        ],
        ["labels", ", ".join(f"`{x}`" for x in art.get("labels") or []) or "—"],
    ] + card.what
    recipe = []
    for key in card.recipe:
        value, source = repo.param(key, stage)
        recipe.append([f"`{key}`", NOT_MEASURED if value is MISSING else code_text(value), source or "not recorded"])
    intro = []
    if stage and repo.locked_params(stage) is None:
        intro = [f"Stage `{stage}` has no dvc.lock entry yet: values from params.yaml, not a trained model's.", ""]
    table = md_table(["setting", "value", "read from"], recipe + card.recorded) if recipe or card.recorded else None
    text = _template("model_card.md").substitute(
        name=name,
        header=HEADER,
        desc=md_cell(art.get("desc") or ""),
        what=_join(md_table(["field", "value"], [[a, md_cell(b)] for a, b in what])),
        data=_join(card.data),
        gated=gated_note(repo),
        recipe=_join(intro + (table or [f"{NOT_MEASURED}.", ""])),
        evaluation=_join(card.evaluation),
        use=_join(card.use),
        limits=_join(card.limits),
    )
    return text.rstrip() + "\n"


def _template(name: str) -> Template:
    """A markdown skeleton of medrank/reporting/templates/ (the prose that holds no number)."""
    return Template((files("medrank.reporting") / "templates" / name).read_text(encoding="utf-8"))


def _join(lines: list[str]) -> str:
    return "\n".join(lines)


def render_index(repo: Repo) -> str:
    rows = [
        [
            f"[{name}]({name}.md)",
            f"`{art.get('path')}`",
            f"`{repo.stage_of(art.get('path', '')) or '—'}`",
            md_cell(art.get("desc") or ""),
        ]
        for name, art in repo.artifacts.items()
    ]
    table = md_table(["artifact", "path", "stage", "what it is"], rows)
    text = _template("model_cards_index.md").substitute(header=HEADER, not_measured=NOT_MEASURED, table=_join(table))
    return text.rstrip() + "\n"


def render_cards(repo_root: str | Path = ".", metrics_dir: str | Path = "metrics") -> dict[str, str]:
    """File name -> markdown for every artifact of the repo's dvc.yaml, plus the index (none without artifacts)."""
    repo = Repo.load(repo_root, metrics_dir)
    if not repo.artifacts:
        return {}
    return {
        INDEX: render_index(repo),
        **{f"{name}.md": render_card(repo, name, art) for name, art in repo.artifacts.items()},
    }


def pending_cards(
    repo_root: str | Path, cards_dir: str | Path, metrics_dir: str | Path
) -> list[tuple[Path, str | None]]:
    """(card file, its new text) for each card that is stale or missing; (file, None) for a generated card whose artifact is gone."""
    cards_dir = Path(cards_dir)
    # `--cards README.md` (or README.md/cards, a dangling link) was a FileExistsError traceback at the first write
    blocker = next((p for p in (cards_dir, *cards_dir.parents) if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        where = "a file" if blocker == cards_dir else f"{blocker} is a file"
        raise MedrankError(f"{cards_dir}: {where}, not a model-cards folder {_DEFAULT}")
    wanted = {cards_dir / name: text for name, text in render_cards(repo_root, metrics_dir).items()}
    for p in wanted:  # `--cards .` would overwrite the README with the card index: only our own files are rewritten
        if p.exists() and not _generated(p):
            raise MedrankError(
                f"{p}: not a generated model card (no `{MARK}` line): {cards_dir} is not a model-cards folder {_DEFAULT}"
            )
    _check_cards_content(cards_dir)
    out: list[tuple[Path, str | None]] = [
        (p, t)
        for p, t in wanted.items()
        if not p.is_file() or p.read_bytes() != t.encode("utf-8")  # a stray byte: stale
    ]
    for p in sorted(cards_dir.glob("*.md")) if cards_dir.is_dir() else []:
        if p not in wanted and _generated(p):
            out.append((p, None))
    return out


_DEFAULT = f"(default {CARDS_DIR} beside the README); nothing written"


def _generated(p: Path) -> bool:
    return p.is_file() and MARK in p.read_text(encoding="utf-8", errors="replace")


def _check_cards_content(cards_dir: Path) -> None:
    """A cards folder holds our cards and hand-written notes (*.md) beside them, or nothing yet. The guard above sees
    only the files it would overwrite, which `docs/` and `metrics/` lack: five cards went in among their files."""
    if not cards_dir.is_dir():
        return
    # hidden names are skipped: a killed write's `.<name>.*.tmp`, an editor's swap file
    entries = sorted(p for p in cards_dir.iterdir() if not p.name.startswith("."))
    foreign = [p for p in entries if p.suffix != ".md" or not p.is_file()]
    if foreign:
        name = foreign[0].name + ("/" if foreign[0].is_dir() else "")
        raise MedrankError(f"{cards_dir}: holds {name}, not a model card: not a model-cards folder {_DEFAULT}")
    if entries and not any(_generated(p) for p in entries):
        raise MedrankError(
            f"{cards_dir}: no generated model card among its {len(entries)} *.md files (no `{MARK}` line): "
            f"not a model-cards folder {_DEFAULT}"
        )
