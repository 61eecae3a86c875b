"""One real `dvc repro` of the whole DAG on the tiny params profile, in a scratch copy of the repo; then the
newcomer's path on its outputs (`dvc push`, `git clone` + `dvc pull`, and `dvc repro` has nothing to do) and the
embed stage on the Ray backend (same outputs as local)."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from medrank.core import layout
from tests.conftest import GIT, REPO, SHARED_DATA, build_tiny_repo, run_module

pytestmark = pytest.mark.slow


def _dvc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"mirror {SHARED_DATA} not present")
    return build_tiny_repo(tmp_path_factory.mktemp("smoke") / "repo")


@pytest.fixture(scope="module")
def tiny_repro(tiny_repo) -> subprocess.CompletedProcess:
    """The module's one `dvc repro` (tiny profile): every test here builds on its outputs."""
    return _dvc("repro", cwd=tiny_repo)


# the analysis tables and the MTL's path (finetune_nli -> retrieve -> embed -> mtl -> system_choice): their metrics files
# are committed from the default profile, so the analysis run rewrites them
ANALYSIS_METRICS = (
    "rqe_selection",
    "baseline_ablations",
    "mtl_ablations",
    "mtl_confirm",
    "qa",
    "qa_graded",
    "cnn_crossenc",
    "nested_loso",
    "qa_bienc",
    "passages",
    "agree",
    "finetune_nli",
    "retrieve",
    "embed",
    "mtl",
    "mtl_seconds",
    "system_choice",
    "task3_val_mtl",
)


