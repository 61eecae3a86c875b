"""RESULTS.md's `timings` block: where a run's time went, per metrics file, on the machine of the last `medrank report`.

Seconds and throughputs change with every re-run on another machine (or on a busy one), so they stay out of the
drift-checked blocks and cards: `medrank report` refreshes this block, `medrank report --check` and the drift test
ignore it. Every other number in the generated documents is a result a re-run reproduces.
"""

from __future__ import annotations

from pathlib import Path

from medrank.reporting.formatting import flat_keys, md_table, read_metrics

SECONDS_SUFFIX = "_seconds"  # metrics/<stage>_seconds.json: a stage's timings apart from the metrics others read
# (column, flat keys tried in order): the first number found fills the cell
COLUMNS = (
    ("stage s", ("seconds", "total", "seconds_total", "seconds.total")),
    ("train s", ("train_seconds",)),
    ("encode / predict pairs/s", ("predict_speed.pairs_per_s", "encode.pairs_per_s", "extract.nli.pairs_per_s")),
)


def _first(flat: dict, keys: tuple[str, ...]) -> int | float | None:
    """The first positive number under `keys` (0 pairs/s: everything came from a cache, nothing was timed)."""
    for k in keys:
        v = flat.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return v  # as read: an Infinity is refused where it is formatted, float() would print it as inf
    return None


def timing_rows(metrics: dict[str, dict]) -> dict[str, list[float | None]]:
    """{metrics file stem (a `<stage>_seconds` file under its stage's name): [stage s, train s, pairs/s]}, for the
    files that record any of them."""
    rows: dict[str, list[float | None]] = {}
    for name, m in sorted(metrics.items()):
        flat = flat_keys(m)
        stage = name.removesuffix(SECONDS_SUFFIX)
        cells = [_first(flat, keys) for _, keys in COLUMNS]
        if any(c is not None for c in cells):
            old = rows.get(stage, [None] * len(COLUMNS))
            rows[stage] = [c if c is not None else o for c, o in zip(cells, old)]
    return dict(sorted(rows.items()))


def render_timings(metrics_dir: str | Path = "metrics") -> str:
    rows = timing_rows(read_metrics(metrics_dir))
    if not rows:
        return "No metrics file records a timing.\n"
    lines = [
        "Seconds of each stage's last run (`metrics/<stage>.json`, or `<stage>_seconds.json`) on the machine that ran it, "
        "and the encoders' throughput: machine-dependent, so `medrank report --check` and the drift test do not compare them.",
        "",
    ]
    cells = [[name] + ["—" if v is None else f"{v:.1f}" for v in vals] for name, vals in rows.items()]
    return "\n".join(lines + md_table(["metrics file"] + [c for c, _ in COLUMNS], cells)).rstrip() + "\n"
