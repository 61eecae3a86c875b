"""Cross-encoder load/fit/predict and model resolution: the one place that loads models."""