@pytest.fixture(scope="module")
def tiny_analysis(tiny_repo, tiny_repro) -> dict:
    """The module's one `dvc repro analysis/dvc.yaml` after the default repro (the tests that read the MTL's path build
    on it), with the default's models and metrics as they were before it."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    tables = {tiny_repo / f"metrics/{m}.json" for m in ANALYSIS_METRICS}
    before = _md5s(tiny_repo / "models") | {
        str(p): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted((tiny_repo / "metrics").glob("*.json"))
        if p not in tables
    }
    return {"result": _dvc("repro", "analysis/dvc.yaml", cwd=tiny_repo), "before": before}


def test_dvc_repro_tiny_profile(tiny_repo, tiny_repro):
    r = tiny_repro
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
    # the default DAG computes what the defaults read: system_choice picked the baseline, so no NLI fine-tune,
    # retrieval, grids or MTL (analysis/dvc.yaml's; below)
    for path in ("models/mtl", "models/nli", "models/steps/retrieve", "data/processed/retrieved.parquet"):
        assert not (tiny_repo / path).exists(), path
    assert json.loads((tiny_repo / "models/system.json").read_text())["system"] == "baseline"
    # each inference step saved by the stage that runs it: `medrank rank` reads these, not params.yaml or data/
    step = json.loads((tiny_repo / "models/steps/cnn_scores/step.json").read_text())
    assert step["stage"] == "cnn_mediqa" and step["params"]["cnn"]["mediqa_aggregation"] in ("max", "mean")
    assert "recipe" not in json.loads((tiny_repo / "models/system.json").read_text())
    # the ablation / selection tables and the candidate signals no default reads (qa, qa_graded) are analysis/dvc.yaml's:
    # `dvc repro` runs none of its stages (the frozen noise band's committed file is read, its upstream never run)
    assert "Running stage 'analysis/dvc.yaml:" not in r.stdout, r.stdout
    assert not (tiny_repo / "models/qa").exists() and not (tiny_repo / "data/processed/qa_scores.parquet").exists()
    # the score stage compared the final system with the baseline on paired question resamples
    final = json.loads((tiny_repo / "metrics/task3_val.json").read_text())
    # re-ordering the kept answers changes MRR and Spearman, never the labels
    assert len({m["accuracy"] for m in final["cv_by_order"].values()}) == 1
    vs = final["vs_baseline"]
    for where in ("val", "cv"):
        acc = vs[where]["accuracy"]
        assert (
            -1 <= acc["ci95"][0] <= acc["ci95"][1] <= 1
            and -1 <= acc["diff"] <= 1
            and 0 <= acc["p_better"] + acc["p_worse"] <= 1
        )
    _rank_equals_validation_submission(tiny_repo)
    _deployed_pipeline_scores_as_stage_score(tiny_repo)
    # a second repro has nothing to do (and `medrank rank` wrote nothing into the DVC-tracked caches)
    again = _dvc("repro", cwd=tiny_repo)
    assert again.returncode == 0
    assert "Running stage" not in again.stdout, again.stdout
    status = _dvc("status", "dvc.yaml", cwd=tiny_repo)
    assert "up to date" in status.stdout, status.stdout


def test_analysis_pipeline_runs_apart_from_the_default(tiny_repo, tiny_analysis):
    """`dvc repro analysis/dvc.yaml` runs the table stages, the candidate signals (qa, qa_graded, qa_bienc, passages,
    agree), the CNN's cross-encoder row (cnn_crossenc) and the MTL's path with system_choice (the pick the default's
    score.system holds), and nothing of the default pipeline (the frozen noise band is read, not run); their rows are
    the default stages' protocols (the MTL row on the mtl stage's folds, the RQE rows with the chosen sets' verdict,
    the confirmed row paired with the default seed by seed)."""
    r, before = tiny_analysis["result"], tiny_analysis["before"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = sorted(line.split("'")[1] for line in r.stdout.splitlines() if line.startswith("Running stage"))
    assert ran == [
        "analysis/dvc.yaml:agree",
        "analysis/dvc.yaml:baseline_ablations",
        "analysis/dvc.yaml:cnn_crossenc",
        "analysis/dvc.yaml:embed",
        "analysis/dvc.yaml:finetune_nli",
        "analysis/dvc.yaml:mtl",
        "analysis/dvc.yaml:mtl_ablations",
        "analysis/dvc.yaml:mtl_confirm",
        "analysis/dvc.yaml:nested_loso",
        "analysis/dvc.yaml:passages",
        "analysis/dvc.yaml:qa",
        "analysis/dvc.yaml:qa_bienc",
        "analysis/dvc.yaml:qa_graded",
        "analysis/dvc.yaml:retrieve",
        "analysis/dvc.yaml:rqe_selection",
        "analysis/dvc.yaml:system_choice",
    ], r.stdout
    after = _md5s(tiny_repo / "models") | {
        str(p): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted((tiny_repo / "metrics").glob("*.json"))
    }
    assert {k: v for k, v in after.items() if k in before} == before  # no default output touched
    # the tiny MTL is a 2-member bag that reads the CNN stage's answer scores (optional cnn group)
    from medrank.models.mtl import MTLBag

    bag, meta = MTLBag.load(tiny_repo / "models/mtl")
    assert len(bag.members) == 2 and "cnn" in bag.builder.groups and meta["n_candidates"] == 3
    # system_choice: the written rule over every MTL weight, on the rows stage score decides (weight 0: the same row)
    choice = json.loads((tiny_repo / "metrics/system_choice.json").read_text())
    final = json.loads((tiny_repo / "metrics/task3_val.json").read_text())
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    assert (
        set(choice["candidates"]) == {str(float(w)) for w in params["score"]["mtl_weights"]}
        and "mtl" in choice["systems"]
    )
    assert choice["candidates"]["0.0"] == final["candidates"]["0.0"] and list(final["candidates"]) == ["0.0"]
    mtl_rows = json.loads((tiny_repo / "metrics/mtl_ablations.json").read_text())["rows"]
    assert (
        mtl_rows["no_nli_grid"]["overrides"] == {"nli_grid": False}
        and 0 <= mtl_rows["no_nli_grid"]["accuracy"]["mean"] <= 1
    )
    assert set(mtl_rows["no_nli_grid"]["loso"]["by_source"]) == {"train_liveqa", "train_alexa", "val"}
    confirm = json.loads((tiny_repo / "metrics/mtl_confirm.json").read_text())
    assert list(confirm["rows"]) == ["default", "no_nli_grid"] and len(confirm["seeds"]) == 2
    # seed 1 of the confirmation is the mtl_ablations row itself (same seed, folds and initialisation)
    first = confirm["per_seed"][0]["no_nli_grid"]
    assert (
        first["cv_accuracy"] == mtl_rows["no_nli_grid"]["accuracy"]["mean"]
        and first["loso_accuracy"] == mtl_rows["no_nli_grid"]["loso"]["accuracy"]["mean"]
    )
    base = json.loads((tiny_repo / "metrics/baseline_ablations.json").read_text())
    assert list(base["table1_ablation"]) == ["metadata", "metadata+cnn", "metadata+qa_graded"] and set(
        base["table4_ranking"]
    ) == set(base["table1_ablation"])
    # the qa stage scored every answer; qa_graded learned the judged answers of the capped train_liveqa questions
    import pandas as pd

    for name, col in (("qa", "qa_score"), ("qa_graded", "qa_graded_score")):
        scores = pd.read_parquet(tiny_repo / f"data/processed/{name}_scores.parquet")
        assert len(scores) and scores[col].between(0, 1).all(), name
    qa_bienc = pd.read_parquet(tiny_repo / "data/processed/qa_bienc_scores.parquet")
    assert len(qa_bienc) and qa_bienc["qa_bienc_cos"].between(-1, 1).all()
    assert len(json.loads((tiny_repo / "metrics/qa_bienc.json").read_text())["folds"]) == 3  # one per labelled source
    # nested LOSO: every source held out once, picked without it; the QA bi-encoder row beside the default
    nested = json.loads((tiny_repo / "metrics/nested_loso.json").read_text())
    assert set(nested["final_system"]["nested_loso"]["by_source"]) == {"train_liveqa", "train_alexa", "val"}
    assert 0 <= nested["final_system"]["nested_loso"]["accuracy"]["mean"] <= 1 and "with_qa_bienc" in nested["variants"]
    # the analysis groups' stages: passage (refused by the acceptance rule) and agree (the entailed answers' agreement)
    agree = pd.read_parquet(tiny_repo / "data/processed/agree_scores.parquet")
    assert len(agree) and agree["agree_max_cos"].between(-1, 1).all()
    assert {"with_passage", "with_agree"} <= set(nested["variants"])
    # the MTL fed the baseline's scores (group stacked), cross-fitted inside each of its fits, priced in seconds
    assert "mtl_stacked" in nested["variants"] and nested["seconds"]["stacked_baseline_fits"] > 0
    graded = json.loads((tiny_repo / "metrics/qa_graded.json").read_text())
    assert graded["n_judged_questions"] == 2 and all(f["n_train_judged"] > 0 for f in graded["folds"])
    # the cross-encoder's SQuAD row: the dev sample of the default cnn_squad table, the same questions
    crossenc, squad = (
        json.loads((tiny_repo / f"metrics/{m}.json").read_text())["dev_sample"] for m in ("cnn_crossenc", "cnn_squad")
    )
    assert (
        crossenc["n_questions"] == squad["n_questions"]
        and 0 <= crossenc["cross_encoder"]["mrr"] <= 1
        and "cross_encoder" not in squad
    )
    sel = json.loads((tiny_repo / "metrics/rqe_selection.json").read_text())
    trained = json.loads((tiny_repo / "metrics/finetune_rqe.json").read_text())
    assert {"ce: amia", "ce: val", "bi: val"} <= set(sel["rows"]) and sel["chosen"] in sel["rows"]
    assert (
        "bi: meqsum" in sel["rows"] and "bi: meqsum" not in trained["rows"]
    )  # finetune_rqe trains finetune.rqe's sets only
    from medrank.models.rqe_choice import missing_from_default

    # finetune.rqe.val_stages [bi_encoder]: the default fine-tunes no cross-encoder per fold; the selection measures those rows
    assert trained["trained"]["val_stages"] == ["bi_encoder"] and "ce: amia > val" in sel["rows"]
    assert (
        not [r for r in trained["rows"] if r.startswith("ce: ") and r.endswith("> val")]
        and "bi: meqsum+liveqa > val" in trained["rows"]
    )
    assert set(missing_from_default(sel["recipe"], trained["trained"])) <= {
        "extra_sets",
        "bi_encoder_sets",
        "val_stages",
    }
    status = _dvc("status", "analysis/dvc.yaml", cwd=tiny_repo)
    assert "up to date" in status.stdout, status.stdout


def _rank_equals_validation_submission(repo: Path) -> None:
    """`medrank rank --fit val` on a validation question (its text and CHiQA's answers, as a user sends them)
    keeps the same answers in the same order as the pipeline's validation submission; `medrank serve --fit val`
    answers the same JSON."""
    import os
    import time

    import pandas as pd
    from fastapi.testclient import TestClient

    from medrank.cli import format_result
    from medrank.serving.rank import Ranker, as_input, rank_question, ranked_ids
    from medrank.serving.app import ServeConfig, create_app

    clean = pd.read_parquet(repo / "data/interim/clean/answers.parquet")
    sub = pd.read_csv(repo / "submissions/task3_val.csv", header=None, names=["qid", "aid", "label"], dtype=str)
    checked, served = 0, []
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
            body = {
                "question": inp.question,
                "answers": [{"id": a.id, "text": a.text, "url": a.url} for a in inp.answers],
            }
            served.append((body, json.loads(format_result(inp.question, result, show_all=True))))
            checked += 1
        with TestClient(
            create_app(ServeConfig(fit="val", threads=1, warmup=False), Ranker.load("models", "val"))
        ) as client:
            for _ in range(600):
                if client.get("/readyz").status_code == 200:
                    break
                time.sleep(0.1)
            for body, want in served:
                assert client.post("/rank", json=body).json() == want
    finally:
        os.chdir(cwd)
    assert checked, "no validation question with gap-free CHiQA ranks in the tiny profile"


def _deployed_pipeline_scores_as_stage_score(repo: Path) -> None:
    """What is evaluated is what is deployed: the composed val-fit steps (`medrank rank --fit val`), evaluated by
    `experiment` on the validation questions stage score submitted (the profile caps them) with their labels blanked,
    decide the very rows of submissions/task3_val.csv, and score what the official scorer gives that file."""
    import os

    import pandas as pd

    from medrank.selection.evaluation import gold_of, ranked_rows
    from medrank.selection.experiment import Deployed, Refit, answer_truth, experiment, questions_of
    from medrank.selection.metrics import score_task3
    from medrank.steps.pipeline import InferencePipeline

    sub = pd.read_csv(repo / "submissions/task3_val.csv", header=None, names=["qid", "aid", "label"], dtype=str)
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        clean = pd.read_parquet("data/interim/clean/answers.parquet")
        val = clean[(clean["split"] == "val") & clean["qid"].isin(set(sub["qid"]))].reset_index(drop=True)
        truth = answer_truth(val, ["val"])
        questions = questions_of(truth)
        deployed = Deployed(InferencePipeline.load("models", "val").steps, val, truth)
        got = experiment({"d": deployed}, questions, [Refit(test=tuple(questions["gid"]))])["d"]["test"]
    finally:
        os.chdir(cwd)
    assert got.summary["base"]["n_questions"] == sub["qid"].nunique() > 0
    rows = ranked_rows(got.rows)
    decided = {g: list(zip(r["aid"], r["label"].astype(int).astype(str))) for g, r in rows.groupby("gid", sort=False)}
    submitted = {f"val:{q}": list(zip(r["aid"], r["label"])) for q, r in sub.groupby("qid", sort=False)}
    assert decided == submitted
    official = score_task3(gold_of(truth), sub.assign(qid="val:" + sub["qid"], label=sub["label"].astype(int)))
    assert got.summary["base"] == official


def _default_remote(repo: Path) -> tuple[str, Path]:
    """Name and folder of the default remote (`dvc config` resolves a relative url against .dvc/)."""
    name = _dvc("config", "core.remote", cwd=repo).stdout.strip()
    return name, Path(_dvc("config", f"remote.{name}.url", cwd=repo).stdout.strip())


def _md5s(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.md5(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


def test_push_clone_pull_round_trip(tiny_repo, tiny_repro, tiny_analysis, tmp_path):
    """Commit dvc.lock and the git-tracked (cache: false) outputs, `dvc push`; a `git clone` + `dvc pull` then has
    every output byte-identical, `dvc status` is clean and `dvc repro` runs no stage (nothing is re-trained).
    Pushes go to a scratch remote only: the committed default (a folder beside the checkout) stays untouched."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    # the committed default remote is a local folder outside the checkout (`git clean` or a deleted checkout keeps it)
    default_name, default_dir = _default_remote(tiny_repo)
    assert default_name, "no default remote in .dvc/config (docs/sharing.md)"
    assert not default_dir.resolve().is_relative_to(tiny_repo.resolve()), default_dir
    store = tmp_path / "remote"
    # --local -d: a bare `dvc push` would go to the scratch remote too; config.local is git-ignored, so the clone
    # below is pointed at it the same way
    assert _dvc("remote", "add", "--local", "-d", "smoke", str(store), cwd=tiny_repo).returncode == 0
    subprocess.run([*GIT, "add", "-A"], cwd=tiny_repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "smoke: dvc.lock and committed outputs"], cwd=tiny_repo, check=True)
    pushed = _dvc("push", "-r", "smoke", cwd=tiny_repo)
    assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:]
    assert store.is_dir()

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(tiny_repo), str(clone)], check=True)
    clone_default_name, clone_default_dir = _default_remote(clone)
    assert clone_default_name == default_name  # the committed default came with git
    assert _dvc("remote", "add", "--local", "-d", "smoke", str(store), cwd=clone).returncode == 0
    pulled = _dvc("pull", "-r", "smoke", cwd=clone)
    assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:]
    for tree in ("models", "data"):  # every DVC output: trained models, raw / interim / processed data, persist caches
        assert _md5s(clone / tree) == _md5s(tiny_repo / tree), tree
    assert (clone / "models/mtl").is_dir() and (clone / "data/processed/retrieved.parquet").is_file()

    status = _dvc(
        "status", "dvc.yaml", cwd=clone
    )  # the default pipeline (analysis/dvc.yaml: whether the tables ran first)
    assert status.returncode == 0 and "up to date" in status.stdout, status.stdout + status.stderr
    lock = (clone / "dvc.lock").read_bytes()
    again = _dvc("repro", cwd=clone)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Running stage" not in again.stdout, again.stdout
    assert (clone / "dvc.lock").read_bytes() == lock
    assert (
        subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True).stdout
        == ""
    )
    # nothing went to the committed default remote (it resolves to a folder beside each checkout)
    assert not default_dir.exists() and not clone_default_dir.exists()


