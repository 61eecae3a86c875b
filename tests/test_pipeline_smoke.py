"""One real `dvc repro` of the whole DAG on the tiny params profile, in a scratch copy of the repo."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.slow


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _dvc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"mirror {SHARED_DATA} not present")
    work = tmp_path_factory.mktemp("smoke") / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src = REPO / f
        if src.is_file():
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / f)
    params = deep_merge(yaml.safe_load((REPO / "params.yaml").read_text()), yaml.safe_load((REPO / "tests/smoke/params_tiny.yaml").read_text()))
    params["acquire"]["mirrors"] = [str(SHARED_DATA)]
    params["acquire"]["download"] = False
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for f in ["dvc.lock"]:
        (work / f).unlink(missing_ok=True)
    # a real checkout has commits: dvclive (training stages) records the baseline revision and fails on an empty repo
    git = ["git", "-c", "user.name=medrank-smoke", "-c", "user.email=smoke@medrank.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "smoke"], cwd=work, check=True)
    return work


def test_dvc_repro_tiny_profile(tiny_repo):
    r = _dvc("repro", cwd=tiny_repo)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tiny_repo / "metrics/data.json").read_text())
    assert data  # counts per table were written
    # every declared metrics file exists and parses
    stages = yaml.safe_load((tiny_repo / "dvc.yaml").read_text())["stages"]
    for st in stages.values():
        for m in st.get("metrics", []):
            path = next(iter(m)) if isinstance(m, dict) else m
            if "${" not in path:
                assert json.loads((tiny_repo / path).read_text()) is not None, path
    # the tiny MTL is a 2-member bag that reads the CNN stage's answer scores (optional cnn group)
    from medrank.models.mtl import MTLBag

    bag, meta = MTLBag.load(tiny_repo / "models/mtl")
    assert len(bag.members) == 2 and "cnn" in bag.builder.groups and meta["n_candidates"] == 3
    assert json.loads((tiny_repo / "models/system.json").read_text())["recipe"]["cnn"]["mediqa_aggregation"] in ("max", "mean")
    # the profile's MTL ablation row got its own CV; the qa stage scored every answer the baseline uses
    mtl_metrics = json.loads((tiny_repo / "metrics/mtl.json").read_text())
    assert mtl_metrics["ablations"]["no_nli_grid"]["overrides"] == {"nli_grid": False}
    assert 0 <= mtl_metrics["ablations"]["no_nli_grid"]["accuracy"]["mean"] <= 1
    import pandas as pd

    qa = pd.read_parquet(tiny_repo / "data/processed/qa_scores.parquet")
    assert len(qa) and qa["qa_score"].between(0, 1).all()
    assert "qa" in json.loads((tiny_repo / "metrics/task3_val_baseline.json").read_text())["features"]
    # the score stage compared the final system with the baseline on paired question resamples
    final = json.loads((tiny_repo / "metrics/task3_val.json").read_text())
    # re-ordering the kept answers changes MRR and Spearman, never the labels
    assert len({m["accuracy"] for m in final["cv_by_order"].values()}) == 1
    vs = final["vs_baseline"]
    for where in ("val", "cv"):
        acc = vs[where]["accuracy"]
        assert -1 <= acc["ci95"][0] <= acc["ci95"][1] <= 1 and -1 <= acc["diff"] <= 1 and 0 <= acc["p_better"] + acc["p_worse"] <= 1
    _rank_equals_validation_submission(tiny_repo)
    # a second repro has nothing to do (and `medrank rank` wrote nothing into the DVC-tracked caches)
    again = _dvc("repro", cwd=tiny_repo)
    assert again.returncode == 0
    assert "Running stage" not in again.stdout, again.stdout
    status = _dvc("status", cwd=tiny_repo)
    assert "up to date" in status.stdout, status.stdout


def _rank_equals_validation_submission(repo: Path) -> None:
    """`medrank rank --fit val` on a validation question (its text and CHiQA's answers, as a user sends them)
    keeps the same answers in the same order as the pipeline's validation submission."""
    import os

    import pandas as pd

    from medrank.cli import format_result
    from medrank.rank import as_input, rank_question, ranked_ids

    clean = pd.read_parquet(repo / "data/interim/clean/answers.parquet")
    sub = pd.read_csv(repo / "submissions/task3_val.csv", header=None, names=["qid", "aid", "label"], dtype=str)
    checked = 0
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        for qid, rows in sub.groupby("qid", sort=False):
            answers = clean[(clean["split"] == "val") & (clean["qid"] == qid)].sort_values("system_rank")
            if sorted(answers["system_rank"].astype(int)) != list(range(1, len(answers) + 1)):
                continue  # the rank command takes CHiQA's order as the answers' order: only gap-free ranks compare
            inp = as_input(answers["question"].iloc[0], list(zip(answers["aid"], answers["answer"], answers["url"])))
            result = rank_question(inp, "models", "val")
            assert ranked_ids(result) == rows["aid"].tolist(), (qid, result, rows)
            kept = result.loc[result["kept"], "id"].tolist()
            assert sorted(kept) == sorted(rows.loc[rows["label"] == "1", "aid"]), (qid, result, rows)
            assert json.loads(format_result(inp.question, result))["n_kept"] == len(kept)
            checked += 1
    finally:
        os.chdir(cwd)
    assert checked, "no validation question with gap-free CHiQA ranks in the tiny profile"
