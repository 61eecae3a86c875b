from pathlib import Path

import pytest
import yaml

from medrank.errors import MedrankError
from medrank.params import Params, load_params
from tests.conftest import REPO, error_lines, run_module


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_repo_params_are_valid():
    p = load_params(REPO / "params.yaml")
    assert isinstance(p, Params)
    assert p.acquire.mirrors


def test_tiny_profile_keys_exist_in_params():
    """Every key of the smoke profile must be a real params key (else the merge silently adds junk)."""
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    tiny = yaml.safe_load((REPO / "tests/smoke/params_tiny.yaml").read_text())

    def check(t, b, path):
        for k, v in t.items():
            assert k in b, f"{path}{k} not in params.yaml"
            if isinstance(v, dict) and isinstance(b[k], dict):
                check(v, b[k], f"{path}{k}.")

    check(tiny, base, "")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("n_candidates: -1\n", "n_candidates"),
        ("acquire:\n  mirrorz: []\n", "unknown key 'acquire.mirrorz'"),
        ("bogus: 1\n", "unknown key 'bogus'"),
        ("device: tpu\n", "device"),
        ("rqe_threshold: 1.5\n", "rqe_threshold"),
        ("acquire: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "mapping"),
        ("mtl:\n  ablations: [{name: x, alpah: 1}]\n", "ablations[0] (x).alpah: Extra inputs"),
        ("mtl:\n  ablations: [{name: x, alpha: -1}]\n", "ablations[0] (x).alpha"),
        ("mtl:\n  ablations: [{name: x, cv_folds: 3}]\n", "cv_folds cannot vary"),
        ("mtl:\n  ablations: [{alpha: 1}]\n", "ablations[0]: needs a unique non-empty name"),
    ],
)
def test_invalid_params_name_the_key(tmp_path, text, expected):
    with pytest.raises(MedrankError) as e:
        load_params(write(tmp_path, text))
    msg = str(e.value)
    assert expected in msg and "\n" not in msg


def test_mtl_ablation_rows_override_the_section():
    rows = load_params(REPO / "params.yaml").mtl.model_copy(update={"ablations": [{"name": "g", "nli_grid": False, "alpha": 0.5}]}).ablation_rows()
    over, row = rows["g"]
    assert over == {"nli_grid": False, "alpha": 0.5} and row.nli_grid is False and row.alpha == 0.5 and row.ablations == []


def test_stage_exits_2_with_one_line_on_bad_params(tmp_path):
    write(tmp_path, "n_candidates: -1\n")
    r = run_module("stages.acquire", cwd=tmp_path)
    assert r.returncode == 2
    errs = error_lines(r.stderr)
    assert len(errs) == 1 and "n_candidates" in errs[0]
    assert not (tmp_path / "data").exists()