def _cache_rows(root: Path) -> dict[str, list]:
    """Every cached row of every namespace under `root`, by namespace, sorted by key (shard layout ignored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    for ns in sorted(d for d in root.iterdir() if d.is_dir()):
        table = pa.concat_tables([pq.read_table(f) for f in sorted(ns.glob("part-*.parquet"))])
        out[ns.name] = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names)))
    return out


def test_ray_backend_embed_equals_local(tiny_repo, tiny_repro, tiny_analysis, tmp_path):
    """Stage embed again with `embed.backend: ray` (a local Ray, 2 actors) from an empty cache: the same cache rows,
    a byte-identical NLI grid (what baseline/mtl/score read, so their metrics cannot move) and the same metrics
    up to timings. The tiny repo's cache, params and metrics are put back afterwards."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    grid, cache = tiny_repo / layout.NLI_GRID, tiny_repo / layout.CACHE_EMBED
    metrics_file, params_file = tiny_repo / "metrics/embed.json", tiny_repo / "params.yaml"
    saved = {p: p.read_bytes() for p in (grid, metrics_file, params_file)}
    local_rows = _cache_rows(cache)
    shutil.move(cache, tmp_path / "local_cache")
    params = yaml.safe_load(saved[params_file])
    params["embed"]["backend"] = "ray"
    params["embed"]["ray"] = {**params["embed"]["ray"], "actors": 2, "cpus_per_actor": 1}
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        r = run_module("stages.embed", cwd=tiny_repo)
        assert r.returncode == 0, r.stderr[-3000:]
        assert grid.read_bytes() == saved[grid]
        assert _cache_rows(cache) == local_rows and sum(len(v) for v in local_rows.values()) > 0
        timing = {"seconds", "pairs_per_s", "workers"}  # workers: the local backend's processes (None on Ray)

        def drop_timing(d):
            return {k: drop_timing(v) for k, v in d.items() if k not in timing} if isinstance(d, dict) else d

        ray_metrics, local_metrics = (
            drop_timing(json.loads(b)) for b in (metrics_file.read_bytes(), saved[metrics_file])
        )
        assert ray_metrics == local_metrics
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.move(tmp_path / "local_cache", cache)
        for p, b in saved.items():
            p.write_bytes(b)


