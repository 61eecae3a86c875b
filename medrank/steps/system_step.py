"""The final system: stage score's decision over the baseline's and / or the MTL's models (models/system.json)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.frame import Composable, Frame
from medrank.params.groups import RETRIEVAL_GROUPS


Fit = Literal["final", "val"]

# the feature groups that read the retrieve step's entailed answers (rqe_i, rqe_emb_i, entailed_text: the registry's
# RETRIEVAL_GROUPS) and those that also read the NLI grids (anli_i): medrank.task3.features.answer_table; the MTL
# network reads both whatever its groups
GRID_GROUPS = frozenset({"anli"})


def read_system(models_dir: str | os.PathLike = layout.MODELS) -> dict:
    """models/system.json (written by stage score): the final system, its MTL weight, keep rules and order."""
    path = Path(models_dir) / layout.SYSTEM.name
    if not path.is_file():
        raise MedrankError(f"{path}: no trained system (run `dvc repro score`)")
    from medrank.core.io import read_sealed_json

    # sealed by stage score: an edited keep value, system or weight is refused here, before any port opens
    system = read_sealed_json(path, "re-run `dvc repro score`, or `dvc checkout score`")
    missing = [k for k in ("system", "mtl_weight", "keep", "order") if k not in system]
    if missing:
        raise MedrankError(f"{path}: not a system file written by stage score (no {', '.join(missing)})")
    try:  # the saved decision, checked here: a doctored file stops with one line, not a traceback per question
        from medrank.selection.decision import ORDERS, Keep
        from medrank.selection.evaluation import system_name

        for fit in ("val", "test"):
            Keep.from_json(system["keep"][fit])
            if "request" in system:
                Keep.from_json(system["request"][fit])
            if "calibration" in system:  # a batch-adaptive pick's calibration rows (final_system.calibration_record)
                cal = system["calibration"][fit]
                sizes = {len(cal[k]) for k in ("gid", "label_true", "prob")}
                if len(sizes) != 1 or not all(isinstance(v, (int, float)) for v in cal["prob"]):
                    raise ValueError(f"calibration.{fit}: gid, label_true and prob of one length, prob numbers")
        if system["order"] not in ORDERS:
            raise ValueError(f"order {system['order']!r}")
        weight = system["mtl_weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
            raise ValueError(f"mtl_weight {weight!r} (a number in [0, 1])")
        expected = system_name(weight)  # the name follows from the weight: either edited alone is refused
        if system["system"] != expected:
            raise ValueError(f"system {system['system']!r} (mtl_weight {weight} makes {expected!r})")
    except (KeyError, TypeError, ValueError) as e:
        raise MedrankError(
            f"{path}: the saved keep rule / order is not one stage score writes ({type(e).__name__}: {e})"
        ) from None
    return system


@dataclass
class SystemStep(Composable):
    """Stage score's decision (models/system.json) over the baseline's and / or the MTL's fitted models."""

    system: dict
    fit: Fit
    baseline: Any | None  # FittedBaseline
    mtl: Any | None  # MTLBag
    mtl_meta: dict | None
    # a keep rule that adapts to its batch is re-fitted on a batch of at least decision.MIN_BATCH_QUESTIONS questions
    # (`medrank rank` over a file of questions); off for the server, whose micro-batches mix callers
    adapt: bool = False

    @property
    def groups(self) -> set[str]:
        return set(self.baseline.builder.groups if self.baseline else ()) | set(
            self.mtl.builder.groups if self.mtl else ()
        )

    @property
    def reads_retrieval(self) -> bool:
        """Whether the decided system reads the retrieve step's output (else that step need not run)."""
        return self.mtl is not None or bool(self.groups & RETRIEVAL_GROUPS)

    @property
    def reads_grids(self) -> bool:
        """Whether the decided system reads the NLI grids (else the grid step need not run)."""
        return self.mtl is not None or bool(self.groups & GRID_GROUPS)

    @property
    def per_question(self) -> bool:
        """Whether each question is decided from its own rows alone (the baseline's EM prior shift reads every row of
        the table: questions ranked together would shift each other)."""
        return self.baseline is None or self.baseline.config.params.prior_shift != "em"

    @classmethod
    def load(
        cls, models_dir: str | os.PathLike = layout.MODELS, fit: Fit = "final", adapt: bool = False
    ) -> "SystemStep":
        from medrank.models.baseline import FittedBaseline
        from medrank.models.mtl import MTLBag

        models_dir = Path(models_dir)
        if fit not in ("final", "val"):
            raise MedrankError(f"fit must be final or val, got {fit!r}")
        system = read_system(models_dir)
        baseline = mtl = meta = None
        if system["system"] in ("baseline", "ensemble"):
            baseline = FittedBaseline.load(models_dir / layout.BASELINE_MODEL.name / f"{fit}.json")
        if system["system"] in ("mtl", "ensemble"):
            mtl_dir = models_dir / layout.MTL_MODEL.name
            mtl, meta = MTLBag.load(mtl_dir / "val" if fit == "val" else mtl_dir)
        return cls(system, fit, baseline, mtl, meta, adapt)

    def transform(self, frame: Frame) -> Frame:
        """The frame with apply_decision's rows (gid, aid, prob, rank_key, label, score) of its answers, read from
        what the steps before added: retrieval (with the retrieve step's N) and grids only where the system reads
        them (reads_retrieval, reads_grids)."""
        if (frame.retrieved is None and self.reads_retrieval) or (frame.grid is None and self.reads_grids):
            raise MedrankError(
                "the decided system reads the retrieve step's entailed answers and the NLI grids: compose "
                "normalize >> retrieve >> grids >> scores >> system (InferencePipeline.load does)"
            )
        answers, retrieved, grid, scores = frame.answers, frame.retrieved, frame.grid, frame.scores
        n_candidates = frame.n_candidates
        from medrank.selection.decision import apply_decision, combine_systems, decide
        from medrank.task3.features import answer_table
        from medrank.models.mtl import build_mtl_data, ensemble

        systems = {}
        if self.mtl is not None:
            from medrank.params import MtlParams

            d = self.mtl_meta["decision"]
            # label shift cannot be re-estimated from one question: EM is skipped here (prior_shift none)
            rule = MtlParams(**{k: d[k] for k in ("ensemble", "rank_by", "threshold", "min_keep")})
            data = build_mtl_data(answers, grid, retrieved, n_candidates=n_candidates, scores=scores)
            dec = decide(ensemble(*self.mtl.predict(data), rule.ensemble), float(d["threshold_used"]), rule)
            systems["mtl"] = dec.assign(prob=dec["prob_mean"])
        if self.baseline is not None:
            anli = None if grid is None else grid[["split", "qid", "aid", "entailed_kind", "entailed_rank", "anli"]]
            table = answer_table(answers, entailed=retrieved, anli=anli, n_candidates=n_candidates, **scores)
            pred = self.baseline.predict(table)
            systems["baseline"] = pred.assign(rank_key=pred["rank_score"])
        # the systems' rows combined at the MTL weight (0 = the baseline's, 1 = the MTL's), kept by the keep rule
        # fitted for this fit's target set, ordered by the order rule
        part = lambda df: df[["gid", "aid", "prob", "rank_key"]].assign(part=self.fit, fold=-1)
        name = self.system["system"]
        if name == "ensemble":
            rows = combine_systems(part(systems["mtl"]), part(systems["baseline"]), float(self.system["mtl_weight"]))
        else:
            rows = part(systems[name])
        keep, how = self.keep_for(rows)
        return frame.with_(decided=apply_decision(rows, keep, self.system["order"]), keep=how)

    def keep_for(self, rows: Any) -> tuple[Any, dict]:
        """The Keep the rows (one batch: gid, prob) are decided by, and how it was chosen ({rule, fitted_on_batch,
        questions}): the pick's own fit for a fixed rule; for one that adapts to its batch, the rule re-fitted on these
        rows when `adapt` and the batch holds at least MIN_BATCH_QUESTIONS questions, else system.json's "request"
        (decision.REQUEST_RULE on the same calibration rows)."""
        import pandas as pd

        from medrank.selection.decision import MIN_BATCH_QUESTIONS, Keep, fit_keep_on

        target = "val" if self.fit == "val" else "test"
        n = int(rows["gid"].nunique())
        rule = self.system.get("keep_rule")
        if "request" not in self.system:  # a fixed rule: its fit is the same for any batch
            return Keep.from_json(self.system["keep"][target]), {"rule": rule, "fitted_on_batch": False, "questions": n}
        if self.adapt and "calibration" in self.system and n >= MIN_BATCH_QUESTIONS:
            cal = pd.DataFrame(self.system["calibration"][target])
            return fit_keep_on(rule, cal, rows), {"rule": rule, "fitted_on_batch": True, "questions": n}
        request = self.system.get("request_rule")
        return Keep.from_json(self.system["request"][target]), {
            "rule": request,
            "fitted_on_batch": False,
            "questions": n,
        }
