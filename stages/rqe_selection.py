"""Stage `rqe_selection` (analysis/dvc.yaml): finetune_rqe's question-grouped CV over the Task 2 validation pairs for
every candidate row of `analysis.rqe` (each set of extra sources, cross-encoder and bi-encoder, alone and + validation
pairs, validation pairs only, the zero-shot cosine, the stacks) -> metrics/rqe_selection.json with the rule's choice and
whether `finetune.rqe` trains it. No model is written: the default pipeline's finetune_rqe trains the chosen sets."""

from __future__ import annotations

from medrank.stage.runner import run


def main(params_path: str = "params.yaml") -> None:
    from medrank.core import layout
    from medrank.core.io import write_json
    from medrank.core.live import stage_live
    from medrank.models import rqe_training as R
    from medrank.params import load_params

    p = load_params(params_path)
    tp = R.selection_params(p)
    inputs = R.read_inputs(p, tp)
    with stage_live("rqe_selection", tp) as live:
        trainer = R.Trainer(p, tp, inputs.data, live)
        sel = trainer.select(inputs)
        live.log_metric("cv/accuracy", sel.rows[sel.chosen]["accuracy"], plot=False)
    write_json(layout.metrics_file("rqe_selection"), R.selection_metrics(sel, inputs.data, trainer.seconds))


if __name__ == "__main__":
    run(main)
