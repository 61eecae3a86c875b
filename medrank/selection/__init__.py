"""Evaluation and selection: `metrics` (the official MEDIQA scorer + IR metrics), `experiment` (protocols: CV, LOSO,
Refit, PriorShift), `evaluation` (summaries, candidate systems, the written rule's score), `decision` (keep rules,
orders, ensembles), `final_system` (stage score's pick), `nested` (nested LOSO of that pick; its refits of both models: medrank.models.nested_refits), `acceptance` (the acceptance rule),
`submission` (MEDIQA submission files)."""