# ---------------------------------------------------------------- reproducibility (docs/reproducibility.md)

# keys that record how a run went (time, thread count, where it ran), not what it computed
_HOW = {
    "seconds",
    "seconds_total",
    "pairs_per_s",
    "timings_s",
    "train_seconds",
    "train_pairs_per_s",
    "threads",
    "workers",
    "runtime",
}


def _what(d, name: str = ""):
    """What a metrics file says about the results: its `_HOW` keys dropped; a timings file (<stage>_seconds.json,
    beside the metrics other stages read) says nothing about them."""
    if name.endswith("_seconds.json"):
        return {}
    if isinstance(d, dict):
        return {k: _what(v) for k, v in d.items() if k not in _HOW}
    return [_what(v) for v in d] if isinstance(d, list) else d


def _declared_outputs(repo: Path, stages: tuple[str, ...]) -> list[Path]:
    """Every out and metrics file the stages declare in dvc.yaml or analysis/dvc.yaml (folders as folders; persist
    caches included)."""
    dvc = {
        **yaml.safe_load((repo / "dvc.yaml").read_text())["stages"],
        **yaml.safe_load((repo / "analysis/dvc.yaml").read_text())["stages"],
    }
    paths = [
        repo / (next(iter(o)) if isinstance(o, dict) else o)
        for s in stages
        for o in dvc[s].get("outs", []) + dvc[s].get("metrics", [])
    ]
    return list(dict.fromkeys(paths))


