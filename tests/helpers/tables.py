"""Small tables for the tests."""

from __future__ import annotations

import pandas as pd

# MedQuAD-shaped questions: 5 foci x 4 question types in MedQuAD's templates, 6 copies each
MEDQUAD = pd.DataFrame(
    [
        (f, t, q.format(f=f))
        for f in ("asthma", "gout", "acne", "measles", "migraine")
        for t, q in (
            ("treatment", "What are the treatments for {f} ?"),
            ("symptoms", "What are the symptoms of {f} ?"),
            ("causes", "What causes {f} ?"),
            ("information", "What is (are) {f} ?"),
        )
    ]
    * 6,
    columns=["focus", "question_type", "question"],
)
