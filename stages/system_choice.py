"""Stage `system_choice` (analysis/dvc.yaml): which system the default DAG runs. The written rule
(medrank.selection.final_system.SELECTION_RULE) over every MTL weight of score.mtl_weights (0 = the baseline alone,
1 = the MTL alone, between: averaged probabilities and within-question ranks) x score.keep_rules, then the order, on the
same CV and LOSO rows as stage score -> metrics/system_choice.json (what metrics/task3_val.json held when the default
DAG trained the MTL: every candidate, the MTL's row, the acceptance verdicts) and metrics/task3_val_mtl.json (the MTL's
row). Its pick is `score.system` (`medrank report` says when they differ); it writes no submission and no model."""

from __future__ import annotations

import logging

from medrank.stage.runner import run

log = logging.getLogger("stages.system_choice")


def main(params_path: str = "params.yaml") -> None:
    from medrank.selection import final_system as F
    from medrank.core import layout as L
    from medrank.core.io import write_json
    from medrank.params import load_params

    p = load_params(params_path)
    _, _, metrics = F.decide(p.score, p.seed, p.score.mtl_weights)
    write_json(L.metrics_file("task3_val_mtl"), F.system_rows(metrics)["task3_val_mtl"])
    write_json(L.metrics_file("system_choice"), metrics)
    log.info(
        "system_choice: %s (MTL weight %g), score.system: %s", metrics["system"], metrics["mtl_weight"], p.score.system
    )


if __name__ == "__main__":
    run(main)
