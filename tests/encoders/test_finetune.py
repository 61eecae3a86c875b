"""The finetune_nli and finetune_rqe stages end to end on fixture tables with a tiny random BERT, plus their data helpers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from medrank.data.schemas import LIVEQA_QUESTIONS, MEDQUAD, MEQSUM, NLI, RQE_PAIRS
from medrank.data.mining import medquad_rqe_pairs
from medrank.data.tasks import NLI_LABELS, cap_pairs, nli_task, rqe_task
from medrank.encoders.cross_encoder import CrossEncoder
from medrank.core.errors import MedrankError
from medrank.core.io import write_parquet

from tests.conftest import REPO, run_module, write_params
from tests.helpers.models import FIXTURES, make_tiny_bert


def fixture_pairs() -> pd.DataFrame:
    return pd.read_csv(FIXTURES / "pairs.tsv", sep="\t")


def fixture_medquad() -> pd.DataFrame:
    mq = pd.read_csv(FIXTURES / "medquad.tsv", sep="\t")
    for col in ("collection", "document_id", "url", "answer", "answer_raw"):
        mq[col] = "x"
    return mq


def rqe_table(df: pd.DataFrame) -> pd.DataFrame:
    split = ["train"] * 32 + ["val"] * 8 + ["test"] * 8
    out = pd.DataFrame(
        {
            "split": split,
            "pid": [str(i % 32 + 1) if s != "train" else str(i + 1) for i, s in enumerate(split)],
            "chq": df["text_a"],
            "faq": df["text_b"],
            "pair_type": None,
            "label": df["label"].astype("Int8"),
        }
    )
    out.loc[out["split"] == "test", "label"] = pd.NA
    out.loc[out["split"] == "val", "pid"] = [str(i) for i in range(1, 9)]
    out.loc[out["split"] == "test", "pid"] = [str(i) for i in range(1, 9)]
    return out


def consumer_tables(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """MeQSum- and LiveQA-shaped tables from the fixture's positive pairs (consumer question -> short question)."""
    pos = df[df["label"] == 1].reset_index(drop=True)
    meqsum = pd.DataFrame({"file": [f"f{i}" for i in range(len(pos))], "chq": pos["text_a"], "summary": pos["text_b"]})
    lq = pos.head(6)
    liveqa = pd.DataFrame(
        {
            "lq_id": [f"TQ{i + 1}" for i in range(len(lq))],
            "number": range(1, len(lq) + 1),
            "subject": "s",
            "message": lq["text_a"],
            "question": lq["text_a"],
            "nist_paraphrase": lq["text_b"],
            "nlm_summary": lq["text_b"].str.upper(),
            "foci": [["x"]] * len(lq),
            "types": [["TREATMENT"]] * len(lq),
            "mediqa_qid": [str(i + 1) for i in range(len(lq))],
        }
    )
    return meqsum, liveqa