def _files(paths: list[Path], repo: Path) -> dict[str, bytes]:
    out = {}
    for p in paths:
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file():
                out[str(f.relative_to(repo))] = f.read_bytes()
    return out


def _put_back(paths: list[Path], saved: Path, repo: Path) -> None:
    """Replace each of `paths` by its copy under `saved` (see _save)."""
    for p in paths:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        src = saved / p.relative_to(repo)
        if src.exists():
            shutil.move(src, p)


def _save(paths: list[Path], saved: Path, repo: Path) -> None:
    for p in paths:
        dst = saved / p.relative_to(repo)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(p, dst) if p.is_dir() else shutil.copy2(p, dst)


def _run_stages(repo: Path, stages: tuple[str, ...], cpus: set[int] | None = None) -> None:
    """`python -m stages.<name>` for each, as dvc runs them; `cpus`: the CPU affinity, set before anything is imported
    (torch, OpenMP and OpenBLAS size their pools from it: a machine with fewer cores)."""
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pin = f"import os, runpy, sys; os.sched_setaffinity(0, {sorted(cpus or [])!r}); runpy.run_module(sys.argv[1], run_name='__main__', alter_sys=True)"
    for s in stages:
        cmd = [sys.executable, "-c", pin, f"stages.{s}"] if cpus else [sys.executable, "-m", f"stages.{s}"]
        r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"stage {s}: " + r.stderr[-3000:]


