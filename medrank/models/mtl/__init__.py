"""Multi-task filter + pairwise re-ranker (paper §4.5-4.6, Appendix Tables 7-8), by concept:

- data: MTLData / build_mtl_data - candidates, (candidate, entailed answer) pairs, NLI grids, RQE vectors;
- network: the conv grid encoder, the joint embedding, the filter and pairwise heads, the loss;
- training: fit_mtl (batches of questions, the per-question loss, early stopping on an inner split);
- fitted: FittedMTL / MTLBag (predict, save, load: state dict + JSON, no pickles) and the grid batching;
- setup: what every MTL stage sets up before it fits (threads, device, data, feature builders, the folds' questions);
- fits: FitJob / fit_many (fits side by side on forked workers);
- ensembling: ensembling over the N entailed answers, each fold decided on the other folds' rows;
- system: the MTL as a medrank.selection.experiment system (CV, LOSO, refits), the seed spread, ablation rows, nested rows;
- recipe: the mtl stage's run_recipe (the same protocols plus its train-only and final models).

The knobs are medrank.params.MtlParams (params.yaml `mtl`) throughout: no copies of them.
"""

from medrank.models.mtl.data import PAIR_FEATURES, MTLData, build_mtl_data, check_augmentation, read_mtl_data
from medrank.models.mtl.network import GridEncoder, MaskedBatchNorm2d, MTLNet, mtl_loss, quadrant_pool
from medrank.models.mtl.fits import CVResult, labelled_gids
from medrank.models.mtl.ensembling import decide_folds, ensemble, with_truth
from medrank.models.mtl.recipe import DECISION_FIELDS, PREDICTIONS_SCHEMA, builder_factory, decision_of, run_recipe
from medrank.models.mtl.system import MTLSystem, ablation_cv, held_out_rows, spread_over_seeds
from medrank.models.mtl.training import FittedMTL, MTLBag, fit_mtl, fit_mtl_bag, pair_index, set_seed

__all__ = [
    "DECISION_FIELDS",
    "PAIR_FEATURES",
    "PREDICTIONS_SCHEMA",
    "CVResult",
    "FittedMTL",
    "GridEncoder",
    "MaskedBatchNorm2d",
    "MTLBag",
    "MTLData",
    "MTLNet",
    "MTLSystem",
    "ablation_cv",
    "build_mtl_data",
    "builder_factory",
    "check_augmentation",
    "decide_folds",
    "decision_of",
    "ensemble",
    "fit_mtl",
    "held_out_rows",
    "fit_mtl_bag",
    "labelled_gids",
    "mtl_loss",
    "pair_index",
    "quadrant_pool",
    "read_mtl_data",
    "run_recipe",
    "set_seed",
    "spread_over_seeds",
    "with_truth",
]
