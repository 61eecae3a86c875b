"""README / RESULTS blocks and model cards, rendered from metrics/, dvc.yaml and dvc.lock (`medrank report`).

Layers, each importing only the ones below it: documents (blocks, drift, update) -> headline, results (-> quality,
signals) and cards (-> card_encoders, card_rankers -> card_base) -> formatting.
"""

from medrank.reporting.documents import render_dag, stale_docs, update_docs
from medrank.reporting.headline import render_headline
from medrank.reporting.results import render_results

__all__ = ["render_dag", "render_headline", "render_results", "stale_docs", "update_docs"]
