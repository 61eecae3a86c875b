"""RESULTS.md's `results` block: every section in order, and the metrics files shown in full."""

from __future__ import annotations

from pathlib import Path

from medrank.reporting.formatting import flat_keys, fmt_num, read_metrics
from medrank.reporting.quality import (
    baseline_section,
    mtl_confirm_section,
    mtl_section,
    nested_section,
    task2_section,
    task3_section,
)
from medrank.reporting.signals import (
    cnn_section,
    finetune_section,
    gpu_bi_encoders_section,
    judged_rows_section,
    nt_grid_section,
    options_section,
    passages_section,
    qa_bienc_section,
    qa_graded_section,
    retrieve_section,
)


DETAILS = ("data", "normalize")  # metrics files shown in full (collapsed); the rest: `dvc metrics show`


def render_results(metrics_dir: str | Path = "metrics") -> str:
    """Markdown for RESULTS.md: every system on validation, bootstrap, CV by set and order, ablations, retrieval,
    cross-encoders, CNN, then the data and normalization metrics in full inside collapsed blocks."""
    metrics = read_metrics(metrics_dir)
    lines = task3_section(metrics)
    lines += nested_section(metrics.get("nested_loso", {}))
    lines += task2_section(metrics.get("task2", {}))
    lines += baseline_section(
        metrics.get("baseline", {}), metrics.get("baseline_ablations", {}), metrics.get("noise_band", {})
    )
    lines += mtl_section(metrics.get("mtl", {}), metrics.get("mtl_ablations", {}))
    lines += mtl_confirm_section(metrics.get("mtl_confirm", {}))
    lines += judged_rows_section(metrics.get("judged_rows", {}))
    lines += qa_graded_section(metrics.get("qa_graded", {}))
    lines += passages_section(metrics.get("passages", {}))
    lines += qa_bienc_section(metrics.get("qa_bienc", {}), metrics.get("bienc"))
    lines += gpu_bi_encoders_section(metrics.get("gpu_bi_encoders", {}))
    lines += retrieve_section(metrics.get("retrieve", {}))
    lines += finetune_section(metrics)
    lines += cnn_section(metrics.get("cnn_squad", {}), metrics.get("cnn_crossenc", {}))
    lines += nt_grid_section(metrics.get("nt_grid", {}))
    lines += options_section(metrics.get("options", {}))
    lines += ["Every metrics file in full: `dvc metrics show`; the data counts and normalization statistics:", ""]
    for name, m in metrics.items():
        if name not in DETAILS:
            continue
        flat = flat_keys(m)
        if not flat:
            continue
        lines += [f"<details><summary><code>{name}.json</code></summary>", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {fmt_num(v)} |" for k, v in sorted(flat.items())]
        lines += ["", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"
