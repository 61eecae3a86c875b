"""The acceptance rule (medrank.selection.acceptance): hand-made figures, one clause at a time."""

from __future__ import annotations


from medrank.selection.acceptance import Figures, challenge, verdict

BAND = {"accuracy": 0.01, "mrr": 0.02, "spearman": 0.05}
GAIN_ON, GUARD = ("accuracy", "mrr"), ("accuracy", "mrr", "spearman")


def _fig(acc: dict, mrr: dict | None = None, rho: dict | None = None, prior: tuple = (0.70, 0.70)) -> Figures:
    mrr = mrr or {s: 0.8 for s in acc}
    rho = rho or {s: 0.3 for s in acc}
    return Figures(
        {s: {"accuracy": acc[s], "mrr": mrr[s], "spearman": rho[s]} for s in acc},
        {"accuracy": prior[0], "mrr": prior[1]},
    )


INCUMBENT = _fig({"alexa": 0.80, "liveqa": 0.78, "val": 0.79})


def test_a_gain_on_the_worst_source_and_the_worst_rate_is_adopted():
    # accuracy +0.01 on the worst source (one band), MRR flat: half a band on the mean of the two, not beyond it
    better = _fig({"alexa": 0.82, "liveqa": 0.79, "val": 0.80}, prior=(0.74, 0.70))
    v = verdict(better, INCUMBENT, BAND, GAIN_ON, GUARD)
    assert v["gain"]["worst_source"] == {"accuracy": 0.01, "mrr": 0.0} and v["margin"] == {
        "worst_source": 0.5,
        "worst_prior": 2.0,
    }
    assert not v["adopt"] and v["why"] == "no gain beyond the band at the worst source"
    # +0.03 accuracy (3 bands) and +0.01 MRR (half a band) on the worst source; +0.03, +0.02 at the worst rate
    best = _fig(
        {"alexa": 0.84, "liveqa": 0.81, "val": 0.82},
        mrr={"alexa": 0.81, "liveqa": 0.81, "val": 0.81},
        prior=(0.73, 0.72),
    )
    v = verdict(best, INCUMBENT, BAND, GAIN_ON, GUARD)
    assert v["adopt"] and v["losses"] == [] and v["margin"] == {"worst_source": 1.75, "worst_prior": 2.0}


def test_a_mean_gain_that_loses_one_source_is_no_gain():
    # the mean rises by 0.027 and the worst source too, but Alexa loses 0.03 (beyond accuracy's band 0.01)
    mixed = _fig({"alexa": 0.77, "liveqa": 0.86, "val": 0.82}, prior=(0.78, 0.76))
    v = verdict(mixed, INCUMBENT, BAND, GAIN_ON, GUARD)
    assert not v["adopt"] and v["losses"] == ["alexa accuracy -0.030"]


def test_a_loss_on_a_guarded_metric_it_does_not_select_on_blocks_it():
    rho = {"alexa": 0.3, "liveqa": 0.2, "val": 0.3}  # Spearman: liveqa -0.10, beyond its band 0.05
    v = verdict(
        _fig({"alexa": 0.84, "liveqa": 0.84, "val": 0.82}, rho=rho, prior=(0.8, 0.8)), INCUMBENT, BAND, GAIN_ON, GUARD
    )
    assert not v["adopt"] and v["losses"] == ["liveqa spearman -0.100"]


def test_validation_never_loses_not_even_within_the_band():
    v = verdict(_fig({"alexa": 0.84, "liveqa": 0.84, "val": 0.785}, prior=(0.8, 0.8)), INCUMBENT, BAND, GAIN_ON, GUARD)
    assert not v["adopt"] and v["losses"] == ["val accuracy+mrr -0.25 bands"]


def test_no_gain_at_the_worst_rate_is_no_gain():
    v = verdict(_fig({"alexa": 0.84, "liveqa": 0.84, "val": 0.82}, prior=(0.70, 0.71)), INCUMBENT, BAND, GAIN_ON, GUARD)
    assert not v["adopt"] and "worst rate" in v["why"] and "worst source" not in v["why"]


def test_challenge_keeps_the_incumbent_unless_one_passes_and_takes_the_largest_safe_gain():
    rivals = {
        "incumbent": INCUMBENT,
        "small": _fig({"alexa": 0.84, "liveqa": 0.81, "val": 0.82}, prior=(0.76, 0.74)),  # margins 1.5 / 4
        "large": _fig({"alexa": 0.86, "liveqa": 0.84, "val": 0.84}, prior=(0.76, 0.72)),  # margins 3 / 3.5
        "unsafe": _fig({"alexa": 0.70, "liveqa": 0.90, "val": 0.90}, prior=(0.9, 0.9)),
    }
    got = challenge("incumbent", rivals, BAND, GAIN_ON, GUARD)
    assert got["pick"] == "large" and not got["verdicts"]["unsafe"]["adopt"]
    assert (
        challenge("incumbent", {"incumbent": INCUMBENT, "unsafe": rivals["unsafe"]}, BAND, GAIN_ON, GUARD)["pick"]
        == "incumbent"
    )


def test_figures_of_a_summary_read_the_resampled_band_where_there_is_one():
    summary = {
        "by_source": {"val": {"accuracy": 0.8, "mrr": 0.9}},
        "shift": {"accuracy": {"worst": 0.7}, "mrr": {"worst": 0.6}},
        "resampled": {"accuracy": {"worst": 0.65}, "mrr": {"worst": 0.55}, "draws": 5},
    }
    assert Figures.of(summary).worst_prior == {"accuracy": 0.65, "mrr": 0.55}
    assert Figures.of({k: v for k, v in summary.items() if k != "resampled"}).worst_prior == {
        "accuracy": 0.7,
        "mrr": 0.6,
    }
