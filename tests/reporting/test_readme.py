"""README.md and RESULTS.md numbers come from the metrics files, never typed by hand."""

import json
import re
import subprocess

import pytest

from medrank import cli
from medrank.reporting import documents
from medrank.core.errors import MedrankError
from medrank.reporting import render_headline, render_results, stale_docs, update_docs
from tests.conftest import REPO
from tests.helpers.committed import checked_tree, described


@pytest.mark.checkout
def test_readme_and_results_blocks_match_metrics(tmp_path):
    """The documents as rendered from metrics/, dvc.lock and dvc.yaml: the working tree's, or HEAD's after a user's
    own `dvc repro` of the committed code left its documents as committed (tests/helpers/committed.py)."""
    root = checked_tree(tmp_path)
    stale = stale_docs(root / "README.md", root / "RESULTS.md", root / "metrics")
    assert not stale, (
        f"{stale}: run `medrank report` (tables and model cards from metrics/ and dvc.lock, DAG from dvc.yaml)"
        + described(root)
    )


@pytest.mark.checkout
def test_readme_holds_only_the_headline_table():
    """Issue 45: a newcomer reads the README on one walk: whole, at most 10,000 bytes. Its one generated block is the
    headline table (rendered from metrics/; after a tiny-profile repro it lists other systems), so the budget is split:
    what is written by hand, and the headline block, bounded apart. The DAG (`dvc dag --md`, which grows with the
    pipelines) is docs/pipeline.md's."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "<!-- results:start -->" not in readme and "<!-- headline:start -->" in readme
    assert "<!-- dag:start -->" not in readme and "```mermaid" not in readme
    pipeline = (REPO / "docs" / "pipeline.md").read_text(encoding="utf-8")
    assert pipeline.count("<!-- dag:start -->") == 1 and "```mermaid" in pipeline
    headline = readme[readme.index("<!-- headline:start -->") : readme.index("<!-- headline:end -->")]
    by_hand = len(readme.encode()) - len(headline.encode())
    # 6,700 at issue 45; +175 for the tests paragraph's refresh after a user's own repro (issue 64 #7)
    assert by_hand <= 6_875, "README grew: detail tables and notes belong in RESULTS.md or docs/"
    assert len(headline.encode()) <= 3_300, "the headline block grew: detail belongs in RESULTS.md's tables"
    assert len(readme.encode()) <= 10_000


@pytest.mark.checkout
def test_readme_defines_its_terms_before_the_results_use_them():
    """Issue 45: the words of the headline block (nested LOSO, the written rule, noise band, shift-worst) are defined
    above it, and the first screen is what it is, the two commands and a tree of the packages."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    results = readme.index("<!-- headline:start -->")
    for term in ("**nested LOSO**", "**the written rule**", "**noise band**", "**shift-worst**"):
        assert -1 < readme.find(term) < results, term
    first_screen = "\n".join(readme.splitlines()[:60])
    assert "## Two commands" in first_screen and "dvc repro" in first_screen
    for package in ("core", "params", "data", "text", "encoders", "task3", "task2", "selection", "models", "serving"):
        assert f"  {package}/ " in first_screen, package
    assert "  reporting/ " in first_screen and "stages/ " in first_screen


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.checkout
def test_every_relative_link_of_the_documents_resolves():
    """A link in a tracked markdown file (README, RESULTS, docs/, model cards) names a file that exists and, into a
    markdown file, a heading it has. Links inside code blocks are examples, not links."""
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    broken = []
    for name in files.stdout.split():
        doc = REPO / name
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (doc.parent / path) if path else doc
            if not target.exists():
                broken.append(f"{name}: {link}")
            elif anchor and target.suffix == ".md":
                headings = re.findall(r"(?m)^#+ (.*)$", target.read_text(encoding="utf-8"))
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{name}: {link} (no such heading)")
    assert not broken, broken


@pytest.mark.parametrize(
    "data, message",
    [
        (b'{"accuracy": 0.5', "not valid JSON"),
        (b"[]", "expected a JSON object of metrics, got list"),
        (b'{"a": "\xff"}', "not UTF-8 text"),
        (b"<<<<<<< HEAD\n{}\n", "not valid JSON"),
        # a number written as a string was a traceback in the tables' `{v:.3f}` (issue 46 #7)
        (b'{"accuracy": "0.8", "system": "mtl"}', "accuracy: the number '0.8' is written as a string"),
        (b'{"systems": {"mtl": {"spearman": [0.1, " -1e-3"]}}}', "systems.mtl.spearman.1: the number ' -1e-3' is"),
        (b'{"accuracy": "NaN"}', "accuracy: the number 'NaN' is written as a string"),
    ],
)
def test_report_names_a_broken_metrics_file_in_one_line(tmp_path, capsys, data, message):
    """What a merge conflict, a full disk or a bad edit leaves in metrics/ was a traceback."""
    (tmp_path / "task3_val.json").write_bytes(data)
    with pytest.raises(SystemExit) as e:
        # --readme: a folder of its own, no dvc.yaml declaring the metrics files it must hold (the checkout's does)
        cli.main(["report", "--print", "--metrics-dir", str(tmp_path), "--readme", str(tmp_path / "README.md")])
    err = capsys.readouterr().err
    assert (
        e.value.code == 2
        and err.count("\n") == 1
        and err.startswith(f"error: {tmp_path / 'task3_val.json'}: {message}")
        and "git checkout" in err
    )


