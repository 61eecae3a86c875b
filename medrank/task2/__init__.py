"""MEDIQA Task 2 (question entailment): `rules` (the within-CHQ decision rules over P(entailed), chosen by CHQ-grouped
CV)."""
