"""The acceptance rule: when a change (a keep rule, a feature group, a model, an MTL weight) may replace what it
challenges (the incumbent).

A new set is a new population: a gain on the mean of the held-out sources that loses on one of them is not a gain.
So a challenger is adopted only when, on the `gain_on` metrics (score.select_on; each difference in units of that
metric's own noise band, the mean of those: "beyond the band" is a mean above 1, so a gain of two bands on one metric
carries a flat other one, and a loss of one band on one cancels a gain of one on the other),
- it gains beyond the band on the worst held-out source (each system's own worst: the minimum over sources), and
- it gains beyond the band at the worst positive rate (the mean over sources of the batches resampled to each
  plausible rate, each keep rule re-run on its batch; for a fixed rule re-weighting gives the same figures), and
- it loses beyond a metric's own band on no source for any `guard` metric (every official one), and
- the validation source (the one labelled sample of the newer CHiQA the test set comes from) does not lose at all on
  the `gain_on` mean.
Otherwise the incumbent stays. The figures are held-out ones (nested or plain LOSO): no test label reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

VALIDATION = "val"
GUARD = ("accuracy", "precision", "mrr", "spearman")  # the official Task 3 metrics: none may lose on any source


@dataclass(frozen=True)
class Figures:
    """What the rule reads of one system: each held-out source's scores, and the mean over sources at the worst rate."""

    by_source: Mapping[str, Mapping[str, float]]  # held-out source -> metric -> value
    worst_prior: Mapping[str, float]  # metric -> the mean over the sources at its worst positive rate

    @classmethod
    def of(cls, summary: Mapping) -> "Figures":
        """From a LOSO summary (`loso_summary`'s "by_source") with its prior band: "resampled" where it was resampled
        (a batch-adaptive rule adapts there), else "shift" (re-weighted), each metric's "worst" (over the rates)."""
        prior = summary.get("resampled") or summary["shift"]
        # a pick's by_source rows carry its choice beside its "scores"; a rule or weight alone's are the scores
        by_source = {s: r.get("scores", r) for s, r in summary["by_source"].items()}
        return cls(
            {s: {m: float(v) for m, v in scores.items()} for s, scores in by_source.items()},
            {m: float(v["worst"]) for m, v in prior.items() if isinstance(v, Mapping) and v.get("worst") is not None},
        )

    def worst_source(self, metric: str) -> float:
        return min(float(s[metric]) for s in self.by_source.values())


def verdict(
    challenger: Figures,
    incumbent: Figures,
    band: Mapping[str, float],
    gain_on: Sequence[str],
    guard: Sequence[str],
) -> dict:
    """{"adopt", "gain": {"worst_source", "worst_prior"}: {metric: challenger - incumbent}, "margin": the same two as
    the gain_on mean in band units, "losses" (each source x guard metric that lost beyond its band, and validation's
    loss), "why" (one line)}."""
    gain = {
        "worst_source": {m: challenger.worst_source(m) - incumbent.worst_source(m) for m in gain_on},
        "worst_prior": {m: challenger.worst_prior[m] - incumbent.worst_prior[m] for m in gain_on},
    }
    unit = {m: max(float(band[m]), 1e-6) for m in gain_on}  # a zero band (one seed): any gain is beyond it
    margin = {k: sum(d[m] / unit[m] for m in gain_on) / len(gain_on) for k, d in gain.items()}
    common = [s for s in incumbent.by_source if s in challenger.by_source]
    losses = [
        f"{s} {m} {d:+.3f}"
        for s in common
        for m in guard
        if (d := float(challenger.by_source[s][m]) - float(incumbent.by_source[s][m])) < -float(band[m]) - 1e-12
    ]
    if VALIDATION in common:
        d = sum(
            (float(challenger.by_source[VALIDATION][m]) - float(incumbent.by_source[VALIDATION][m])) / unit[m]
            for m in gain_on
        )
        if d < -1e-12:
            losses.append(f"{VALIDATION} {'+'.join(gain_on)} {d / len(gain_on):+.2f} bands")
    short = [
        {"worst_source": "worst source", "worst_prior": "worst rate"}[k] for k, g in margin.items() if g <= 1 + 1e-9
    ]
    adopt = not short and not losses
    why = (
        "adopted: gains beyond the band on the worst source and at the worst rate, loses on no source"
        if adopt
        else "; ".join(
            ([f"no gain beyond the band at the {' or '.join(short)}"] if short else [])
            + ([f"loses: {', '.join(losses)}"] if losses else [])
        )
    )
    return {
        "adopt": adopt,
        "gain": {k: {m: round(v, 4) for m, v in d.items()} for k, d in gain.items()},
        "margin": {k: round(v, 2) for k, v in margin.items()},
        "losses": losses,
        "why": why,
    }


def challenge(
    incumbent: str,
    challengers: Mapping[str, Figures],
    band: Mapping[str, float],
    gain_on: Sequence[str],
    guard: Sequence[str],
) -> dict:
    """Each challenger's verdict against `challengers[incumbent]`, and the pick: among the adopted ones, the largest
    margin (the smaller of its two, in band units), ties to the one listed first; none adopted -> the incumbent.
    -> {"incumbent", "pick", "verdicts": {name: verdict}}."""
    base = challengers[incumbent]
    verdicts = {n: verdict(f, base, band, gain_on, guard) for n, f in challengers.items() if n != incumbent}
    adopted = [n for n, v in verdicts.items() if v["adopt"]]
    pick = max(adopted, key=lambda n: min(verdicts[n]["margin"].values()), default=incumbent)
    return {"incumbent": incumbent, "pick": pick, "verdicts": verdicts}
