"""README numbers come from the metrics files, never typed by hand."""

import json

from medrank.report import readme_is_current, render_results
from tests.conftest import REPO


def test_readme_results_block_matches_metrics():
    assert readme_is_current(REPO / "README.md", REPO / "metrics"), "run `medrank report --readme README.md` (results from metrics/, DAG from dvc.yaml)"


def test_render_results_tables(tmp_path):
    (tmp_path / "task3_val_x.json").write_text('{"accuracy": 0.5, "precision": 0.25, "mrr": 1.0, "spearman": 0.1, "spearman_true": null}')
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
    ens = {"cv": cvs, "val": val, "cv_by_mtl_weight": {"0.0": cvs, "0.5": {**cvs, "accuracy": {"mean": 0.9, "sd": 0.01}}}}
    diff = {"diff": 0.012, "ci95": [-0.02, 0.05], "p_better": 0.71, "p_worse": 0.25}
    vs = {"resamples": 100, **{w: {k: diff for k in ("accuracy", "precision", "mrr", "spearman_true")} for w in ("val", "cv")}}
    (tmp_path / "task3_val.json").write_text(json.dumps({**val, "system": "mtl", "selection": "CV", "systems": {"mtl": {"cv": cvs, "val": val}, "ensemble": ens},
                                                         "vs_baseline": vs, "question_chars_median": {"test": 49, "train_alexa": 31},
                                                         "cv_by_split": {"final": {"train_alexa": val}, "baseline": {"train_alexa": val}},
                                                         "cv_by_order": {"filter probability": val}}))  # fmt: skip
    (tmp_path / "mtl.json").write_text(json.dumps({"cv": cvs, "ablations": {"no_grid": {**cvs, "overrides": {"nli_grid": False}}}}))
    (tmp_path / "baseline.json").write_text(json.dumps({
        "table1_ablation": {"metadata+bienc": {"cv": cvs, "val": val}},
        "table4_ranking": {"metadata+bienc": {k: {"cv_spearman_true": cv, "val_spearman": 0.1} for k in ("lr_filter_score", "rank_svm")}},
    }))  # fmt: skip
    (tmp_path / "retrieve.json").write_text(json.dumps({"bm25_top_k": 50, "coverage": {"all": {"T=0.5": {"covered": 3, "questions": 4, "fraction": 0.75}}}}))
    (tmp_path / "cnn_squad.json").write_text(json.dumps({"dev": {"n_questions": 9, "cnn": {"mrr": 0.9, "map": 0.8, "precision@1": 0.7}}}))
    out = render_results(tmp_path)
    assert "| **mtl** (final: `submissions/task3_{val,test}.csv`) | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | 0.800 ± 0.020 | 0.800 ± 0.020 |" in out
    assert "| metadata + bienc | 0.800 ± 0.020 | 0.800 ± 0.020 | 0.800 ± 0.020 | 0.790 | 0.780 | 0.300 |" in out
    assert "| metadata + bienc | 0.800 ± 0.020 | 0.100 | 0.800 ± 0.020 | 0.100 |" in out
    assert "| T=0.5 | 3 / 4 | 0.750 |" in out
    assert "| cnn | 0.900 | 0.800 | 0.700 |" in out
    assert "| 0.5 | 0.900 ± 0.010 | 0.800 ± 0.020 | 0.800 ± 0.020 | 0.800 ± 0.020 |" in out
    assert "| val | +0.012 [-0.020, +0.050] (71% / 25%) | +0.012 [-0.020, +0.050] (71% / 25%) |" in out
    assert "(100 resamples of the questions" in out
    assert "| train_alexa | 31 | 0.790 | 0.780 | 0.930 | 0.300 | 0.270 | 0.790 |" in out
    assert "| test (blind) | 49 | — | — |" in out
    assert "| filter probability | 0.930 | 0.300 | 0.270 |" in out
    assert "| default (params.yaml `mtl`) | — | 0.800 ± 0.020 |" in out
    assert "| no_grid | `nli_grid: false` | 0.800 ± 0.020 |" in out
    assert "Final system: `mtl`, chosen by CV." in out
    final = json.loads((tmp_path / "task3_val.json").read_text())
    for weight, line in ((0.0, "Final system: `ensemble` (MTL weight 0: the baseline's probabilities and ranks alone, thresholded on out-of-fold rows), chosen by CV."),
                         (0.5, "Final system: `ensemble` (MTL weight 0.5), chosen by CV.")):  # fmt: skip
        final["system"], final["systems"]["ensemble"]["mtl_weight"] = "ensemble", weight
        (tmp_path / "task3_val.json").write_text(json.dumps(final))
        assert line in render_results(tmp_path)