# the stages downstream of the fine-tunes that compute with every core (torch threads, BLAS) on the submissions' path;
# the others there pin their threads (mtl.threads, the CNN stages' one thread), so a core count cannot move them
EVERY_CORE_STAGES = ("retrieve", "embed", "bienc", "baseline", "score")


def test_one_core_gives_byte_identical_outputs(tiny_repo, tiny_repro, tiny_analysis, tmp_path):
    """The tiny repo's downstream stages again on ONE core (their caches emptied, so everything is recomputed with
    1 torch thread and 1 default BLAS thread instead of 2): every output byte-identical - features, predictions,
    submissions, models, caches; metrics up to timings, thread counts and `runtime`. Put back afterwards."""
    import os

    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        pytest.skip("needs 2 cores to compare 1 with 2")
    caches = [tiny_repo / c for c in (layout.CACHE_RQE, layout.CACHE_EMBED, layout.CACHE_BIENC)]
    outs = [p for p in _declared_outputs(tiny_repo, EVERY_CORE_STAGES) if p not in caches]  # caches: compared by rows
    before, cache_rows = _files(outs, tiny_repo), {c.name: _cache_rows(c) for c in caches}
    saved = tmp_path / "saved"
    _save(outs + caches, saved, tiny_repo)
    try:
        for c in caches:
            shutil.rmtree(c)
        _run_stages(tiny_repo, EVERY_CORE_STAGES, cpus={cpus[0]})
        after = _files(outs, tiny_repo)
        assert after.keys() == before.keys()
        for name, b in before.items():
            if name.startswith("metrics/"):
                assert _what(json.loads(after[name]), name) == _what(json.loads(b), name), name
            else:
                assert after[name] == b, f"{name} changed on one core"
        assert {c.name: _cache_rows(c) for c in caches} == cache_rows
        assert (
            json.loads((tiny_repo / "metrics/embed.json").read_text())["runtime"]["threads"] == 1
        )  # it did run on one
    finally:
        _put_back(outs + caches, saved, tiny_repo)


