"""Real questions to try: the MEDIQA validation questions with CHiQA's answers in CHiQA's order, as `medrank rank` /
POST /rank bodies, read from the working folder's cleaned answers (stage clean's output; nothing is shipped in the
package: the MEDIQA data has no licence file). The page's "Load an example" and benchmarks/serve.py read them."""

from __future__ import annotations

from pathlib import Path

from medrank.core import layout
from medrank.core.errors import MedrankError


def validation_questions(path: str | Path = layout.CLEAN_ANSWERS) -> list[dict]:
    """{qid, question, answers: [{id, text, url}]} per validation question (by qid), answers by CHiQA's rank."""
    from medrank.core.io import read_parquet

    path = Path(path)
    if not path.is_file():
        raise MedrankError(f"{path}: no cleaned answers here (run `dvc pull` or `dvc repro clean` in this folder)")
    clean = read_parquet(path, columns=["split", "qid", "question", "aid", "answer", "url", "system_rank"])
    val = clean[clean["split"] == layout.VAL_SPLIT]
    out = []
    for qid, rows in val.groupby("qid", sort=True):
        rows = rows.sort_values("system_rank", kind="stable")
        answers = [
            {"id": str(a), "text": t, "url": u or ""} for a, t, u in zip(rows["aid"], rows["answer"], rows["url"])
        ]
        out.append({"qid": str(qid), "question": rows["question"].iloc[0], "answers": answers})
    return out