@pytest.mark.checkout
@pytest.mark.parametrize(
    "stem, key, value",
    [
        ("task3_val", "accuracy", True),  # was shown as "True" in the headline table, exit 0
        ("task3_val", "mrr", [0.92]),  # was shown as "[0.92]"
        ("nested_loso", "final_system.nested_loso.by_keep_rule.*.mrr.mean", None),  # was a traceback
        ("mtl_confirm", "rows.*.scores.0", None),  # read in a loop over a list: a traceback
    ],
)
def test_report_names_a_metrics_value_of_the_wrong_kind(tmp_path, capsys, stem, key, value):
    """Issue 46 #7: null / true / a list where the report formats a number: one line naming the file and the key
    (`*`: the first key there, as the metrics of the checkout or of a tiny-profile repo name it)."""
    import shutil

    metrics = tmp_path / "metrics"
    shutil.copytree(REPO / "metrics", metrics)
    path = metrics / f"{stem}.json"
    data = json.loads(path.read_text())
    parts = key.split(".")
    node = data
    for i, k in enumerate(parts[:-1]):
        if k == "*":
            parts[i] = k = next(iter(node))
        node = node[int(k)] if isinstance(node, list) else node[k]
    key, last = ".".join(parts), parts[-1]
    node[int(last) if isinstance(node, list) else last] = value
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--print", "--metrics-dir", str(metrics)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"error: {path}: {key}: expected a number, got {json.dumps(value)}; restore it with `git checkout"
    )


def test_report_cli_checks_and_refreshes_both_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    (tmp_path / "task3_val.json").write_text(json.dumps({"accuracy": 0.5, "system": "baseline", "systems": {}}))
    readme, results, pipeline = tmp_path / "README.md", tmp_path / "RESULTS.md", tmp_path / "docs" / "pipeline.md"
    readme.write_text("# r\n<!-- headline:start -->\nstale table\n<!-- headline:end -->\nprose\n")
    pipeline.parent.mkdir()
    pipeline.write_text("# pipeline\nstages\n<!-- dag:start -->\n<!-- dag:end -->\n")
    results.write_text(
        "# results\n<!-- results:start -->\n<!-- results:end -->\nhand-written notes\n<!-- timings:start -->\n<!-- timings:end -->\n"
    )
    args = ["report", "--readme", str(readme), "--results", str(results), "--metrics-dir", str(tmp_path)]

    def run(*extra: str) -> tuple[int, str, str]:
        try:
            code = cli.main(args + list(extra))
        except SystemExit as e:
            code = e.code
        return code, *capsys.readouterr()

    code, _, err = run("--check")
    assert (
        code == 2
        and err.count("\n") == 1
        and f"{readme}, {pipeline}, {results}: generated blocks differ" in err
        and "--readme" in err
    )
    assert run() == (0, f"updated: {readme}, {pipeline}, {results}\n", "")
    assert run("--check") == (0, "", "") and run() == (0, "up to date\n", "")
    text = readme.read_text()
    assert "prose" in text and "stale table" not in text and "graph" not in text
    assert pipeline.read_text() == "# pipeline\nstages\n<!-- dag:start -->\ngraph\n<!-- dag:end -->\n"
    assert "| **baseline** (final: `submissions/task3_{val,test}.csv`) | 0.500 |" in text
    assert "hand-written notes" in results.read_text() and "Every metrics file in full" in results.read_text()
    code, out, _ = run("--print")
    assert code == 0 and "MEDIQA 2019 bar" in out and "Every metrics file in full" in out
    results.write_text("# results without markers\n")
    code, _, err = run("--check")
    assert code == 2 and "needs exactly one <!-- results:start -->" in err
    pipeline.unlink()
    code, _, err = run("--check")
    assert code == 2 and err.startswith(f"error: {pipeline}: not found")


def test_timings_are_refreshed_but_never_a_drift(tmp_path, monkeypatch, capsys):
    """A re-run on another machine changes the seconds and nothing else: `medrank report --check` (and the drift
    test) pass; `medrank report` refreshes the timings block; the block's markers must still be there."""
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "task3_val.json").write_text(json.dumps({"accuracy": 0.5, "system": "baseline", "systems": {}}))
    nli = {"val": {"accuracy": 0.8}, "n_train_pairs": 10, "train_precision": "fp32", "train_seconds": 172.5}
    (metrics / "finetune_nli.json").write_text(json.dumps(nli))
    (metrics / "mtl_seconds.json").write_text(json.dumps({"total": 31.4, "fits_sum": 52.7}))
    (metrics / "embed.json").write_text(json.dumps({"seconds": 5.2, "extract": {"nli": {"pairs_per_s": 0.0}}}))
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text("<!-- headline:start -->\n<!-- headline:end -->\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "pipeline.md").write_text("<!-- dag:start -->\n<!-- dag:end -->\n")
    results.write_text("<!-- results:start -->\n<!-- results:end -->\n<!-- timings:start -->\n<!-- timings:end -->\n")
    docs = dict(readme=readme, results=results, metrics_dir=metrics, cards=tmp_path / "cards")
    update_docs(**docs)
    text = results.read_text()
    assert "172.5" not in text.split("<!-- timings:start -->")[0]  # no seconds in the checked block
    timings = text.split("<!-- timings:start -->")[1]
    assert "| finetune_nli | — | 172.5 | — |" in timings and "| mtl | 31.4 | — | — |" in timings
    assert "| embed | 5.2 | — | — |" in timings  # 0 pairs/s: all cached, nothing timed
    assert stale_docs(**docs) == []
    (metrics / "finetune_nli.json").write_text(json.dumps({**nli, "train_seconds": 186.8}))
    (metrics / "mtl_seconds.json").write_text(json.dumps({"total": 40.0}))
    assert stale_docs(**docs) == []  # only the seconds moved
    assert update_docs(**docs) == [results] and "| finetune_nli | — | 186.8 | — |" in results.read_text()
    (metrics / "finetune_nli.json").write_text(json.dumps({**nli, "n_train_pairs": 11}))
    assert stale_docs(**docs) == [results]  # a result moved: drift
    results.write_text("<!-- results:start -->\n<!-- results:end -->\n")
    with pytest.raises(MedrankError, match="needs exactly one <!-- timings:start -->"):
        stale_docs(**docs)


LOSO = {
    "accuracy": {"mean": 0.75, "worst": 0.7, "worst_source": "train_alexa"},
    "mrr": {"mean": 0.6, "worst": 0.5, "worst_source": "train_liveqa"},
    "spearman": {"mean": 0.3, "worst": 0.2, "worst_source": "val"},
}


def test_render_headline_beside_baseline_chiqa_and_the_2019_bar(tmp_path):
    cv = {"mean": 0.8, "sd": 0.02}
    val = {"accuracy": 0.79, "precision": 0.78, "mrr": 0.93, "spearman": 0.3, "spearman_true": 0.27}
    final = {
        **val,
        "system": "mtl",
        "mtl_weight": 1.0,
        "keep_rule": "em",
        "order": "prob_first",
        "selection": {"rule": "the written rule.", "noise_band": {"accuracy": 0.01, "order": 0.02}},
        "systems": {"final": {"cv": {"accuracy": cv}, "loso": LOSO}, "chiqa": {"loso": LOSO}},
    }
    (tmp_path / "task3_val.json").write_text(json.dumps(final))
    (tmp_path / "task3_val_baseline.json").write_text(
        json.dumps({**val, "accuracy": 0.7, "cv": {"accuracy": cv}, "cv_questions": 9})
    )
    (tmp_path / "task3_val_chiqa.json").write_text(json.dumps({**val, "accuracy": 0.4, "n_questions": 3}))
    rqe = {
        "chosen": "meqsum > val",
        "n_val_pairs": 302,
        "cv": {"accuracy": 0.84, "accuracy_sd": 0.05, "same_focus": {"accuracy": 0.8, "accuracy_sd": 0.06}},
    }
    (tmp_path / "finetune_rqe.json").write_text(json.dumps(rqe))
    out = render_headline(tmp_path)
    assert "the 3 validation questions" in out and "over the 9 train + validation questions" in out
    assert (
        "| **mtl** (final: `submissions/task3_{val,test}.csv`) | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | — | 0.800 ± 0.020 | 0.750 (0.700 train_alexa) |"
        in out
    )
    assert (
        "| baseline (LR filter + rank SVM) | 0.700 |" in out
        and "| CHiQA order (every answer kept) | 0.400 | 0.780 | 0.930 | 0.300 | 0.270 | — | — | 0.750 (0.700 train_alexa) |"
        in out
    )
    assert (
        "| MEDIQA 2019 bar: best team per metric, blind test | 0.783 | 0.819 | 0.962 | 0.338 | — | — | — | — |" in out
    )
    assert (
        "Final system: `mtl` (MTL weight 1), keep rule `em`, order `prob_first`. Chosen by the written rule (above). Noise band (seed spread): accuracy 0.010"
        in out
    )
    assert (
        "`meqsum > val`, question-grouped CV accuracy over the 302 validation pairs 0.840 ± 0.050 (each pair alone at 0.5)"
        in out
    )
    assert "the best 2019 team, blind test: 0.749" in out
    assert out.count("\n|---") == 1  # one table
    assert "MTL (multi-task network)" not in out  # the final row is the MTL already
    # the rule picks the baseline: the baseline is the final row, the MTL (the paper's system) still shown beside it
    (tmp_path / "task3_val.json").write_text(
        json.dumps(
            {
                **final,
                "system": "baseline",
                "mtl_weight": 0.0,
                "systems": {**final["systems"], "mtl": {"cv": {"accuracy": cv}, "loso": LOSO}},
            }
        )
    )
    (tmp_path / "task3_val_mtl.json").write_text(json.dumps({**val, "accuracy": 0.81}))
    out = render_headline(tmp_path)
    assert (
        "| **baseline** (final: `submissions/task3_{val,test}.csv`) | 0.790 |" in out
        and "| baseline (LR filter" not in out
    )
    assert (
        "| MTL (multi-task network) | 0.810 | 0.780 | 0.930 | 0.300 | 0.270 | — | 0.800 ± 0.020 | 0.750 (0.700 train_alexa) |"
        in out
    )


def test_render_results_tables(tmp_path):
    (tmp_path / "task3_val_x.json").write_text(
        '{"accuracy": 0.5, "precision": 0.25, "mrr": 1.0, "spearman": 0.1, "spearman_true": null}'
    )
    (tmp_path / "data.json").write_text('{"answers": {"val": 234}}')
    (tmp_path / "embed.json").write_text('{"seconds": 12.5}')
    out = render_results(tmp_path)
    assert "seconds" not in out  # only data/normalize are shown in full
    assert "| x | 0.500 | 0.250 | 1.000 | 0.100 | — | — | — |" in out
    assert "| answers.val | 234 |" in out


def test_render_results_headline_tables(tmp_path):
    cv = {"mean": 0.8, "sd": 0.02}
    cvs = {k: cv for k in ("accuracy", "precision", "mrr", "spearman", "spearman_true")}
    val = {"accuracy": 0.79, "precision": 0.78, "mrr": 0.93, "spearman": 0.3, "spearman_true": 0.27}
    (tmp_path / "task3_val_mtl.json").write_text(json.dumps(val))
    (tmp_path / "task3_val_ensemble.json").write_text(json.dumps(val))
    diff = {"diff": 0.012, "ci95": [-0.02, 0.05], "p_better": 0.71, "p_worse": 0.25}
    vs = {
        "resamples": 100,
        **{w: {k: diff for k in ("accuracy", "precision", "mrr", "spearman_true")} for w in ("val", "cv")},
    }
    cand = {"cv": cvs, "loso": LOSO, "score": 0.775}
    (tmp_path / "task3_val.json").write_text(
        json.dumps(
            {
                **val,
                "system": "ensemble",
                "mtl_weight": 0.5,
                "keep_rule": "threshold",
                "order": "rank",
                "selection": {"rule": "CV and LOSO."},
                "systems": {"mtl": {"cv": cvs, "loso": LOSO}, "final": {"cv": cvs, "loso": LOSO}},
                "candidates": {
                    "0.0": {"threshold": cand, "em": cand},
                    "0.5": {"threshold": cand, "em": cand},
                    "1.0": {"em": cand},
                },
                "orders": {"rank": cand, "prob": cand},
                "vs_baseline": vs,
                "question_chars_median": {"test": 49, "train_alexa": 31},
                "cv_by_split": {"final": {"train_alexa": val}, "baseline": {"train_alexa": val}},
            }
        )
    )
    (tmp_path / "mtl.json").write_text(json.dumps({"cv": cvs, "loso": LOSO}))
    (tmp_path / "mtl_ablations.json").write_text(
        json.dumps({"rows": {"no_grid": {**cvs, "loso": LOSO, "overrides": {"nli_grid": False}}}})
    )
    (tmp_path / "baseline_ablations.json").write_text(
        json.dumps(
            {
                "default_features": ["metadata", "bow"],
                "table1_ablation": {"metadata+bienc": {"cv": cvs, "loso": LOSO, "selection_score": 0.775, "val": val}},
                "table4_ranking": {
                    "metadata+bienc": {
                        k: {"cv_spearman_true": cv, "loso_spearman": LOSO["spearman"]}
                        for k in ("lr_filter_score", "rank_svm")
                    }
                },
            }
        )
    )
    (tmp_path / "retrieve.json").write_text(
        json.dumps({"bm25_top_k": 50, "coverage": {"all": {"T=0.5": {"covered": 3, "questions": 4, "fraction": 0.75}}}})
    )
    (tmp_path / "cnn_squad.json").write_text(
        json.dumps({"dev": {"n_questions": 9, "cnn": {"mrr": 0.9, "map": 0.8, "precision@1": 0.7}}})
    )
    out = render_results(tmp_path)
    row = "0.800 ± 0.020 | 0.800 ± 0.020 | 0.800 ± 0.020 | 0.750 (0.700 train_alexa) | 0.600 (0.500 train_liveqa) | 0.300 (0.200 val) |"
    assert (
        f"| **ensemble** (final: `submissions/task3_{{val,test}}.csv`) | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | {row}"
        in out
    )
    assert f"| mtl | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | {row}" in out
    assert "The default `baseline.features` (metadata + bow) is not the rule's pick (metadata + bienc)." in out
    assert (
        "| **metadata + bienc** (rule's pick) | 0.800 ± 0.020 | 0.750 (0.700 train_alexa) | 0.775 | 0.800 ± 0.020 |"
        in out
    )
    assert "| metadata + bienc | 0.800 ± 0.020 | 0.300 (0.200 val) | 0.800 ± 0.020 | 0.300 (0.200 val) |" in out
    assert "| T=0.5 | 3 / 4 | 0.750 |" in out
    assert "| cnn | 0.900 | 0.800 | 0.700 |" in out
    # the candidates: every rule at the chosen weight, every weight at the chosen rule (the chosen one in bold)
    assert (
        "| **0.5** | **threshold** | 0.800 ± 0.020 | 0.750 (0.700 train_alexa) | 0.775 |" in out
        and "| 0.5 | em |" in out
    )
    assert "| 0.0 | threshold |" in out and "| 0.0 | em |" not in out and "| 1.0 | em |" not in out
    assert (
        "| **rank** | 0.800 ± 0.020 | 0.800 ± 0.020 | 0.600 (0.500 train_liveqa) | 0.300 (0.200 val) | 0.775 |" in out
    )
    assert "| val | +0.012 [-0.020, +0.050] (71% / 25%) | +0.012 [-0.020, +0.050] (71% / 25%) |" in out
    assert "(100 resamples of the questions" in out
    assert "| train_alexa | 31 | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | 0.790 |" in out
    assert "| test (blind) | 49 | — | — |" in out
    assert (
        "| default (params.yaml `mtl`) | — | 0.800 ± 0.020 |" in out
        and "| 0.750 (0.700 train_alexa) | 0.600 (0.500 train_liveqa) |" in out
    )
    assert "| no_grid | `nli_grid: false` | 0.800 ± 0.020 |" in out
    assert "Final system: `ensemble` (MTL weight 0.5), keep rule `threshold`, order `rank`. Rule: CV and LOSO." in out
    # the MTL alone chosen: its own row is marked, no second row for the final system
    final = json.loads((tmp_path / "task3_val.json").read_text())
    (tmp_path / "task3_val.json").write_text(json.dumps({**final, "system": "mtl", "mtl_weight": 1.0}))
    out = render_results(tmp_path)
    assert (
        out.count("(final: `submissions/task3_{val,test}.csv`)") == 1
        and f"| **mtl** (final: `submissions/task3_{{val,test}}.csv`) | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | {row}"
        in out
    )


def test_render_results_rqe_rows_and_judged_retrieval(tmp_path):
    row = lambda acc, kind: {
        "kind": kind,
        "accuracy": acc,
        "accuracy_sd": 0.05,
        "accuracy_folds": [acc] * 5,
        "auc": 0.9,
        "same_focus": {"n": 179, "accuracy": acc - 0.1, "accuracy_sd": 0.1},
        "by_overlap": {"none": {"n": 120, "accuracy": 0.9}, "low": {"n": 110, "accuracy": 0.7}},
    }
    rqe = {
        "chosen": "meqsum > val",
        "n_val_pairs": 302,
        "n_val_questions": 119,
        "selection_rule": "best mean CV accuracy",
        "rows": {"zero-shot bi-encoder cosine": row(0.826, "cosine"), "meqsum > val": row(0.85, "cross_encoder")},
        "vs": {
            "zero-shot bi-encoder cosine": {
                "accuracy_diff": 0.024,
                "accuracy_diff_sd": 0.01,
                "same_focus_diff": 0.03,
                "same_focus_diff_sd": 0.02,
            }
        },
    }
    (tmp_path / "finetune_rqe.json").write_text(json.dumps(rqe))
    judged = {
        "questions_judged": 39,
        "relevant_grade": 3,
        "by_rqe": {"mrr": 0.3, "recall@1": 0.15, "recall@10": 0.5, "recall@3": 0.3},
        "by_bm25": {"mrr": 0.33, "recall@1": 0.13, "recall@10": 0.45, "recall@3": 0.2},
        "selected": {"hit_rate": 0.2, "precision": 0.13, "mrr": 0.2},
    }
    cov = {"all": {"T=0.5": {"covered": 3, "questions": 4, "fraction": 0.75}}}
    recipe = {"bi_encoder": {"extras": ["meqsum", "liveqa"], "val_stage": True}}
    (tmp_path / "retrieve.json").write_text(
        json.dumps(
            {
                "coverage": cov,
                "bm25_top_k": 50,
                "n_candidates": 3,
                "rqe_threshold": 0.5,
                "judged": judged,
                "rqe_recipe": recipe,
            }
        )
    )
    out = render_results(tmp_path)
    assert "| **meqsum > val** (chosen) | 0.850 ± 0.050 | 0.900 | 0.750 ± 0.100 | 0.900 | 0.700 |" in out
    assert "| zero-shot bi-encoder cosine | 0.826 ± 0.050 |" in out and "over the 302 validation pairs (119 CHQs" in out
    assert (
        "Chosen − `zero-shot bi-encoder cosine`, paired per fold: accuracy 0.024 ± 0.010, same-focus 0.030 ± 0.020."
        in out
    )
    assert "| order | MRR | recall@1 | recall@3 | recall@10 |" in out  # k in numeric order, not JSON's text order
    assert "| RQE score | 0.300 | 0.150 | 0.300 | 0.500 |" in out and "| BM25 | 0.330 | 0.130 | 0.200 | 0.450 |" in out
    assert "Caveat: the RQE model was trained on the `liveqa` source" in out
    assert "a relevant one for 0.200 of the questions, precision 0.130, MRR 0.200" in out


def test_render_nt_grid_and_confirmed_rows(tmp_path):
    def cell(n, t, score):
        m = {"accuracy": 0.8, "precision": 0.7, "mrr": 0.6, "spearman": 0.3}
        return {
            "n_candidates": n,
            "rqe_threshold": t,
            "seconds": 120.0,
            "system": "mtl",
            "mtl_weight": 1.0,
            "keep_rule": "threshold",
            "order": "rank",
            "score": score,
            "noise_band": 0.02,
            "cv": m,
            "loso": m,
            "loso_worst": {"accuracy": 0.7, "source": "train_alexa"},
            "val": m,
        }

    grid = {
        "commit": "abc1234",
        "date": "2026-11-24",
        "default": {"n_candidates": 3, "rqe_threshold": 0.5},
        "rule": "the rule",
        "pick": {
            "n_candidates": 3,
            "rqe_threshold": 0.5,
            "band": 0.02,
            "default_kept": True,
            "best": {"n_candidates": 5, "rqe_threshold": None, "score": 0.81},
        },
        "cells": [cell(3, 0.5, 0.80), cell(5, None, 0.81)],
    }
    (tmp_path / "nt_grid.json").write_text(json.dumps(grid))
    base = {
        "baseline": {"cv_accuracy": 0.81, "loso_accuracy": 0.77, "loso_worst": 0.74, "score": 0.79},
        "stage_seconds": {},
        "seconds": 0.0,
    }
    options = {
        "commit": "abc1234",
        "date": "2026-11-24",
        "rows": {
            "default": {**cell(3, 0.5, 0.80), **base, "set": []},
            "mpnet": {
                **cell(3, 0.5, 0.83),
                **base,
                "set": ["bienc.model=all-mpnet-base-v2"],
                "seconds": 900.0,
                "stage_seconds": {"bienc": 700.0, "mtl": 150.0},
            },
            "old": {
                **cell(3, 0.5, 0.79),
                **base,
                "set": ["baseline.judged_rows=true"],
                "commit": "0ld1234",
                "default_score": 0.78,
                "default_baseline_score": 0.77,
            },
        },
    }
    (tmp_path / "options.json").write_text(json.dumps(options))
    rows = {
        "default": {
            "scores": [0.8, 0.81],
            "mean": 0.805,
            "diff_mean": 0.0,
            "diff_sd": 0.0,
            "win": False,
            "overrides": {},
        },
        "no_aug": {
            "scores": [0.83, 0.84],
            "mean": 0.835,
            "diff_mean": 0.03,
            "diff_sd": 0.0,
            "win": True,
            "overrides": {"augment": False},
        },
    }
    (tmp_path / "mtl_confirm.json").write_text(
        json.dumps({"seeds": [13, 14], "band": 0.0071, "score": "mean of CV and LOSO", "rows": rows})
    )
    out = render_results(tmp_path)
    assert (
        "| 3 (default) | 0.5 | `mtl` w 1, `threshold`, `rank` | 0.800 | 0.800 (0.700 train_alexa) | **0.800** |" in out
    )
    assert "| 5 | none |" in out and "at commit abc1234, 2026-11-24" in out
    assert (
        "the default N = 3, T = 0.5 stays: the best cell (N = 5, T = none, score 0.810) is within the noise band 0.020 of it"
        in out
    )
    grid["confirm"] = {
        "commit": "def5678",
        "name": "N=5 T=null",
        "seeds": [13, 14],
        "band": 0.01,
        "rows": {
            "default": {"scores": [0.8, 0.81]},
            "N=5 T=null": {"scores": [0.83, 0.82], "diff_mean": 0.02, "diff_sd": 0.014, "win": True},
        },
    }
    (tmp_path / "nt_grid.json").write_text(json.dumps(grid))
    assert (
        "Confirmed over 2 seeds (13, 14; at commit def5678): the final system scores 0.830 0.820 at N=5 T=null vs 0.800 0.810 at the "
        "default, paired difference +0.0200 ± 0.0140 against the band 0.0100 (the default's seed sd): **a win beyond the noise**"
    ) in render_results(tmp_path)
    assert (
        "**MTL rows confirmed over 2 seeds** (seeds 13, 14" in out
        and "band = the sd of the default's score over the seeds, 0.0071" in out
    )
    assert "| no_aug | `augment: false` | 0.830 0.840 | 0.8350 | +0.0300 ± 0.0000 | **win** |" in out
    assert "| default | — | 0.800 0.810 | 0.8050 | — | — |" in out
    assert (
        "| mpnet | `bienc.model=all-mpnet-base-v2` | `mtl` w 1 | 0.800 | 0.800 (0.700 train_alexa) | **0.830** (+0.030) | 0.810 / 0.770 / 0.790 (+0.000) | — | 900 (bienc 700, mtl 150) |"
        in out
    )
    assert (
        "| old (at 0ld1234) | `baseline.judged_rows=true` |" in out
        and "| **0.790** (+0.010) | 0.810 / 0.770 / 0.790 (+0.020) |" in out
    )
    assert "| default | — | `mtl` w 1 | 0.800 |" in out and "beats the default only beyond the noise band 0.020" in out


def test_render_judged_rows(tmp_path):
    def run(acc, score, order):
        m = {"accuracy": acc, "precision": 0.7, "mrr": 0.75, "spearman": 0.3}
        return {
            "seed": 13,
            "cv": m,
            "loso": m,
            "loso_worst": {"accuracy": 0.7, "source": "train_alexa"},
            "score": score,
            "order_score": order,
            "judged_training_rows": 0 if score == 0.79 else 2921,
        }

    def modes(d_ranker, win):
        return {
            "none": {"mean": 0.79, "diff_mean": 0.0, "diff_sd": 0.0, "win": False},
            "ranker": {"mean": 0.8, "diff_mean": d_ranker, "diff_sd": 0.001, "win": win},
            "all": {"mean": 0.78, "diff_mean": -0.01, "diff_sd": 0.002, "win": False},
        }

    m = {
        "commit": "abc1234",
        "date": "2026-11-24",
        "features": ["metadata", "bienc"],
        "seeds": [13],
        "runs": {"all": [run(0.78, 0.78, 0.5)], "none": [run(0.79, 0.79, 0.5)], "ranker": [run(0.80, 0.8, 0.52)]},
        "filter": {"band": 0.0005, "modes": modes(0.01, True)},
        "order": {"band": 0.01, "modes": modes(0.02, False)},
    }
    (tmp_path / "judged_rows.json").write_text(json.dumps(m))
    out = render_results(tmp_path)
    assert "**Judged LiveQA answers as baseline training rows** (analysis/judged_rows.py at commit abc1234" in out
    assert "filter band 0.0005, order band 0.0100" in out
    body = out[out.index("| judged_rows |") :]
    assert body.index("| `none` |") < body.index("| `ranker` |") < body.index("| `all` |")
    assert (
        "| `ranker` | 2921 | 0.800 / 0.800 | 0.700 / 0.700 | 0.750 / 0.750 | 0.300 / 0.300 | 0.8000 (+0.0100 ± 0.0010 **win**) | 0.8000 (+0.0200 ± 0.0010) |"
        in out
    )


# ---------------------------------------------------------------- what a bad edit or merge leaves (issue 46 #7)


def test_report_reads_a_metrics_file_linked_to_dev_zero_capped(tmp_path, capsys):
    """metrics/x.json -> /dev/zero was read without end."""
    (tmp_path / "task3_val.json").symlink_to("/dev/zero")
    with pytest.raises(SystemExit) as e:
        # --readme: a folder of its own, no dvc.yaml declaring the metrics files it must hold (the checkout's does)
        cli.main(["report", "--print", "--metrics-dir", str(tmp_path), "--readme", str(tmp_path / "README.md")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'task3_val.json'}: more than a metrics file can be (at most 16 MiB)")


def _docs(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "task3_val.json").write_text(json.dumps({"accuracy": 0.5, "system": "baseline", "systems": {}}))
    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text("# r\n<!-- headline:start -->\n<!-- headline:end -->\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "pipeline.md").write_text("<!-- dag:start -->\n<!-- dag:end -->\n")
    results.write_text("<!-- results:start -->\n<!-- results:end -->\n<!-- timings:start -->\n<!-- timings:end -->\n")
    return ["report", "--readme", str(readme), "--results", str(results), "--metrics-dir", str(metrics)]


def test_report_names_a_latin1_byte_in_readme(tmp_path, monkeypatch, capsys):
    """A latin-1 byte in README.md was a UnicodeDecodeError traceback."""
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    args = _docs(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_bytes(readme.read_bytes().replace(b"# r", b"# caf\xe9"))
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for mode in ([], ["--check"]):
        with pytest.raises(SystemExit) as e:
            cli.main(args + mode)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {readme}: not UTF-8 text (byte 0xe9 at offset 5"), err
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


CONFLICTED = "stages:\n<<<<<<< HEAD\n  acquire:\n    cmd: a\n=======\n  acquire:\n    cmd: b\n>>>>>>> other\n"


@pytest.mark.parametrize("name", ["dvc.lock", "params.yaml", "dvc.yaml", "analysis/dvc.lock"])
def test_report_names_a_conflict_marked_file(tmp_path, monkeypatch, capsys, name):
    """`dvc dag --md` on a conflict-marked dvc.lock or params.yaml said only `failed: ['  4   acquire:']`."""
    import subprocess

    def dvc(*a, **k):  # what DVC prints for such a file (no dvc command runs in the tests)
        return subprocess.CompletedProcess(a, 1, "", "ERROR: unexpected error\n  4   acquire:\n")

    monkeypatch.setattr(subprocess, "run", dvc)
    args = _docs(tmp_path)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(CONFLICTED)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / name}: line 2: a merge conflict marker (<<<<<<<)"), err
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_the_cards_reader_names_a_broken_dvc_lock(tmp_path):
    from medrank.reporting.card_base import Repo

    (tmp_path / "metrics").mkdir()
    (tmp_path / "dvc.lock").write_text("stages:\n  acquire: [\n")
    with pytest.raises(MedrankError, match=r"dvc.lock: line \d+: not valid YAML"):
        Repo.load(tmp_path, tmp_path / "metrics")
    (tmp_path / "dvc.lock").write_text(CONFLICTED)
    with pytest.raises(MedrankError, match="dvc.lock: line 2: a merge conflict marker"):
        Repo.load(tmp_path, tmp_path / "metrics")


# ---------------------------------------------------------------- a foreign, incomplete or non-finite metrics set (issue 64 #4)


def test_report_refuses_an_incomplete_or_foreign_metrics_folder(tmp_path, monkeypatch, capsys):
    """`--metrics-dir models` or `data` (JSON files, not metrics) and a folder holding only data.json exited 0 after
    wiping the headline, RESULTS.md's tables and the cards: every metrics file dvc.yaml's stages write must be there
    (analysis/dvc.yaml's need not), else one line naming the folder and the missing files, nothing written."""
    import shutil

    import yaml

    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    args = _docs(tmp_path)
    metrics = tmp_path / "metrics"
    stages = {
        "clean": {"cmd": "c", "metrics": [{"metrics/data.json": {"cache": False}}]},
        "mtl": {"cmd": "m", "metrics": ["metrics/mtl.json", {"metrics/mtl_seconds.json": {"cache": False}}]},
        "score": {"cmd": "s", "metrics": [{"metrics/task3_val.json": {"cache": False}}]},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (tmp_path / "analysis").mkdir()
    nested = {"nested_loso": {"cmd": "n", "wdir": "..", "metrics": ["metrics/nested_loso.json"]}}
    (tmp_path / "analysis" / "dvc.yaml").write_text(yaml.safe_dump({"stages": nested}))
    (metrics / "data.json").write_text(json.dumps({"rows": 3}))
    (metrics / "mtl.json").write_text("{}")
    (metrics / "mtl_seconds.json").write_text(json.dumps({"total": 1.5}))
    assert cli.main(args) == 0  # complete: the analysis pipeline's nested_loso.json is not required
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "system.json").write_text(json.dumps({"system": "baseline", "mtl_weight": 0}))
    (tmp_path / "only_data").mkdir()
    shutil.copy(metrics / "data.json", tmp_path / "only_data")
    shutil.copytree(metrics, tmp_path / "partial")
    (tmp_path / "partial" / "mtl_seconds.json").unlink()
    capsys.readouterr()
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for folder, missing in [
        ("models", "data.json, mtl.json, mtl_seconds.json, task3_val.json"),
        ("only_data", "mtl.json, mtl_seconds.json, task3_val.json"),
        ("partial", "mtl_seconds.json"),
    ]:
        for mode in ([], ["--check"], ["--print"]):
            with pytest.raises(SystemExit) as e:
                cli.main(args + ["--metrics-dir", str(tmp_path / folder)] + mode)
            err = capsys.readouterr().err
            assert e.value.code == 2 and err.count("\n") == 1, (folder, mode, err)
            assert err.startswith(
                f"error: {tmp_path / folder}: not a complete metrics folder: lacks {missing.count(',') + 1} of the 4 "
                f"metrics files {tmp_path / 'dvc.yaml'} declares ({missing}); "
            ), err
            assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize(
    "name, text, key, shown",
    [
        # the headline table showed `nan`, exit 0
        pytest.param(
            "task3_val", '{"accuracy": NaN, "system": "baseline", "systems": {}}', "accuracy", "NaN", id="headline"
        ),
        # formatted in place (`{mean:.3f} ± {sd:.3f}`), not through fmt_metric
        pytest.param(
            "task3_val",
            '{"accuracy": 0.5, "system": "baseline", "systems": {"final": {"cv": {"accuracy": {"mean": Infinity, '
            '"sd": 0.02}}}}}',
            "systems.final.cv.accuracy.mean",
            "Infinity",
            id="formatted-in-place",
        ),
        # RESULTS.md's data details (1e999 reads as inf); the timings block
        pytest.param("data", '{"rows": {"train": 1e999}}', "rows.train", "Infinity", id="results-details"),
        pytest.param("embed", '{"seconds": Infinity}', "seconds", "Infinity", id="timings"),
    ],
)
def test_report_names_a_non_finite_metrics_number(tmp_path, monkeypatch, capsys, name, text, key, shown):
    """A NaN or ±Infinity where the report formats a number: one line naming the file and the dotted key, as for a
    null or a string there; nothing written."""
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    args = _docs(tmp_path)
    path = tmp_path / "metrics" / f"{name}.json"
    path.write_text(text)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    for mode in ([], ["--print"]) if name != "embed" else ([],):  # --print shows no timings
        with pytest.raises(SystemExit) as e:
            cli.main(args + mode)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: {path}: {key}: expected a finite number, got {shown}; restore it with"), err
        assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_a_non_finite_metrics_number_is_refused_only_where_it_is_shown(tmp_path, monkeypatch, capsys):
    """A stage may record a NaN the report never shows (a Spearman over < 2 answers): the report runs. A difference
    or a mean of one (`{a - b:+.3f}`, `sum(...) / n`) is refused naming the NaN's own key, never shown as nan."""
    from medrank.reporting.formatting import load_metrics_file

    f = tmp_path / "x.json"
    f.write_text('{"a": NaN, "b": [0.5, -Infinity], "c": 1e999}')
    m = load_metrics_file(f)
    for show, key in [
        (lambda: f"{m['a'] - 0.5:+.3f}", "a"),
        (lambda: f"{0.5 - m['a']:+.3f}", "a"),
        (lambda: f"{sum(m['b']) / 2:.3f}", "b.1"),
        (lambda: str(-m["c"])[:3], "c"),
        (lambda: round(m["a"], 3), "a"),
    ]:
        with pytest.raises(MedrankError, match=f"^{re.escape(str(f))}: {re.escape(key)}: expected a finite number"):
            show()
    assert f"{1 / m['c']:.3f}" == "0.000" and m["a"] != m["a"] and not m["a"] > 0
    monkeypatch.setattr(documents, "render_dag", lambda repo: "graph\n")
    args = _docs(tmp_path)
    unused = {"accuracy": 0.5, "system": "baseline", "systems": {}, "rho_per_question": [0.4, float("nan")]}
    (tmp_path / "metrics" / "task3_val.json").write_text(json.dumps(unused))
    assert cli.main(args) == 0 and cli.main(args + ["--check"]) == 0
