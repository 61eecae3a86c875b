"""Task 2 decisions within a CHQ (medrank.task2.rules): the rules on tiny cases, their CV and the nested CV's isolation."""

import numpy as np
import pytest

from medrank.task2 import rules as T
from medrank.core.errors import MedrankError

# three CHQs: a (2 FAQs, one entailed), b (4 FAQs, two entailed), c (1 FAQ, not entailed)
GROUP = np.array(["a", "a", "b", "b", "b", "b", "c"])
PROB = np.array([0.9, 0.8, 0.7, 0.6, 0.2, 0.1, 0.55])
Y = np.array([1, 0, 1, 1, 0, 0, 0])


def test_rules_on_a_tiny_case():
    assert T.ChqRule("threshold_0.5").labels(PROB, GROUP).tolist() == [1, 1, 1, 1, 0, 0, 1]
    assert T.ChqRule("best_only").labels(PROB, GROUP).tolist() == [1, 0, 1, 0, 0, 0, 1]
    assert T.ChqRule("top_half").labels(PROB, GROUP).tolist() == [1, 0, 1, 1, 0, 0, 1]
    # floor 0.6 drops c's lone FAQ; margin 0.5 logits keeps b's second (logit 0.41 vs 0.85) but not a's (1.39 vs 2.20)
    assert T.ChqRule("best_margin", floor=0.6, margin=0.5).labels(PROB, GROUP).tolist() == [1, 0, 1, 1, 0, 0, 0]


def test_best_margin_fit_finds_a_separating_point():
    rule = T.fit_rule("best_margin", Y, PROB, GROUP)
    assert (rule.labels(PROB, GROUP) == Y).all()
    assert 0.55 < rule.floor <= 0.7 and 0.44 <= rule.margin < 0.81
    with pytest.raises(MedrankError, match="task2.rules: unknown rule 'nope'"):
        T.fit_rule("nope", Y, PROB, GROUP)


def _data(seed: int, n_chq: int = 60):
    """CHQs with two FAQs, one entailed, and a model that ranks the pair right but is generous to both."""
    rng = np.random.default_rng(seed)
    group = np.repeat([f"q{i}" for i in range(n_chq)], 2)
    y = np.tile([1, 0], n_chq)
    prob = np.clip(0.7 + 0.15 * y + rng.normal(0, 0.05, 2 * n_chq), 0, 1)
    folds = np.repeat(np.arange(n_chq) % 5, 2)
    return y, prob, group, folds


def test_cv_prefers_the_within_chq_rule_when_the_model_is_generous():
    y, prob, group, folds = _data(0)
    rules = list(T.CHQ_RULES)
    cv = T.cross_validate(rules, y, prob, group, folds)
    assert cv["threshold_0.5"]["accuracy"] == pytest.approx(0.5)  # every pair above 0.5
    assert cv["best_only"]["accuracy"] > 0.95 and cv["best_only"]["positive_rate"] == pytest.approx(0.5)
    assert T.choose(cv, rules) == "best_only"  # ties with top_half / best_margin keep the simpler, listed first
    assert set(cv["best_only"]["oof"]) <= {0, 1} and len(cv["best_only"]["oof"]) == len(y)


def test_nested_cv_never_reads_the_held_out_folds_labels():
    y, prob, group, folds = _data(1)
    rules = list(T.CHQ_RULES)
    base = T.nested_cv(rules, y, prob, group, folds)
    # flip every label of fold 0: the rules chosen for the other outer folds may move (fold 0 is in their inner data),
    # but the choice made for outer fold 0 must not, since it is made on folds 1-4 only
    flipped = np.where(folds == 0, 1 - y, y)
    again = T.nested_cv(rules, flipped, prob, group, folds)
    assert again["chosen"][0] == base["chosen"][0]
    assert again["accuracy_folds"][0] == pytest.approx(1 - base["accuracy_folds"][0])
    # and the outer fold's score is the chosen rule fitted on the other folds, applied to it
    inner = folds != 0
    fitted = T.fit_rule(base["chosen"][0], y[inner], prob[inner], group[inner])
    assert base["accuracy_folds"][0] == pytest.approx(np.mean(fitted.labels(prob[~inner], group[~inner]) == y[~inner]))