def nli_table(df: pd.DataFrame) -> pd.DataFrame:
    split = ["train"] * 32 + ["dev"] * 8 + ["test"] * 8
    label = [NLI_LABELS[0] if y else NLI_LABELS[2 if i % 4 == 1 else 1] for i, y in enumerate(df["label"])]
    return pd.DataFrame(
        {
            "dataset": "sick",
            "split": split,
            "pair_id": [str(i) for i in range(len(df))],
            "premise": df["text_a"],
            "hypothesis": df["text_b"],
            "label": label,
        }
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A project folder with params.yaml, clean tables, the official-format gold and a tiny base model."""
    root = tmp_path_factory.mktemp("proj")
    base = make_tiny_bert(root / "tiny_base")
    df = fixture_pairs()
    clean = root / "data" / "interim" / "clean"
    write_parquet(rqe_table(df), clean / "rqe_pairs.parquet", RQE_PAIRS)
    write_parquet(nli_table(df), clean / "nli.parquet", NLI)
    write_parquet(fixture_medquad(), clean / "medquad.parquet", MEDQUAD)
    meqsum, liveqa = consumer_tables(df)
    write_parquet(meqsum, clean / "meqsum.parquet", MEQSUM)
    write_parquet(liveqa, clean / "liveqa_questions.parquet", LIVEQA_QUESTIONS)
    gold = root / "data" / "raw" / "mediqa2019" / "Eval_Scripts" / "data" / "RQE_validationSet_ground_truth.txt"
    gold.parent.mkdir(parents=True)
    val = rqe_table(df).query("split == 'val'")
    gold.write_text("pair_id,label\n" + "".join(f"{p},{int(y)}\n" for p, y in zip(val["pid"], val["label"])))
    task = {
        "base_model": str(base),
        "max_length": 32,
        "epochs": 2,
        "lr": 3e-3,
        "batch_size": 8,
        "train_precision": "fp32",
        "predict_precision": "fp32",
        "threads": 1,
        "eval_every": 4,
    }
    params = {
        "seed": 7,
        "device": "cpu",
        "finetune": {
            "nli": task,
            "rqe": {
                **task,
                "epochs": 1,
                "medquad_pairs": 12,
                "folds": 2,
                "val_epochs": 1,
                "bi_encoder": str(base),
                "extra_sets": [["amia"], ["meqsum", "liveqa", "medquad"]],
                "bi_encoder_sets": [["meqsum"]],
                "val_only_rows": True,
                "val_stages": ["cross_encoder", "bi_encoder"],
            },
        },
    }
    write_params(root, params)
    return root


def run_stage(task: str, cwd: Path):
    return run_module(f"stages.finetune_{task}", cwd=cwd, env={"OMP_NUM_THREADS": "1"})


def run_stage_in_process(task: str, cwd: Path, monkeypatch) -> None:
    """Same as `python -m stages.finetune_<task>` minus the interpreter start (torch imports once per session)."""
    import importlib

    import torch

    stage = importlib.import_module(f"stages.finetune_{task}")
    n = torch.get_num_threads()
    monkeypatch.chdir(cwd)
    try:
        stage.main()
    finally:
        torch.set_num_threads(n)


def test_rqe_stage_selects_by_grouped_cv_and_writes_model_metrics_submissions_and_curves(workdir, monkeypatch):
    res = run_stage("rqe", workdir)
    assert res.returncode == 0, res.stderr[-2000:]
    m = json.loads((workdir / "metrics" / "finetune_rqe.json").read_text())
    rows = m["rows"]
    # every row side by side: the sets alone, the sets then validation pairs, validation only, cosine, stacks
    expected = {
        "zero-shot bi-encoder cosine",
        "ce: val",
        "ce: amia",
        "ce: amia > val",
        "ce: meqsum+liveqa+medquad",
        "ce: meqsum+liveqa+medquad > val",
        "bi: val",
        "bi: meqsum",
        "bi: meqsum > val",
    }
    assert expected <= set(rows) and any(r["kind"] == "stack" for r in rows.values())
    for name, r in rows.items():
        assert (
            len(r["accuracy_folds"]) == 2
            and 0 <= r["accuracy"] <= 1
            and r["accuracy"] == pytest.approx(np.mean(r["accuracy_folds"]), abs=1e-4)
        )
        assert sum(b["n"] for b in r["by_overlap"].values()) == 8, name
    assert (
        m["n_pretrain_pairs"]["medquad"] == 12
        and m["n_pretrain_pairs"]["amia"] == 32
        and m["n_pretrain_pairs"]["meqsum"] > 0
    )
    # the chosen row has the best mean CV accuracy of every row
    assert m["chosen"] in rows and m["cv"]["accuracy"] == max(r["accuracy"] for r in rows.values())
    assert m["recipe"]["features"] == rows[m["chosen"]]["recipe"]["features"]
    # a stacked recipe says how retrieval rebuilds it; a fine-tuned bi-encoder sits inside the cross-encoder's folder
    stack = m["recipe"]["stack"]
    assert (stack is None) == (m["recipe"]["features"] == ["ce"])
    assert (workdir / "models" / "rqe" / "bi_encoder").exists() == bool(stack and stack["bi_encoder_local"])
    # task2_probs: the chosen row's out-of-fold P(entailed) of every validation pair (with its CHQ fold) and the final
    # model's of the test pairs; stage task2 decides them within each CHQ and writes the submissions
    probs = pd.read_parquet(workdir / "data" / "processed" / "task2_probs.parquet")
    assert probs["split"].value_counts().to_dict() == {"val": 8, "test": 8} and probs["prob"].between(0, 1).all()
    val = probs[probs["split"] == "val"]
    assert (
        set(val["fold"]) == {0, 1}
        and (val.groupby("chq")["fold"].nunique() == 1).all()
        and (probs.loc[probs["split"] == "test", "fold"] == -1).all()
    )
    res = run_module("stages.task2", cwd=workdir)
    assert res.returncode == 0, res.stderr[-2000:]
    for split in ("val", "test"):
        lines = (workdir / "submissions" / f"task2_{split}.csv").read_text().splitlines()
        assert lines[0] == "pair_id,label" and len(lines) == 9
        assert {line.split(",")[1] for line in lines[1:]} <= {"0", "1"}
    t2 = json.loads((workdir / "metrics" / "task2.json").read_text())
    assert (
        t2["chosen"] in t2["rules"]
        and 0 <= t2["nested_cv"]["accuracy"] <= 1
        and 0 <= t2["val_official_oof"]["accuracy"] <= 1
    )
    # dvclive curves per pretrained source set, x = optimizer step
    curves = workdir / "plots" / "finetune_rqe" / "plots" / "metrics"
    for name in (
        "ce/amia/train/loss.tsv",
        "ce/amia/val/accuracy.tsv",
        "ce/meqsum+liveqa+medquad/val/accuracy.tsv",
        "bi/meqsum/train/loss.tsv",
    ):
        assert len(pd.read_csv(curves / name, sep="\t")) >= 1, name
    model = CrossEncoder.load(workdir / "models" / "rqe", device="cpu", precision="fp32")
    assert model.fingerprint == m["model_fingerprint"] and model.label_names == ["not_entailed", "entailed"]

    # same params, same metrics (seeded, deterministic)
    first = (workdir / "data" / "processed" / "task2_probs.parquet").read_bytes()
    run_stage_in_process("rqe", workdir, monkeypatch)
    again = json.loads((workdir / "metrics" / "finetune_rqe.json").read_text())
    assert again["rows"] == m["rows"]
    assert (workdir / "data" / "processed" / "task2_probs.parquet").read_bytes() == first


def test_nli_stage_three_classes(workdir, monkeypatch):
    run_stage_in_process("nli", workdir, monkeypatch)
    m = json.loads((workdir / "metrics" / "finetune_nli.json").read_text())
    assert m["val"]["n"] == 8 and m["test"]["n"] == 8 and "val_official" not in m
    dev = pd.read_csv(workdir / "submissions" / "nli_sick_dev.csv", dtype=str)
    assert list(dev.columns) == ["pair_id", "label"] and len(dev) == 8 and set(dev["label"]) <= set(NLI_LABELS)
    assert len(pd.read_csv(workdir / "submissions" / "nli_sick_test.csv")) == 8
    assert CrossEncoder.load(workdir / "models" / "nli", device="cpu").label_names == list(NLI_LABELS)
    # dvclive curves, x = optimizer step: a point every eval_every (4) steps, at most one per step (4 steps/epoch)
    for name in ("train/loss.tsv", "val/accuracy.tsv", "val/loss.tsv", "val/macro_f1.tsv"):
        tsv = pd.read_csv(workdir / "plots" / "finetune_nli" / "plots" / "metrics" / name, sep="\t")
        assert tsv["step"].tolist() == [4, 8], name


def test_stage_missing_table_is_a_medrank_error(tmp_path, monkeypatch):
    write_params(tmp_path, {"seed": 1})
    with pytest.raises(MedrankError, match="rqe_pairs.parquet: file not found"):
        run_stage_in_process("rqe", tmp_path, monkeypatch)


# ---------------------------------------------------------------- data helpers


def test_cap_pairs_is_stratified_and_seeded():
    pairs = [(str(i), "x") for i in range(100)]
    labels = np.array([1] * 30 + [0] * 70)
    a, ya = cap_pairs(pairs, labels, 20, np.random.default_rng(0))
    b, yb = cap_pairs(pairs, labels, 20, np.random.default_rng(0))
    assert a == b and len(a) == 20 and ya.sum() == 6
    assert cap_pairs(pairs, labels, None, np.random.default_rng(0))[0] is pairs


def test_medquad_mining_shapes_pairs_like_mediqa():
    mq = fixture_medquad()
    pairs, labels = medquad_rqe_pairs(mq, 40, np.random.default_rng(0))
    assert len(pairs) == 40 and labels.sum() == 20
    focus_of = dict(zip(mq["question"].str.replace(" ?", "?", regex=False), mq["focus"]))
    for (chq, faq), y in zip(pairs, labels):
        focus = chq.split(".", 1)[0]
        assert focus in focus_of.values()
        if y == 1:
            assert focus_of[faq] == focus
        assert faq.lower() not in chq.lower()  # the CHQ says it in its own words: no copy shortcut
    # seeded
    assert medquad_rqe_pairs(mq, 40, np.random.default_rng(0))[0] == pairs
    with pytest.raises(MedrankError, match="two question types"):
        medquad_rqe_pairs(mq[mq["question_type"] == "information"], 4, np.random.default_rng(0))


def test_task_tables_validate():
    df = fixture_pairs()
    t = rqe_task(rqe_table(df))
    assert len(t.train_pairs) == 32 and len(t.eval_ids) == 8 and len(t.test_ids) == 8 and t.test_labels is None
    n = nli_task(nli_table(df))
    assert set(n.train_labels) <= {0, 1, 2} and n.test_labels is not None
    c = n.capped(3)
    assert len(c.eval_pairs) == len(c.eval_ids) == len(c.test_labels) == 3 and len(c.train_pairs) == 32
    assert c.eval_ids == n.eval_ids[:3] and n.capped(None) is n
    with pytest.raises(MedrankError, match="no rows for dataset 'mednli'"):
        nli_task(nli_table(df), "mednli")
    bad = nli_table(df).assign(label="maybe")
    with pytest.raises(MedrankError, match="unknown labels"):
        nli_task(bad)


@pytest.mark.checkout
def test_repo_dvc_yaml_declares_finetune_stages():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    # finetune_nli feeds the MTL's grids only: an analysis/dvc.yaml stage since system_choice picked the baseline
    dvc["stages"] |= yaml.safe_load((REPO / "analysis/dvc.yaml").read_text())["stages"]
    for task in ("nli", "rqe"):
        stage = dvc["stages"][f"finetune_{task}"]
        assert stage["cmd"] == f"python -m stages.finetune_{task}" and f"finetune.{task}" in stage["params"]
        assert f"models/{task}" in [next(iter(o)) if isinstance(o, dict) else o for o in stage["outs"]]
    assert "data/interim/clean/meqsum.parquet" in dvc["stages"]["finetune_rqe"]["deps"]
    assert "medrank/models/rqe.py" not in dvc["stages"]["finetune_nli"]["deps"]  # an RQE change does not re-train NLI
    assert {"models/nli", "models/rqe"} <= {a["path"] for a in dvc.get("artifacts", {}).values()}
