"""Model cards (docs/model_cards/): one per dvc.yaml artifact, every number read from metrics/ and dvc.lock."""

import json

import pytest
import yaml

from medrank import cli
from medrank.reporting import documents
from medrank.reporting import stale_docs, update_docs
from medrank.reporting.card_base import CARDS_DIR, DATASETS, INDEX, NOT_MEASURED, dataset_files
from medrank.reporting.cards import render_cards
from tests.helpers.committed import checked_tree, described


@pytest.mark.checkout
def test_a_current_card_per_artifact(tmp_path):
    """The cards as rendered from dvc.yaml, dvc.lock and metrics/: the working tree's, or HEAD's after a user's own
    `dvc repro` of the committed code left the cards as committed (tests/helpers/committed.py)."""
    root = checked_tree(tmp_path)
    artifacts = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["artifacts"]
    rendered = render_cards(root, root / "metrics")
    assert set(rendered) == {INDEX} | {f"{name}.md" for name in artifacts}
    for name, text in rendered.items():
        assert (root / CARDS_DIR / name).read_text(encoding="utf-8") == text, (
            f"{name}: run `medrank report`" + described(root)
        )
    assert all(f"[{name}]({name}.md)" in rendered[INDEX] for name in artifacts)
    for name in artifacts:
        card = rendered[f"{name}.md"]
        for section in (
            "## What it is",
            "## Training data",
            "## Training recipe",
            "## Evaluation",
            "## Intended use",
            "## Known limits",
        ):
            assert section in card, (name, section)
        assert "not for clinical decisions" in card and "| dvc.lock |" in card


@pytest.mark.parametrize("key", [k for k, d in DATASETS.items() if d.files])
def test_every_dataset_file_is_a_pinned_source(key):
    for f in DATASETS[key].files:
        assert any(s.path == f or s.path.startswith(f) for s in dataset_files(key)), (
            f"{key}: {f} is not in medrank/data/sources.py"
        )


CV = {"mean": 0.8, "sd": 0.02}
LOSO = {
    "accuracy": {"mean": 0.75, "worst": 0.7, "worst_source": "train_alexa"},
    "mrr": {"mean": 0.6, "worst": 0.5, "worst_source": "train_liveqa"},
    "by_source": {"train_alexa": {"accuracy": 0.7, "mrr": 0.9}, "train_liveqa": {"accuracy": 0.8, "mrr": 0.5}},
}
STAGES = {
    "mtl": {
        "cmd": "python -m stages.mtl",
        "outs": ["models/mtl"],
        "params": ["mtl", "seed"],
        "metrics": [{"metrics/mtl.json": {"cache": False}}],
    },
    "finetune_nli": {"cmd": "python -m stages.finetune_nli", "outs": ["models/nli"], "params": ["finetune.nli"]},
}
ARTIFACTS = {
    "mtl-reranker": {"path": "models/mtl", "type": "model", "desc": "the MTL"},
    "nli-cross-encoder": {"path": "models/nli", "type": "model"},
}


