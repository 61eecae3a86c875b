"""Model infrastructure: resolve/load models, cross-encoder fit/predict, sentence encoder, precision probe and
int8 set-up, batching, the content-addressed cache and cached extraction, dvclive training curves."""
