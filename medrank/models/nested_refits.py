"""What stage nested_loso refits (medrank.selection.nested holds the protocol): the default recipes and the rows of
`analysis.nested.variants`, both models' held-out rows per held-out source (memoised: rows that differ in `select_on`
only share their fits), the keep-rule pick on the nested figures, and the metrics file's content."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import pandas as pd

from medrank.core import layout as L
from medrank.params.groups import STACKED_GROUPS
from medrank.selection import acceptance as A
from medrank.selection import nested
from medrank.selection.resampling import Resampling

Recipe = tuple  # (the baseline section, the mtl section, select_on) of one row


def recipes(p) -> dict[str, Recipe]:
    """The default ("default") and each variant of analysis.nested.variants (its overrides over the defaults)."""
    from medrank.params import nested_recipes

    variants = p.analysis.nested.variants
    out = {"default": (p.baseline, p.mtl, list(p.score.select_on))}
    for v, (bp, mp) in zip(variants, nested_recipes(p.baseline, p.mtl, variants).values()):
        out[v.name] = (bp, mp, list(v.select_on or p.score.select_on))
    return out


def noise_band() -> dict[str, float]:
    """The rule's tolerance as stage score reads it (final_system.noise_band), for every metric a row may select on."""
    from medrank.selection.final_system import noise_band as read_band

    return read_band(("accuracy", *nested.METRICS[:4], "order"))


@dataclass
class Refits:
    """Both models' held-out rows for a held-out source, fitted on the other sources, by recipe."""

    p: object
    groups: set[str]
    judged: bool = False  # a recipe trains on the judged LiveQA answers (baseline.judged_rows)
    fits: dict[tuple, pd.DataFrame] = field(default_factory=dict)
    stack_seconds: float = 0.0  # spent in the stacked group's baseline fits (its price beside the MTL's own)

    def __post_init__(self) -> None:
        import torch

        from medrank.encoders.hardware import resolve_device
        from medrank.task3.bow import medquad_tfidf
        from medrank.task3.features import answer_table
        from medrank.task3.inputs import load_tables
        from medrank.models import mtl

        p = self.p
        if p.mtl.threads:
            torch.set_num_threads(p.mtl.threads)
        self.device = resolve_device(p.device)
        answers, self.data = mtl.read_mtl_data(p, self.groups)
        self.tfidf_mtl = medquad_tfidf(p.mtl.tfidf_max_features) if "bow" in self.groups else None
        # with the judged answers their questions' question-relative features differ: a table each
        tables = {judged: load_tables(p, self.groups, judged) for judged in sorted({False, self.judged})}
        self.labelled = {judged: t[1] for judged, t in tables.items()}
        self.tfidf = tables[False][5]
        cand = answer_table(answers)
        self.cand = cand[cand["split"].isin(L.LABELLED_SPLITS)].reset_index(drop=True)

    def _memo(self, key: tuple, make_rows) -> pd.DataFrame:
        if key not in self.fits:
            self.fits[key] = make_rows()
        return self.fits[key]

    def _timed_stack(self, labelled: pd.DataFrame, cfg_b, train, test) -> pd.DataFrame:
        from medrank.models import baseline_protocols as BP

        t0 = time.perf_counter()
        try:
            return BP.stacked_scores(labelled, cfg_b, self.tfidf, train, test)
        finally:
            self.stack_seconds += time.perf_counter() - t0

    def systems(self, bp, mp) -> tuple[nested.RowsFn, nested.RowsFn]:
        """(MTL rows, baseline rows) functions of one recipe (its baseline and mtl sections) for nested.nested_loso."""
        from medrank.encoders.runtime import deterministic_torch, fixed_blas_threads
        from medrank.models import baseline as B
        from medrank.models import baseline_protocols as BP
        from medrank.models import mtl

        p = self.p
        make = mtl.builder_factory(mp.feature_groups, p.n_candidates, self.tfidf_mtl)
        cfg_b = B.BaselineConfig(bp, tuple(bp.features), p.n_candidates, p.seed)
        labelled = self.labelled[bp.judged_rows != "none"]
        # the MTL fed this recipe's baseline scores (group stacked): each MTL fit's own cross-fitted baseline
        stacked = bool(set(mp.feature_groups) & set(STACKED_GROUPS))
        stack = partial(self._timed_stack, labelled, cfg_b) if stacked else None
        mtl_key = (mp.model_dump_json(), bp.model_dump_json() if stacked else None)

        def mtl_rows(inner, inner_sources, outer):
            def fit() -> pd.DataFrame:
                with deterministic_torch(), fixed_blas_threads():
                    return mtl.held_out_rows(
                        self.data,
                        inner,
                        inner_sources,
                        outer,
                        mp,
                        make,
                        seed=p.seed,
                        device=self.device,
                        workers=mp.workers,
                        stack=stack,
                    )

            return self._memo(("mtl", *mtl_key, tuple(outer)), fit)

        def base_rows(inner, inner_sources, outer):
            key = ("baseline", bp.model_dump_json(), tuple(outer))
            return self._memo(key, lambda: BP.held_out_rows(labelled, cfg_b, self.tfidf, inner, inner_sources, outer))

        return mtl_rows, base_rows