def _repo(tmp_path, artifacts=ARTIFACTS, stages=STAGES, lock=None, metrics=None, params=None):
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"artifacts": artifacts, "stages": stages}))
    if lock is not None:
        (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": lock}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params or {}))
    (tmp_path / "metrics").mkdir(exist_ok=True)
    for name, m in (metrics or {}).items():
        (tmp_path / "metrics" / f"{name}.json").write_text(json.dumps(m))
    return tmp_path


def test_synthetic_metrics_render_cv_loso_and_not_measured(tmp_path):
    mtl = {"cv": {"accuracy": CV, "mrr": CV}, "loso": LOSO, "val": {"accuracy": 0.79}, "val_counts": {"n_questions": 3}}
    rows = {
        "rows": {
            "no_nli_grid": {"accuracy": {"mean": 0.81, "sd": 0.01}, "loso": LOSO, "overrides": {"nli_grid": False}}
        }
    }
    lock = {
        "mtl": {
            "params": {
                "params.yaml": {
                    "mtl": {"feature_groups": ["metadata", "bienc"], "lr": 0.001, "nli_grid": True},
                    "seed": 7,
                }
            },
            "outs": [{"path": "models/mtl", "md5": "abc123.dir"}],
        }
    }
    cards = render_cards(_repo(tmp_path, lock=lock, metrics={"mtl": mtl, "mtl_ablations": rows}), tmp_path / "metrics")
    card = cards["mtl-reranker.md"]
    assert "| validation: 3 questions, the train-only model | 0.790 | not measured |" in card
    assert (
        "| CV: question-grouped folds over train+val (mean ± sd) | 0.800 ± 0.020 | not measured | 0.800 ± 0.020 |"
        in card
    )
    assert (
        "| LOSO: trained on two labelled sources, scored on the third (mean (worst source)) | 0.750 (0.700 train_alexa) | not measured |"
        in card
    )
    assert (
        "| train_alexa | 0.700 | not measured | 0.900 |" in card
        and "| train_liveqa | 0.800 | not measured | 0.500 |" in card
    )
    assert "| `mtl.lr` | `0.001` | dvc.lock |" in card and "| `seed` | `7` | dvc.lock |" in card
    assert "| `mtl.patience` | not measured | not recorded |" in card
    assert (
        "| DVC hash | `abc123.dir` (dvc.lock) |" in card
        and "| produced by | stage `mtl` (`python -m stages.mtl`) |" in card
    )
    assert (
        "| inputs: NLI grids | model fingerprint not measured |" in card
        and "| in the final system | not measured" in card
    )
    assert "accuracy 0.750 (0.700 train_alexa) against CV 0.800 ± 0.020; MRR 0.600 (0.500 train_liveqa)" in card
    assert "- Error analysis of this model alone: not measured" in card
    # the NLI model was never run: every number reads "not measured", the recipe comes from params.yaml and says so
    nli = cards["nli-cross-encoder.md"]
    assert "| `not measured` dev | not measured | not measured | not measured |" in nli
    assert "| model fingerprint | not measured" in nli and "| DVC hash | not measured (stage not in dvc.lock) |" in nli
    assert "Rows with and without this model's features: not measured." not in nli  # the MTL ablation row reads it
    assert "| MTL | no_nli_grid: `nli_grid: false` | 0.810 ± 0.010 | not measured | 0.750 (0.700 train_alexa) |" in nli
    assert '| MTL | default (`feature_groups: ["metadata", "bienc"]`) | 0.800 ± 0.020 |' in nli
    assert NOT_MEASURED in cards[INDEX] and "[nli-cross-encoder](nli-cross-encoder.md)" in cards[INDEX]


def test_an_artifact_added_to_dvc_yaml_gets_a_card(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    repo = _repo(tmp_path, artifacts={"mtl-reranker": ARTIFACTS["mtl-reranker"]}, stages=STAGES, metrics={"mtl": {}})
    readme, results = repo / "README.md", repo / "RESULTS.md"
    readme.write_text("# r\n<!-- headline:start -->\n<!-- headline:end -->\n")
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs/pipeline.md").write_text("# pipeline\n<!-- dag:start -->\n<!-- dag:end -->\n")
    results.write_text(
        "# results\n<!-- results:start -->\n<!-- results:end -->\n<!-- timings:start -->\n<!-- timings:end -->\n"
    )
    cards = repo / CARDS_DIR
    update_docs(readme, results, repo / "metrics")
    assert sorted(p.name for p in cards.iterdir()) == [INDEX, "mtl-reranker.md"] and not stale_docs(
        readme, results, repo / "metrics"
    )

    # a new artifact: the check names its missing card and the stale index, one line, exit 2
    stages = {
        **STAGES,
        "foo": {
            "cmd": "python -m stages.foo",
            "outs": ["models/foo"],
            "params": ["foo"],
            "metrics": [{"metrics/foo.json": {"cache": False}}],
        },
    }
    _repo(
        repo,
        artifacts={**ARTIFACTS, "foo-model": {"path": "models/foo", "type": "model", "desc": "a new model"}},
        stages=stages,
        metrics={"mtl": {}, "foo": {"auc": 0.91, "n": {"pairs": 12}}},
        params={"foo": {"depth": 3}, "bar": 1},
    )
    assert set(stale_docs(readme, results, repo / "metrics")) == {
        cards / INDEX,
        cards / "foo-model.md",
        cards / "nli-cross-encoder.md",
    }
    args = ["report", "--readme", str(readme), "--results", str(results), "--metrics-dir", str(repo / "metrics")]
    with pytest.raises(SystemExit) as e:
        cli.main(args + ["--check"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and str(cards / "foo-model.md") in err
    assert cli.main(args) == 0 and "foo-model.md" in capsys.readouterr().out
    card = (cards / "foo-model.md").read_text()
    assert (
        "| path | `models/foo` (type: model;" in card
        and "| produced by | stage `foo` (`python -m stages.foo`) |" in card
    )
    assert (
        "| `foo.depth` | `3` | params.yaml |" in card
        and "`bar`" not in card
        and "Stage `foo` has no dvc.lock entry yet" in card
    )
    assert "| auc | 0.910 |" in card and "| n.pairs | 12 |" in card and "- a new model" in card
    assert "[foo-model](foo-model.md)" in (cards / INDEX).read_text() and cli.main(args + ["--check"]) == 0

    # an artifact removed: its generated card goes, a hand-written file in the folder stays
    (cards / "notes.md").write_text("# hand-written\n")
    _repo(repo, artifacts={"mtl-reranker": ARTIFACTS["mtl-reranker"]}, stages=stages)
    assert cards / "foo-model.md" in stale_docs(readme, results, repo / "metrics")
    update_docs(readme, results, repo / "metrics")
    assert sorted(p.name for p in cards.iterdir()) == [INDEX, "mtl-reranker.md", "notes.md"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--metrics-dir", "{repo}/metric"], "{repo}/metric: no such metrics folder"),
        (["--metrics-dir", "{repo}/empty"], "{repo}/empty: holds no metrics *.json file"),
        (["--cards", "{repo}"], "{repo}/README.md: not a generated model card"),
        # issue 64 #4: a file was a FileExistsError traceback; docs/ and metrics/ hold none of the files a card would
        # overwrite, so five cards and an index went in among their files, exit 0
        pytest.param(
            ["--cards", "{repo}/README.md"], "{repo}/README.md: a file, not a model-cards folder", id="cards-a-file"
        ),
        pytest.param(
            ["--cards", "{repo}/README.md/cards"],
            "{repo}/README.md/cards: {repo}/README.md is a file, not a model-cards folder",
            id="cards-inside-a-file",
        ),
        pytest.param(["--cards", "{repo}/docs"], "{repo}/docs: holds model_cards/, not a model card", id="cards-docs"),
        pytest.param(
            ["--cards", "{repo}/metrics"], "{repo}/metrics: holds mtl.json, not a model card", id="cards-metrics"
        ),
        pytest.param(
            ["--cards", "{repo}/notes"],
            "{repo}/notes: no generated model card among its 1 *.md files",
            id="cards-only-hand-written",
        ),
    ],
)
def test_report_refuses_a_wrong_folder_before_writing_anything(tmp_path, monkeypatch, capsys, extra, message):
    """A typo in --metrics-dir, an empty metrics folder, or `--cards .` (the README's own folder), `docs` or `metrics`
    used to exit 0 after wiping hundreds of generated lines or writing the cards among files that are not cards
    (README.md overwritten with the card index): one line, exit 2, no file touched."""
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    repo = _repo(tmp_path, artifacts={"mtl-reranker": ARTIFACTS["mtl-reranker"]}, stages=STAGES, metrics={"mtl": {}})
    (repo / "empty").mkdir()
    (repo / "notes").mkdir()
    (repo / "notes" / "todo.md").write_text("# written by hand\n")
    readme, results = repo / "README.md", repo / "RESULTS.md"
    readme.write_text("# r\n<!-- headline:start -->\n<!-- headline:end -->\n")
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs/pipeline.md").write_text("# pipeline\n<!-- dag:start -->\n<!-- dag:end -->\n")
    results.write_text(
        "# results\n<!-- results:start -->\n<!-- results:end -->\n<!-- timings:start -->\n<!-- timings:end -->\n"
    )
    args = ["report", "--readme", str(readme), "--results", str(results), "--metrics-dir", str(repo / "metrics")]
    assert cli.main(args) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()}
    for mode in ([], ["--check"], ["--print"]):
        if mode == ["--print"] and "--cards" in extra:
            continue  # --print writes nothing and reads no cards folder
        with pytest.raises(SystemExit) as e:
            cli.main(args + [x.format(repo=repo) for x in extra] + mode)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {message.format(repo=repo)}"), err
        assert {p: p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()} == before