# bf16 vs fp32 inference on the tiny profile (measured: NLI/RQE probabilities 5e-3 / 6e-4, the retrained MTL's 5e-4,
# no label of the final submissions flipped; docs/reproducibility.md has the default profile's numbers)
BF16_PROB_BOUND = 0.02  # the precision probe's own tolerance: a reduced precision further off is never chosen
BF16_MTL_PROB_BOUND = 0.02
BF16_FLIPPED_LABELS_BOUND = 0.1  # of the final submissions' rows


def test_bf16_inference_drift_is_bounded(tiny_repo, tiny_repro, tiny_analysis, tmp_path):
    """retrieve and embed again with `precision: bf16` (the tiny profile pins fp32; a CPU without AVX-512-bf16 would
    also run fp32 under `auto`), then mtl on their outputs: the probabilities move by less than the bounds above and
    few of the MTL's submission labels flip (the final system, the baseline, reads neither). Params, outputs and caches
    are put back afterwards."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    import numpy as np
    import pandas as pd

    stages = ("retrieve", "embed", "mtl")
    params_file = tiny_repo / "params.yaml"
    outs = _declared_outputs(tiny_repo, stages)  # with the retrieve / embed caches (bf16 adds namespaces to them)
    saved = tmp_path / "saved"
    _save(outs + [params_file], saved, tiny_repo)
    fp32 = tmp_path / "fp32"
    _save([p for p in outs if p not in (tiny_repo / layout.CACHE_RQE, tiny_repo / layout.CACHE_EMBED)], fp32, tiny_repo)
    params = yaml.safe_load(params_file.read_text())
    params["retrieve"]["precision"] = params["embed"]["precision"] = "bf16"
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        _run_stages(tiny_repo, stages)
        assert json.loads((tiny_repo / "metrics/embed.json").read_text())["precision"] == "bf16"

        def both(rel: str, keys: list[str]) -> pd.DataFrame:
            return pd.read_parquet(fp32 / rel).merge(
                pd.read_parquet(tiny_repo / rel), on=keys, suffixes=("_fp32", "_bf16")
            )

        def max_diff(m: pd.DataFrame, col: str) -> float:
            return (
                float(np.max(np.abs(m[f"{col}_fp32"].to_numpy(float) - m[f"{col}_bf16"].to_numpy(float))))
                if len(m)
                else 0.0
            )

        rqe = both(str(layout.RQE_CANDIDATES), ["split", "qid", "qa_id"])
        assert len(rqe) and max_diff(rqe, "rqe_score") <= BF16_PROB_BOUND
        grid = both(str(layout.NLI_GRID), ["split", "qid", "aid", "entailed_kind", "entailed_rank"])
        assert len(grid) and max_diff(grid, "anli") <= BF16_PROB_BOUND
        pred = both(str(layout.MTL_PREDICTIONS), ["part", "split", "qid", "aid", "fold"])
        final = pred[pred["part"].isin(["val", "test"])]
        assert len(final) and max_diff(final, "prob") <= BF16_MTL_PROB_BOUND
        for split in ("val", "test"):
            names = ["qid", "aid", "label"]
            a = pd.read_csv(fp32 / layout.task3_submission(split, "mtl"), header=None, names=names, dtype=str)
            b = pd.read_csv(tiny_repo / layout.task3_submission(split, "mtl"), header=None, names=names, dtype=str)
            m = a.merge(b, on=["qid", "aid"])
            assert len(m) == len(a) == len(b) and (m["label_x"] != m["label_y"]).mean() <= BF16_FLIPPED_LABELS_BOUND, (
                split
            )
    finally:
        _put_back(outs + [params_file], saved, tiny_repo)


def test_bad_params_stop_dvc_repro_before_any_output_is_deleted(tiny_repo, tiny_repro, tiny_analysis):
    """DVC deletes a stage's outputs before running it: a bad value for the MTL must stop at check_params (upstream of
    every stage) with one line, and the trained MTL and everything else stay as they were."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    params_file = tiny_repo / "params.yaml"
    saved = params_file.read_bytes()
    before = _md5s(tiny_repo / "models/mtl")
    params = yaml.safe_load(saved)
    params["mtl"]["alpha"] = -1.0
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        r = _dvc("repro", cwd=tiny_repo)
        assert r.returncode != 0
        errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
        assert errors == ["error: params.yaml: mtl.alpha: Input should be greater than or equal to 0 (got -1.0)"], (
            r.stdout[-2000:] + r.stderr[-2000:]
        )
        assert "Running stage 'mtl'" not in r.stdout and before and _md5s(tiny_repo / "models/mtl") == before
        # issue 64: `dvc repro -s mtl` skips check_params; DVC used to delete the stage's outputs (the uncached
        # submissions too) before the stage's own gate ran
        outs = [tiny_repo / p for p in ("models/mtl", "data/processed/mtl_predictions.parquet", "submissions")]
        kept = {p.name: _md5s(p) if p.is_dir() else p.read_bytes() for p in outs}
        lock = (tiny_repo / "analysis/dvc.lock").read_bytes()
        r = _dvc("repro", "-s", "-f", "analysis/dvc.yaml:mtl", cwd=tiny_repo)
        assert r.returncode != 0 and "mtl.alpha" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
        assert {p.name: _md5s(p) if p.is_dir() else p.read_bytes() for p in outs} == kept
        assert (tiny_repo / "analysis/dvc.lock").read_bytes() == lock
    finally:
        params_file.write_bytes(saved)