def resampling(p) -> Resampling | None:
    """analysis.nested.resample as the protocol (seeded by the top-level seed); None with 0 draws."""
    r = p.analysis.nested.resample
    return Resampling(tuple(float(x) for x in r.priors), r.draws, p.seed) if r.draws else None


def run_all(p, recipes_: dict[str, Recipe], band: dict, log) -> tuple[dict, dict, Refits]:
    """nested.nested_loso of every recipe (per-rule figures for the default); (results, seconds, the refits)."""
    groups = set().union(*(set(bp.features) | set(mp.feature_groups) for bp, mp, _ in recipes_.values()))
    refits = Refits(p, groups, judged=any(bp.judged_rows != "none" for bp, _, _ in recipes_.values()))
    sp = p.score
    results, seconds = {}, {}
    for name, (bp, mp, select_on) in recipes_.items():
        ts = time.perf_counter()
        sel = nested.Selection(
            tuple(sp.mtl_weights), tuple(sp.keep_rules), tuple(sp.orders), band, tuple(select_on), sp.select_under
        )
        mtl_rows, base_rows = refits.systems(bp, mp)
        per_rule = p.analysis.nested.keep_rules if name == "default" else ()
        # each MTL weight alone, where the MTL differs from the default's (0: the baseline, 1: the MTL, same folds)
        per_weight = sp.mtl_weights if name == "default" or mp != p.mtl else ()
        # resampled priors for every pick, the default's keep rules and weights alone (draws x priors keep-rule runs
        # each): what the acceptance rule reads at the worst rate
        resample = resampling(p)
        results[name] = nested.nested_loso(
            L.LABELLED_SPLITS,
            refits.cand,
            mtl_rows,
            base_rows,
            sel,
            per_rule=per_rule,
            per_weight=per_weight,
            resample=resample,
        )
        seconds[name] = round(time.perf_counter() - ts, 1)
        r = results[name]
        log.info(
            "nested LOSO %s: accuracy %.3f (worst %.3f), MRR %.3f (%.0fs)",
            name,
            r["accuracy"]["mean"],
            r["accuracy"]["worst"],
            r["mrr"]["mean"],
            seconds[name],
        )
    if refits.stack_seconds:
        seconds["stacked_baseline_fits"] = round(refits.stack_seconds, 1)
    return results, seconds, refits


def keep_rule_pick(by_rule: dict, band: dict, select_on: list[str], incumbent: str) -> dict:
    """The keep rule for a new prior (what score.keep_rules holds: RESULTS), on the nested figures of each rule alone:
    the acceptance rule (medrank.selection.acceptance) of every rule against `incumbent` (score.keep_rules' first, the
    default): one adopted only when it gains beyond the band on the worst held-out source and at the worst resampled
    rate and loses on no source. -> acceptance.challenge's {"incumbent", "pick", "verdicts"}."""
    if incumbent not in by_rule:  # analysis.nested.keep_rules lacks the default's rule: nothing to challenge
        return {"incumbent": incumbent, "pick": None, "verdicts": {}}
    figures = {r: A.Figures.of(v) for r, v in by_rule.items()}
    return A.challenge(incumbent, figures, band, select_on, A.GUARD)


