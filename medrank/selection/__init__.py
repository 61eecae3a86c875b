"""Evaluation and selection: `metrics` (the official MEDIQA scorer + IR metrics), `experiment` (protocols: CV, LOSO,
Refit, PriorShift), `evaluation` (summaries, candidate systems, the written rule's score), `decision` (keep rules,
orders, ensembles), `final_system` (stage score's pick), `nested` / `nested_refits` (nested LOSO of that pick),
`submission` (MEDIQA submission files)."""
