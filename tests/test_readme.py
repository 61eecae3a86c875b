"""README numbers come from the metrics files, never typed by hand."""

from medrank.report import readme_is_current, render_results
from tests.conftest import REPO


def test_readme_results_block_matches_metrics():
    assert readme_is_current(REPO / "README.md", REPO / "metrics"), "run `medrank report --readme README.md`"


def test_render_results_tables(tmp_path):
    (tmp_path / "task3_val_x.json").write_text('{"accuracy": 0.5, "precision": 0.25, "mrr": 1.0, "spearman": 0.1, "spearman_true": null}')
    (tmp_path / "data.json").write_text('{"answers": {"val": 234}}')
    out = render_results(tmp_path)
    assert "| x | 0.500 | 0.250 | 1.000 | 0.100 | — |" in out
    assert "| answers.val | 234 |" in out
