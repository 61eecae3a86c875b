"""dvc.yaml stays honest: every stage declares its stage module and the medrank package folders its imports reach
(directly or transitively), and medrank/core/layout.py names the same artifacts dvc.yaml declares.

Deps are declared by package folder (medrank/task3, medrank/selection, ...), not as `medrank/` as a whole: a change
to one concern's code re-runs only the stages that import from that package (declaring the whole package would re-run
the whole DAG for any edit), and a new import inside a package the stage already uses needs no dvc.yaml edit.
"""

from __future__ import annotations

from pathlib import Path

import json
import subprocess

import pytest

import yaml

from medrank.core import layout
from tests.conftest import REPO
from tests.helpers.deps import code_deps as _code_deps
from tests.helpers.deps import is_code as _is_code
from tests.helpers.checkout import unmarked_checkout_readers
from tests.helpers.committed import BAND, checked_tree, described
from tests.helpers.deps import needed_files as _needed_files

# every test here reads the checkout's dvc.yaml / params.yaml / dvc.lock: the slow set runs them again in the tiny repo
pytestmark = pytest.mark.checkout

DVC = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))


def _stages() -> dict[str, dict]:
    """Every stage of dvc.yaml and of analysis/dvc.yaml (named analysis/dvc.yaml:<name>, paths relative to the root)."""
    out = {}
    analysis = yaml.safe_load((REPO / "analysis" / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    for name, st in [*DVC["stages"].items(), *((f"analysis/dvc.yaml:{n}", s) for n, s in analysis.items())]:
        if "foreach" in st:
            for key, item in st["foreach"].items():
                text = yaml.safe_dump(st["do"]).replace("${key}", key)
                for k, v in item.items():
                    text = text.replace("${item.%s}" % k, str(v))
                out[f"{name}@{key}"] = yaml.safe_load(text)
        else:
            out[name] = st
    return out


def _paths_in_order(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def _paths(entries) -> set[str]:
    out = set()
    for e in entries or []:
        out.add(next(iter(e)) if isinstance(e, dict) else e)
    return out


@pytest.mark.parametrize("stage", sorted(_stages()))
def test_stage_declares_its_module_and_the_package_folders_it_imports(stage):
    st = _stages()[stage]
    module = st["cmd"].split()[2]  # python -m stages.<name> [args]
    declared = [d for d in _paths_in_order(st.get("deps")) if _is_code(d)]
    wanted = _code_deps(module)
    assert declared == wanted, (
        f"dvc.yaml stage {stage} declares code {declared}, its imports need {wanted} (python -m tests.helpers.deps)"
    )
    covered = {f for f in _needed_files(module) if any(f == d or f.startswith(d + "/") for d in declared)}
    assert covered == _needed_files(module)


def test_python_bytecode_is_outside_the_folder_hashes():
    """A folder dep hashes every file in it: .pyc files (rewritten on each import with a new interpreter) would make
    every stage look changed."""
    for path in ("medrank/core/__pycache__/io.cpython-312.pyc", "medrank/task3/x.pyc"):
        done = subprocess.run(["dvc", "check-ignore", "-q", path], cwd=REPO, capture_output=True)
        assert done.returncode == 0, f".dvcignore does not ignore {path}"


def _layout_paths() -> set[str]:
    from medrank.core import layout

    out = set()
    for name in dir(layout):
        v = getattr(layout, name)
        if isinstance(v, Path):
            out.add(v.as_posix())
        elif isinstance(v, dict):
            out.update(p.as_posix() for p in v.values() if isinstance(p, Path))
    return out


def _declared_paths() -> set[str]:
    out = set()
    for st in _stages().values():
        for key in ("deps", "outs", "metrics"):
            out |= {p for p in _paths(st.get(key)) if not p.endswith(".py") and "${" not in p}
    return out


def test_every_declared_data_path_is_in_the_layout():
    """What dvc.yaml declares (outside medrank/ code and templated names) has its one home in medrank/core/layout.py."""
    layout_paths = _layout_paths()
    missing = sorted(
        p
        for p in _declared_paths()
        if not p.startswith(("medrank/", "stages/", "metrics/", "plots/", "submissions/")) and p not in layout_paths
    )
    assert not missing, f"declared in dvc.yaml but not in medrank/core/layout.py: {missing}"


def test_every_layout_path_is_declared_in_dvc_yaml():
    declared = _declared_paths()
    roots = {
        "data/raw",
        "data/interim",
        "data/processed",
        "models",
        "metrics",
        "plots",
        "submissions",
        "data/interim/cnn",
    }
    missing = sorted(
        p
        for p in _layout_paths() - roots
        if p not in declared and not any(p.startswith(d + "/") or d.startswith(p + "/") for d in declared)
    )
    assert not missing, f"in medrank/core/layout.py but never declared in dvc.yaml: {missing}"


def test_the_steps_have_one_folder_each():
    from medrank.core import layout
    from medrank.params import STEP_PARAMS

    assert set(layout.STEP_DIRS) == set(STEP_PARAMS)


@pytest.mark.parametrize("step", ["normalize", "retrieve", "grids", "answer_scores", "cnn_scores"])
def test_each_inference_step_is_saved_by_a_stage_that_declares_its_params(step):
    """medrank.steps: the stage that saves a step of `medrank rank` declares every params key the step holds and
    declares the step's folder as an output; stage score, which no longer copies them, declares only its own."""
    from medrank.params import STEP_PARAMS, Params, step_params

    stages = {
        **yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"],
        **yaml.safe_load((REPO / "analysis/dvc.yaml").read_text())["stages"],  # retrieve, grids: the MTL's path
    }
    stage, keys = STEP_PARAMS[step]
    declared = set(stages[stage]["params"])
    assert set(keys) <= declared, f"{stage} saves {sorted(set(keys) - declared)} without declaring them"
    assert f"models/steps/{step}" in _paths(stages[stage]["outs"])
    saved = step_params(Params(), step)
    assert "backend" not in saved.get("embed", {}) and "ray" not in saved.get("retrieve", {})  # where, not what
    assert set(stages["score"]["params"]) == {"seed", "cv_folds", "score"}


@pytest.mark.parametrize("stage", ["mtl_ablations", "mtl_confirm"])
def test_mtl_analysis_stages_declare_the_mtl_section(stage):
    """The ablation rows and the confirmation fit mtl's recipe (rows override some keys) and read every mtl key: the
    section is declared whole (the noise band's seeds live in their own section, so they cannot make these stale)."""
    declared = {
        k
        for k in yaml.safe_load((REPO / "analysis/dvc.yaml").read_text())["stages"][stage]["params"]
        if k.split(".")[0] == "mtl"
    }
    assert declared == {"mtl"}


def test_noise_band_is_frozen_and_recorded_for_the_committed_params(tmp_path):
    """Stage noise_band is frozen (experiments reuse the defaults' band); dvc.lock must record it for the params.yaml
    values of every key it declares, so a change of a default without `python -m stages.noise_band && dvc commit -f analysis/dvc.yaml:noise_band`
    fails here instead of selecting with a stale band. Read from HEAD after a user's own `dvc repro` of the committed
    code and params (its data legitimately differs on another CPU kind) that left the band as committed
    (tests/helpers/committed.py); from the working tree after any edit, or once the band is refreshed."""
    root = checked_tree(tmp_path, claims=BAND, lock_stages=("noise_band",))
    refresh = "refresh the band: python -m stages.noise_band && dvc commit -f analysis/dvc.yaml:noise_band" + described(
        root
    )
    # an analysis stage since system_choice picked the baseline (issue 63): `dvc repro` reads its band, never runs it
    stage = yaml.safe_load((root / "analysis/dvc.yaml").read_text())["stages"]["noise_band"]
    assert stage.get("frozen") is True
    params = yaml.safe_load((root / "params.yaml").read_text())
    lock = {
        **yaml.safe_load((root / "dvc.lock").read_text())["stages"],
        **yaml.safe_load((root / "analysis/dvc.lock").read_text())["stages"],
    }
    for key in stage["params"]:
        value = params
        for part in key.split("."):
            value = value[part]
        assert lock["noise_band"]["params"]["params.yaml"][key] == value, (
            f"analysis/dvc.lock records noise_band for another {key}: {refresh}"
        )
    # and on the data the committed defaults read: each data input as the baseline / mtl stage recorded it, or as the
    # stage that wrote it (embed's grids folder)
    seen = {o["path"]: o["md5"] for name in ("retrieve", "embed") for o in lock[name]["outs"]}
    seen |= {d["path"]: d["md5"] for name in ("mtl", "baseline") for d in lock[name]["deps"]}  # the default's last
    data = [d for d in lock["noise_band"]["deps"] if d["path"].startswith("data/")]
    assert data and all(seen[d["path"]] == d["md5"] for d in data), f"noise_band was computed on other data: {refresh}"


def test_rqe_selection_declares_the_finetune_rqe_keys_it_reads():
    """rqe_selection replaces finetune.rqe's row sets (models.rqe_training.SELECTION_OVERRIDES) and reads every other
    key: declared exactly, so a new training knob cannot go undeclared and a default's sets cannot make it stale."""
    from medrank.params import FinetuneRqeParams
    from medrank.models.rqe_training import SELECTION_OVERRIDES

    declared = {
        k
        for k in yaml.safe_load((REPO / "analysis/dvc.yaml").read_text())["stages"]["rqe_selection"]["params"]
        if k.startswith("finetune.")
    }
    assert declared == {f"finetune.rqe.{k}" for k in FinetuneRqeParams.model_fields if k not in SELECTION_OVERRIDES}


def test_metrics_read_by_other_stages_hold_no_timings():
    """A metrics file another stage depends on changes only with its results: a re-run that computes the same numbers
    in another time leaves its readers up to date (the timings are in <stage>_seconds.json beside it)."""

    def keys(d) -> set[str]:
        return {k for k, v in d.items() for k in (k, *keys(v))} if isinstance(d, dict) else set()

    frozen = {  # a frozen stage never re-runs (its refresh is by hand), so its timing cannot move its readers
        m for st in _stages().values() if st.get("frozen") for m in _paths(st.get("metrics")) | _paths(st.get("outs"))
    }
    for dvc_file in ("dvc.yaml", "analysis/dvc.yaml"):
        for name, st in yaml.safe_load((REPO / dvc_file).read_text())["stages"].items():
            for dep in _paths(st.get("deps")) - frozen:
                if dep.startswith("metrics/") and dep.endswith(".json"):
                    timed = {k for k in keys(json.loads((REPO / dep).read_text())) if "second" in k}
                    assert not timed, f"{dvc_file}:{name} reads {dep}, which holds timings {sorted(timed)}"


def test_every_test_reading_the_checkout_is_marked_checkout():
    """After its tiny `dvc repro` the slow set runs only the `checkout` tests inside the tiny repo (data/, models/,
    metrics/ filled; its README refreshed): a test that reads the checkout's own files (REPO / ..., cwd=REPO, a
    relative output path) must carry the marker, or the repro could break it unseen (tests/helpers/checkout.py)."""
    tests = sorted((REPO / "tests").rglob("test_*.py"))
    assert len(tests) > 30
    unmarked = [line for path in tests for line in unmarked_checkout_readers(path)]
    assert not unmarked, "\n".join(unmarked)


def test_a_stage_of_the_analysis_pipeline_is_named_as_dvc_takes_it():
    """Error lines name `dvc repro <target>` (medrank.core.layout.dvc_target): the stages of analysis/dvc.yaml that
    save what `medrank rank` may load are `analysis/dvc.yaml:<stage>`, the default DAG's by their name."""
    analysis = set(yaml.safe_load((REPO / "analysis/dvc.yaml").read_text())["stages"])
    default = set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    assert layout.ANALYSIS_MODEL_STAGES <= analysis and not layout.ANALYSIS_MODEL_STAGES & default
    from medrank.params import STEP_PARAMS

    for step, (stage, _) in STEP_PARAMS.items():
        assert stage in default or stage in layout.ANALYSIS_MODEL_STAGES, (step, stage)
        assert layout.dvc_target(stage) == (stage if stage in default else f"analysis/dvc.yaml:{stage}")
