"""Stage `mtl_ablations` (analysis/dvc.yaml): the MTL ablation rows of `analysis.mtl.rows`, each overriding keys of
the `mtl` section, under the mtl stage's question-grouped CV and leave-one-source-out folds (same data, same seed)
-> metrics/mtl_ablations.json. Off the default pipeline: `dvc exp run` does not wait for ~80 fits it does not need;
`dvc repro analysis/dvc.yaml` refreshes the table."""

from medrank.runner import run


def main(params_path: str = "params.yaml") -> None:
    from stages.mtl import main as mtl

    mtl(params_path, ablations=True)


if __name__ == "__main__":
    run(main)
