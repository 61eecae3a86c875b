"""MEDIQA Task 2 (question entailment): `decisions` (the within-CHQ rules over P(entailed), chosen by CHQ-grouped
CV)."""
