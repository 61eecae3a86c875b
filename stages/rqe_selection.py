"""Stage `rqe_selection` (analysis/dvc.yaml): finetune_rqe's question-grouped CV over the Task 2 validation pairs for
every candidate row of `analysis.rqe` (each set of extra sources, cross-encoder and bi-encoder, alone and + validation
pairs, validation pairs only, the zero-shot cosine, the stacks) -> metrics/rqe_selection.json with the rule's choice and
whether `finetune.rqe` trains it. No model is written: the default pipeline's finetune_rqe trains the chosen sets."""

from medrank.runner import run


def main(params_path: str = "params.yaml") -> None:
    from stages.finetune_rqe import main as finetune_rqe

    finetune_rqe(params_path, selection=True)


if __name__ == "__main__":
    run(main)