def _simpler(variant: Recipe, default: Recipe) -> bool:
    """Whether a variant's recipe uses a subset of the default's feature groups (it removes a group): then the default
    is the challenger (its group must earn its place), else the variant is."""
    (vb, vm, _), (db, dm, _) = variant, default
    mine, theirs = (set(vb.features), set(vm.feature_groups)), (set(db.features), set(dm.feature_groups))
    return mine[0] <= theirs[0] and mine[1] <= theirs[1] and mine != theirs


def variant_verdict(name: str, results: dict, recipes_: dict[str, Recipe], band: dict, select_on: list[str]) -> dict:
    """The acceptance rule between a variant and the default, both nested: the simpler recipe is the incumbent.
    -> {"incumbent" ("default" or the variant), "verdict", "default_stands"}."""
    mine, theirs = A.Figures.of(results[name]), A.Figures.of(results["default"])
    if _simpler(recipes_[name], recipes_["default"]):
        v = A.verdict(theirs, mine, band, select_on, A.GUARD)
        return {"incumbent": name, "verdict": v, "default_stands": v["adopt"]}
    v = A.verdict(mine, theirs, band, select_on, A.GUARD)
    return {"incumbent": "default", "verdict": v, "default_stands": not v["adopt"]}


def mtl_verdict(by_weight: dict, band: dict, select_on: list[str]) -> dict | None:
    """The MTL alone (weight 1) challenging the baseline alone (weight 0) on the same folds, nested."""
    if not {"0.0", "1.0"} <= set(by_weight):
        return None
    return A.verdict(A.Figures.of(by_weight["1.0"]), A.Figures.of(by_weight["0.0"]), band, select_on, A.GUARD)


def report(p, recipes_: dict[str, Recipe], results: dict, band: dict, final: dict) -> dict:
    """metrics/nested_loso.json (timings aside): the final system's nested and plain LOSO, the variants beside it, the
    keep-rule pick, the selection grid and the recipes."""
    result = results["default"]
    plain = final["systems"]["final"]["loso"]
    overrides = {v.name: (dict(v.baseline), dict(v.mtl)) for v in p.analysis.nested.variants}
    sp = p.score
    return {
        "final_system": {
            "nested_loso": result,
            "plain_loso": {m: plain[m] for m in nested.METRICS},
            "overstatement": nested.overstatement(plain, result),
        },
        "variants": {
            n: {
                "baseline": overrides[n][0],
                "mtl": overrides[n][1],
                "select_on": recipes_[n][2],
                "nested_loso": {m: r[m] for m in (*nested.METRICS, "shift", "resampled", "by_weight") if m in r},
                "by_source": {s: v["scores"] for s, v in r["by_source"].items()},
                "picks": {s: v["chosen"] for s, v in r["by_source"].items()},
                "vs_default": {m: round(float(r[m]["mean"]) - float(result[m]["mean"]), 4) for m in nested.METRICS},
                "acceptance": variant_verdict(n, results, recipes_, band, list(recipes_["default"][2])),
            }
            for n, r in results.items()
            if n != "default"
        },
        "keep_rule_pick": {
            **(
                {}
                if not result["by_keep_rule"]
                else keep_rule_pick(result["by_keep_rule"], band, list(sp.select_on), sp.keep_rules[0])
            ),
            "on": "the acceptance rule (medrank.selection.acceptance) on nested LOSO of each keep rule alone, against "
            "score.keep_rules' first: adopted only when the mean of score.select_on, in noise-band units, gains beyond 1 "
            "band on the worst held-out source and at the worst resampled rate (0.2-0.65), and no official metric loses "
            "beyond its band on any source (validation: not at all)",
            "score_keep_rules": list(sp.keep_rules),
        },
        "mtl_vs_baseline": mtl_verdict(result["by_weight"], band, list(sp.select_on)),
        "selection": {
            "weights": list(sp.mtl_weights),
            "keep_rules": list(sp.keep_rules),
            "orders": list(sp.orders),
            "noise_band": band,
            "rule": final["selection"]["rule"],
        },
        "recipes": {
            "baseline_features": list(p.baseline.features),
            "mtl_feature_groups": list(p.mtl.feature_groups),
            "select_on": list(sp.select_on),
        },
    }
