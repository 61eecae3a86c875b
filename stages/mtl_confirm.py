"""Stage `mtl_confirm` (analysis/dvc.yaml): a lever counts only beyond the noise. The default MTL and the rows named in
`analysis.confirm.mtl_rows` (rows of `analysis.mtl.rows`) are re-run under CV and LOSO for `analysis.confirm.seeds`
seeds (the mtl stage's seed and the next ones: folds and initialisation), paired by seed -> metrics/mtl_confirm.json:
each row's score per seed (mean of CV accuracy and LOSO mean accuracy), its mean paired difference to the default, and
`win` when that difference exceeds the band (the sd of the default's score over the seeds)."""

from medrank.runner import run


def main(params_path: str = "params.yaml") -> None:
    from stages.mtl import main as mtl

    mtl(params_path, confirm=True)


if __name__ == "__main__":
    run(main)