def test_frozen_noise_band_is_reused_then_refreshed_by_hand(tiny_repo, tiny_repro, tiny_analysis):
    """Stage noise_band is frozen: `dvc repro` read the committed band (the defaults') and never ran it; the documented
    refresh (`python -m stages.noise_band && dvc commit -f analysis/dvc.yaml:noise_band`) computes the tiny profile's own band (2 seeds,
    both systems), and the next `dvc repro` re-runs only the score stage that reads it."""
    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    assert "Running stage 'noise_band'" not in tiny_repro.stdout
    band_file = tiny_repo / layout.metrics_file("noise_band")
    assert band_file.read_bytes() == (REPO / layout.metrics_file("noise_band")).read_bytes()
    r = run_module("stages.noise_band", cwd=tiny_repo)
    assert r.returncode == 0, r.stderr[-3000:]
    band = json.loads(band_file.read_text())
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    assert band["seeds"] == [params["seed"], params["seed"] + 1] and band["n_candidates"] == params["n_candidates"]
    for system in ("baseline", "mtl"):
        assert band[system]["seeds"] == 2 and all(band[system][k] >= 0 for k in ("accuracy", "mrr", "order"))
    assert _dvc("commit", "-f", "analysis/dvc.yaml:noise_band", cwd=tiny_repo).returncode == 0
    again = _dvc("repro", cwd=tiny_repo)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    ran = sorted(line.split("'")[1] for line in again.stdout.splitlines() if line.startswith("Running stage"))
    assert ran == ["score"], again.stdout
    assert json.loads((tiny_repo / "metrics/task3_val.json").read_text())["selection"]["noise_band"]["accuracy"] == max(
        band["baseline"]["accuracy"], band["mtl"]["accuracy"]
    )


def test_the_readme_test_command_passes_after_the_tiny_repro(tiny_repo, tiny_repro, tmp_path):
    """The newcomer's order: `dvc repro`, then the README's test command in the same checkout. Here: the tiny repo
    after every test above (its repro, the analysis pipeline, the pushes and re-runs), its documents refreshed from
    its own metrics (`medrank report`: the tiny profile's numbers are not the committed ones), then the fast tests
    that read the checkout's own files (marker `checkout`, kept honest by test_layout's
    test_every_test_reading_the_checkout_is_marked_checkout; the others run the same here as in any checkout) inside
    it, with the mirror beside it as CI has it (the slow ones would start this module again)."""
    import os

    assert tiny_repro.returncode == 0, "the tiny repro failed: see test_dvc_repro_tiny_profile"
    shared = tiny_repo.parent / "shared"
    if not shared.exists():
        shared.symlink_to(SHARED_DATA.parent.resolve(), target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(tiny_repo)}
    report = subprocess.run(
        [sys.executable, "-c", "from medrank.cli import main; main(['report'])"],
        cwd=tiny_repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "checkout and not slow", "-p", "no:cacheprovider"]
        + ["--basetemp", str(tmp_path / "inner")],
        cwd=tiny_repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]
