"""MEDIQA Task 3 features: `features` (answer_table, FeatureBuilder), `groups` (the feature-group registry),
`answer_scores` (bi-encoder cosines, passage windows, question types), `retrieval` (the N MedQuAD questions a
question entails), `grids` (NLI sentence-pair grids), `bow` (MedQuAD TF-IDF), `inputs` (the labelled tables a
stage reads), `crossfit` (scores cross-fitted over question folds)."""
