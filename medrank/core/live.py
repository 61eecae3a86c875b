"""dvclive at a stage's plots folder: how every stage that logs training curves opens them (plots/<stage>/)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from medrank.core import layout

if TYPE_CHECKING:
    from dvclive import Live


def open_live(folder: str | os.PathLike, knobs: Any = None) -> "Live":
    """A dvclive Live writing `folder` (no dvc.yaml and no experiment of its own: the stage is DVC's), with the params
    section `knobs` logged as its params where given. Use it as a context manager, or hand it to a fit."""
    from dvclive import Live

    live = Live(dir=str(folder), dvcyaml=None, save_dvc_exp=False)
    if knobs is not None:
        live.log_params(knobs.model_dump())
    return live


def stage_live(stage: str, knobs: Any = None) -> "Live":
    """open_live at the stage's plots folder, plots/<stage>/."""
    return open_live(layout.plots_dir(stage), knobs)
