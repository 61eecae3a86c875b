"""MEDIQA Task 3 features: `features` (answer_table, FeatureBuilder over the groups of medrank.params.groups, the
registry), `answer_scores` (bi-encoder cosines, passage windows, question types, entailed-answer agreement, and the
groups' scorers the served pipeline calls), `retrieval` (the N MedQuAD questions a question entails), `grids` (NLI
sentence-pair grids), `bow` (MedQuAD TF-IDF), `qtype` (the question-type classifier), `rqe_stack` (the RQE stack's
design matrix), `inputs` (the labelled tables a stage reads), `crossfit` (scores cross-fitted over question folds)."""
