"""`medrank rank`: input validation, and the whole trained pipeline (normalize → retrieve → embed → final system)
on fixture input with tiny random models (the real pipeline's equality with its validation submission is
checked by the smoke `dvc repro`, tests/pipeline/test_pipeline_smoke.py)."""

from __future__ import annotations

import io
import json
import sys
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO, error_lines, run_module
from medrank.core.errors import MedrankError
from medrank.core.io import RECORD_SHA256, write_sealed_json
from medrank.serving.rank import parse_rank_input
from tests.helpers.tiny_project import FIXTURES, build_tiny_project, fake_training_data, tiny_mtl


pytestmark = pytest.mark.usefixtures("one_thread")  # the 2 cores are shared


# ---------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    "raw, message",
    [
        ("", "empty input"),
        ("{", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"answers": []}', "'question' must be a non-empty string"),
        ('{"question": "  ", "answers": []}', "'question' must be a non-empty string"),
        ('{"question": "q"}', "'answers' must be a list"),
        ('{"question": "q", "answers": {"text": "a"}}', "'answers' must be a list"),
        ('{"question": "q", "answers": ["a"]}', r"answers\[0\]: expected an object"),
        ('{"question": "q", "answers": [{"id": "x"}]}', r"answers\[0\]: 'text' must be a non-empty string"),
        ('{"question": "q", "answers": [{"text": 5}]}', "'text' must be a non-empty string"),
        (
            '{"question": "q", "answers": [{"text": " \\n"}]}',
            "'text' must be a non-empty string",
        ),  # empty text was scored
        ('{"question": "q", "question": "r", "answers": []}', "duplicate key 'question' in a JSON object"),
        ('{"question": "q", "answers": [{"text": "a", "text": "b"}]}', "duplicate key 'text'"),
        ('{"question": "q", "answers": [{"text": "a", "id": 1' + "0" * 5000 + "}]}", "an integer of 5001 digits"),
        ('{"question": "q", "answers": [{"text": "a", "id": true}]}', "'id' must be"),
        (
            '{"question": "q", "answers": [{"text": "a", "id": "x"}, {"text": "b", "id": "x"}]}',
            r"answers\[1\]: duplicate id 'x'",
        ),
        ('{"question": "q", "answers": [{"text": "a", "url": 3}]}', "'url' must be a string"),
        ('{"question": "q", "answers": [{"text": "a", "score": 1}]}', "unknown key"),
        ('{"question": "q", "answers": [], "extra": 1}', "unknown key"),
        # a lone surrogate escape decodes to a str no UTF-8 writer takes (was a pyarrow traceback; issue 46 #7)
        (
            '{"question": "q\\ud800", "answers": []}',
            r"in.json: 'question' holds a lone surrogate \(\\ud800 at character 1\)",
        ),
        ('{"question": "q", "answers": [{"text": "a\\udfff"}]}', r"answers\[0\]: 'text' holds a lone surrogate"),
        (
            '{"question": "q", "answers": [{"id": "\\ud800", "text": "a"}]}',
            r"answers\[0\]: 'id' holds a lone surrogate",
        ),
        (
            '{"question": "q", "answers": [{"text": "a", "url": "\\ud800"}]}',
            r"answers\[0\]: 'url' holds a lone surrogate",
        ),
    ],
)
def test_malformed_input_is_one_clear_error(raw, message):
    with pytest.raises(MedrankError, match=message):
        parse_rank_input(raw, "in.json")


def test_non_utf8_and_deep_nesting_are_clear_errors():
    with pytest.raises(MedrankError, match="not UTF-8"):
        parse_rank_input(b'{"question": "\xff"}', "in.json")
    with pytest.raises(MedrankError, match="nested too deeply|not valid JSON"):
        parse_rank_input("[" * 100000, "in.json")


def test_oversized_input_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from medrank.serving import rank

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(rank.MAX_INPUT_BYTES + 1)
    with pytest.raises(MedrankError, match="more than a rank input can be"):
        rank.read_rank_input(str(big))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b" " * (rank.MAX_INPUT_BYTES + 1))))
    with pytest.raises(MedrankError, match="<stdin>: more than 16 MiB"):
        rank.read_rank_input("-")


def test_ids_default_to_positions_and_are_strings():
    inp = parse_rank_input((FIXTURES / "rank_input.json").read_text())
    assert [a.id for a in inp.answers] == ["A1", "A2", "3", "4"]
    assert inp.answers[2].url == "" and inp.answers[3].text == "See a doctor about growth."


def test_cli_malformed_input_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"question": "q", "answers": [{"text": 1}]}')
    r = run_module("medrank.cli", "rank", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    assert error_lines(r.stderr) == [f"error: {bad}: answers[0]: 'text' must be a non-empty string"]
    r = run_module("medrank.cli", "rank", str(tmp_path / "missing.json"), cwd=tmp_path)
    assert r.returncode == 2 and error_lines(r.stderr) == [f"error: {tmp_path / 'missing.json'}: input file not found"]


def test_a_paired_surrogate_is_text():
    assert (
        parse_rank_input('{"question": "q", "answers": [{"id": "\\ud83d\\ude00", "text": "a"}]}').answers[0].id
        == "\U0001f600"
    )


def test_cli_lone_surrogate_id_is_one_error_line(tmp_path, monkeypatch, capsys):
    from medrank.cli import main

    (tmp_path / "in.json").write_text('{"question": "q", "answers": [{"id": "\\ud800", "text": "a"}]}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["rank", "in.json"])
    assert e.value.code == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: in.json: answers[0]: 'id' holds a lone surrogate (\\ud800 at character 0): not Unicode text"
    ]


def test_rank_reads_a_pipe_as_score_does(tmp_path, monkeypatch, capsys):
    """`medrank rank <(cat in.json)` said "input file not found" (`medrank score` reads pipes); a folder is named."""
    import os

    from medrank.cli import main

    monkeypatch.chdir(tmp_path)  # no params, no models here
    r, w = os.pipe()
    os.write(w, b'{"question": "Is it inherited?", "answers": []}')
    os.close(w)
    try:
        assert main(["rank", f"/dev/fd/{r}"]) == 0
    finally:
        os.close(r)
    assert json.loads(capsys.readouterr().out)["question"] == "Is it inherited?"
    with pytest.raises(SystemExit):
        main(["rank", str(tmp_path)])
    assert error_lines(capsys.readouterr().err) == [f"error: {tmp_path}: a folder, not an input file"]


def test_empty_answer_list_needs_no_model(tmp_path, monkeypatch, capsys):
    from medrank.cli import main

    (tmp_path / "in.json").write_text('{"question": "Is it inherited?", "answers": []}')
    monkeypatch.chdir(tmp_path)  # no params, no models here
    assert main(["rank", "in.json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"question": "Is it inherited?", "n_answers": 0, "n_kept": 0, "answers": []}


# ---------------------------------------------------------------- the trained pipeline, tiny models


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A project folder with params.yaml, tiny NLI/RQE cross-encoders, a MedQuAD table and a trained MTL model."""
    return build_tiny_project(tmp_path_factory.mktemp("rank"))


def _rank(workdir: Path, monkeypatch, capsys, *args: str) -> str:
    from medrank.cli import main

    monkeypatch.chdir(workdir)
    assert main(["rank", *args]) == 0
    return capsys.readouterr().out


def test_rank_fixture_input_json(workdir, monkeypatch, capsys):
    out = json.loads(_rank(workdir, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    assert out["n_answers"] == 4 and [a["id"] for a in out["answers"]].count("A1") == 1
    assert sorted(a["id"] for a in out["answers"]) == ["3", "4", "A1", "A2"]
    kept = [a for a in out["answers"] if a["kept"]]
    assert out["n_kept"] == len(kept) and out["answers"][: len(kept)] == kept  # kept first
    assert [a["rank"] for a in kept] == list(range(1, len(kept) + 1))
    assert all(a["filter_score"] >= 0.5 for a in kept) and all(
        a["filter_score"] < 0.5 for a in out["answers"][len(kept) :]
    )
    assert [a["rank_score"] for a in kept] == sorted((a["rank_score"] for a in kept), reverse=True)
    # deterministic: the same input gives the same output
    again = json.loads(_rank(workdir, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    assert again == out
    # without --all only the kept answers are printed
    only = json.loads(_rank(workdir, monkeypatch, capsys, str(FIXTURES / "rank_input.json")))
    assert only["answers"] == kept


def test_rank_needs_only_the_models_folder(workdir, monkeypatch, capsys, tmp_path):
    """models/ copied alone elsewhere, run from an empty folder: the same answers and order (no params.yaml, no data/);
    a missing step is one line naming the stage that saves it."""
    from medrank.cli import main

    want = json.loads(_rank(workdir, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    shutil.copytree(workdir / "models", tmp_path / "only" / "models")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    assert (
        main(["rank", str(FIXTURES / "rank_input.json"), "--all", "--models", str(tmp_path / "only" / "models")]) == 0
    )
    assert json.loads(capsys.readouterr().out) == want
    shutil.rmtree(tmp_path / "only" / "models" / "steps" / "retrieve")
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(tmp_path / "only" / "models")])
    lines = error_lines(capsys.readouterr().err)
    assert (
        e.value.code == 2
        and len(lines) == 1
        and "the retrieve step is missing (run `dvc repro analysis/dvc.yaml:retrieve`)" in lines[0]
    )


def test_rank_stdin_and_table(workdir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", type("S", (), {"buffer": open(FIXTURES / "rank_input.json", "rb")})())
    out = _rank(workdir, monkeypatch, capsys, "--format", "table", "--all")
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["rank", "id", "filter"] and lines[-1].endswith("answers kept")
    assert len(lines) == 1 + 4 + 1


@pytest.mark.parametrize(
    "field, size, message",
    [
        ("question", 10_001, "'question' has 10001 characters; at most 10000"),
        ("answer", 100_001, r"answers\[0\]: 'text' has 100001 characters; at most 100000"),
        ("total", 11 * 99_000, "1089001 characters of question and answers; at most 1000000 per call"),
    ],
)
def test_the_work_is_bounded_before_any_model_loads(field, size, message):
    """A 15 MB question took 405 s and 6.8 GB; 1,000 answers 229 s: text is capped, each part and the whole."""
    q = "q" * size if field == "question" else "q"
    answers = (
        [{"text": "a" * size}]
        if field == "answer"
        else [{"text": "a" * 99_000} for _ in range(11)]
        if field == "total"
        else []
    )
    with pytest.raises(MedrankError, match=message):
        parse_rank_input(json.dumps({"question": q, "answers": answers}), "in.json")
    with pytest.raises(MedrankError, match="101 answers; at most 100 per question"):
        parse_rank_input(json.dumps({"question": "q", "answers": [{"text": "a"}] * 101}), "in.json")


def test_table_output_escapes_control_characters():
    """ids and URLs come from the input: ESC / OSC / CR / NUL printed raw can rewrite what a terminal shows."""
    from medrank.cli import format_result

    result = pd.DataFrame(
        {
            "id": ["a\x1b[2J\rb"],
            "url": ["http://x\x1b]8;;http://evil\x07\x00"],
            "kept": [True],
            "rank": [1.0],
            "prob": [0.9],
            "rank_score": [1.0],
        }
    )
    out = format_result("q", result, "table")
    assert "\x1b" not in out and "\r" not in out and "\x00" not in out and "\x07" not in out
    assert "a\\x1b[2J\\rb" in out and "http://x\\x1b]8;;http://evil\\x07\\x00" in out


def test_missing_model_is_a_clear_error(workdir, monkeypatch, capsys):
    from medrank.cli import main

    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", "models/none"])
    assert e.value.code == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: models/none/system.json: no trained system (run `dvc repro score`)"
    ]


def _resealed_doctored_system(workdir: Path, tmp_path: Path, doctor) -> Path:
    """A copy of the project's models whose system.json is `doctor`ed and sealed again: the checks past the seal
    must refuse it."""
    root = tmp_path / "proj"
    shutil.copytree(workdir / "models", root / "models")
    system = json.loads((root / "models" / "system.json").read_text())
    doctor(system)
    system.pop(RECORD_SHA256)
    write_sealed_json(root / "models" / "system.json", system)
    return root


@pytest.mark.parametrize(
    "doctor",
    [
        lambda s: s["keep"].pop("test"),
        lambda s: s["keep"]["val"].update(kind="median"),
        lambda s: s.update(order="random"),
        lambda s: s["keep"]["val"].update(value="high"),
    ],
)
def test_doctored_decision_is_a_clear_error(workdir, monkeypatch, capsys, tmp_path, doctor):
    from medrank.cli import main

    root = _resealed_doctored_system(workdir, tmp_path, doctor)
    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(root / "models")])
    lines = error_lines(capsys.readouterr().err)
    assert (
        e.value.code == 2
        and len(lines) == 1
        and "the saved keep rule / order is not one stage score writes" in lines[0]
    )


def test_a_batch_adaptive_pick_serves_each_request_by_the_fixed_request_rule(workdir, monkeypatch, capsys, tmp_path):
    """A pick that adapts to its batch (em_guarded) fitted keep.test on the test batch: a request is decided by
    system.json's "request" fit (decision.REQUEST_RULE on the same calibration rows), never by that batch's fit."""
    from medrank.cli import main

    def adaptive(request_value: float):
        def doctor(s: dict) -> None:
            s.update(keep_rule="em_guarded", request_rule="min_keep_1")
            s["keep"]["test"] = {"kind": "threshold", "value": 0.0, "min_keep": 0, "target_prior": 0.9}  # keeps all
            s["request"] = {
                f: {"kind": "threshold", "value": request_value, "min_keep": 1, "target_prior": None}
                for f in ("val", "test")
            }

        return doctor

    monkeypatch.chdir(workdir)
    for value, kept in ((0.999999, 1), (0.0, 4)):  # min_keep 1 above every probability: one answer; 0: all four
        root = _resealed_doctored_system(workdir, tmp_path / str(kept), adaptive(value))
        assert main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(root / "models")]) == 0
        assert json.loads(capsys.readouterr().out)["n_kept"] == kept


def test_the_system_record_of_a_batch_adaptive_pick_carries_the_request_rules_fits():
    from medrank.selection.decision import fit_keep_on
    from medrank.selection.final_system import system_record

    rng = np.random.default_rng(3)
    n = 60
    decided = pd.DataFrame(
        {
            "part": "oof",
            "gid": [f"q{i // 5}" for i in range(n)],
            "split": np.where(np.arange(n) < 40, "train_liveqa", "val"),
            "label_true": (rng.random(n) < 0.4).astype(int),
        }
    )
    decided["prob"] = np.clip(0.3 + 0.4 * decided["label_true"] + 0.2 * rng.normal(size=n), 0, 1)
    sel = {"weight": 0.0, "fits": {"val": {}, "test": {}}, "rule": "em_guarded", "order": "rank", "decided": decided}
    got = system_record(sel)
    train = decided[decided["split"] == "train_liveqa"]
    assert got["request_rule"] == "min_keep_1"
    assert got["request"] == {
        "val": fit_keep_on("min_keep_1", train, train).to_json(),
        "test": fit_keep_on("min_keep_1", decided, decided).to_json(),
    }
    assert "request" not in system_record({**sel, "rule": "platt"})  # a fixed rule's fit serves any request


@pytest.mark.parametrize("command", ["rank", "serve"])
@pytest.mark.parametrize(
    "doctor, says",
    [
        (lambda s: s.update(system="bogus"), "system 'bogus'"),
        (lambda s: s.update(system="baseline"), "system 'baseline' (mtl_weight 1.0 makes 'mtl')"),  # edited alone
        (lambda s: s.update(mtl_weight=1.5), "mtl_weight 1.5"),
        (lambda s: s.update(mtl_weight="0"), "mtl_weight '0'"),
    ],
)
def test_a_doctored_system_is_one_line_before_any_port_opens(
    workdir, monkeypatch, capsys, tmp_path, doctor, says, command
):
    """Issue 64: `"system": "bogus"` was a KeyError traceback in `medrank rank`; `medrank serve` opened its port,
    logged the traceback at warm-up and stayed up, never ready."""
    from medrank.cli import main

    root = _resealed_doctored_system(workdir, tmp_path, doctor)
    monkeypatch.chdir(workdir)
    if command == "serve":
        import uvicorn

        monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("serve opened its port"))
    args = [str(FIXTURES / "rank_input.json")] if command == "rank" else ["--port", "8765"]
    with pytest.raises(SystemExit) as e:
        main([command, *args, "--models", str(root / "models")])
    lines = error_lines(capsys.readouterr().err)
    assert e.value.code == 2 and len(lines) == 1 and says in lines[0], lines


@pytest.mark.parametrize(
    "target, edit",
    [
        ("system.json", lambda d: d["keep"]["test"].update(value=0.0)),  # keeps every answer
        ("system.json", lambda d: d.update(system="ensemble", mtl_weight=0.5)),
        ("system.json", lambda d: d.update(n_candidates=5)),
        ("mtl/mtl.json", lambda d: d.update(pf_mean=[x + 5 for x in d["pf_mean"]])),
        ("baseline/final.json", lambda d: d["filter"].update(coef=[[-10 * c for c in r] for r in d["filter"]["coef"]])),
    ],
    ids=["keep-value", "system", "n_candidates", "mtl-pf_mean", "baseline-coef"],
)
def test_a_model_json_used_as_edited_is_one_error_line(workdir, monkeypatch, capsys, tmp_path, target, edit):
    """Issue 64: models/system.json, models/mtl/mtl.json and models/baseline/*.json were read with no checksum: an
    edited keep value, system, scaling or coefficient made `medrank rank` exit 0 with other decisions. Each is sealed
    (`record_sha256`) as the weights and step tables are."""
    from medrank.cli import main

    root = tmp_path / "proj"
    shutil.copytree(workdir / "models", root / "models")
    if target.startswith("baseline"):
        from tests.helpers.tiny_project import use_tiny_baseline

        use_tiny_baseline(root, workdir / "bert")
    monkeypatch.chdir(workdir)
    assert main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(root / "models")]) == 0  # as saved
    capsys.readouterr()
    path = root / "models" / target
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(root / "models")])
    lines = error_lines(capsys.readouterr().err)
    assert e.value.code == 2 and len(lines) == 1 and f"{target}: edited or damaged since it was saved" in lines[0], (
        lines
    )


def test_rank_command_is_registered():
    from medrank.cli import COMMANDS, build_parser

    assert "rank" in COMMANDS
    args = build_parser().parse_args(["rank", "x.json", "--format", "table"])
    assert args.input == "x.json" and args.format == "table" and not args.all
    assert REPO.exists()


def _project_with_group(
    workdir: Path, tmp_path: Path, group: str, column: str, seed: int, aggregation: str = "max"
) -> Path:
    """A copy of the project whose MTL was trained with feature groups metadata + `group` (random `column` values)."""

    from medrank.models import mtl

    root = tmp_path / "proj"
    shutil.copytree(workdir, root, ignore=shutil.ignore_patterns("mtl"))
    data = fake_training_data(seed=seed)
    data.cand[column] = np.random.default_rng(seed).random(len(data.cand))
    cfg = tiny_mtl(max_epochs=1)
    model = mtl.fit_mtl(
        data, list(pd.unique(data.cand["gid"])), cfg, mtl.builder_factory(["metadata", group], 2)(), seed=0
    )
    meta = json.loads((workdir / "models" / "mtl" / "mtl.json").read_text())
    model.save(root / "models" / "mtl", extra_meta={k: meta[k] for k in ("decision", "n_candidates")})
    step = root / "models" / "steps" / "cnn_scores" / "step.json"
    saved = json.loads(step.read_text())
    saved["params"]["cnn"]["mediqa_aggregation"] = aggregation
    write_sealed_json(step, {k: v for k, v in saved.items() if k != RECORD_SHA256})  # as cnn_mediqa would save it
    return root


def test_rank_with_the_cnn_feature_group(workdir, monkeypatch, capsys, tmp_path):
    """An MTL trained with the cnn group: `medrank rank` loads models/cnn and scores the answers with it;
    without models/cnn it stops with one clear line."""
    from medrank.models.word2vec import WordVectors
    from medrank.models.cnn import CnnRanker
    from medrank.data import squad_sentences as ss

    root = _project_with_group(workdir, tmp_path, "cnn", "cnn_score", seed=1, aggregation="mean")
    monkeypatch.chdir(root)
    from medrank.cli import main

    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json")])
    assert e.value.code == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: models/cnn: the cnn model is missing (run `dvc repro cnn_train`)"
    ]

    words = ["noonan", "syndrome", "inherited", "genetic", "is", "it"]
    vectors = WordVectors(words, np.random.default_rng(0).normal(size=(len(words), 8)).astype(np.float32))
    CnnRanker.create(
        vectors,
        ss.Idf({"noonan": 1}, n_docs=10),
        {"dropout": 0.0, "n_filters": 4, "hidden_size": 4, "conv_width": 3},
        seed=0,
    ).save(root / "models" / "cnn")
    out = json.loads(_rank(root, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    assert sorted(a["id"] for a in out["answers"]) == ["3", "4", "A1", "A2"]


def test_rank_with_the_qa_group_loads_the_qa_cross_encoder(workdir, tmp_path, monkeypatch, capsys):
    """An MTL trained with the qa group scores (question, answer) with models/qa; without it, one clear line."""

    from medrank.encoders.cross_encoder import CrossEncoder

    root = _project_with_group(workdir, tmp_path, "qa", "qa_score", seed=2)
    monkeypatch.chdir(root)
    from medrank.cli import main

    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json")])
    assert e.value.code == 2
    assert error_lines(capsys.readouterr().err) == ["error: models/qa: the qa model is missing (run `dvc repro qa`)"]

    CrossEncoder.load(root / "models" / "rqe").save(root / "models" / "qa", extra_meta={"task": "qa"})  # any 2 labels
    out = json.loads(_rank(root, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    assert sorted(a["id"] for a in out["answers"]) == ["3", "4", "A1", "A2"]
    assert CrossEncoder.load(root / "models" / "qa").num_labels == 2


def test_a_damaged_step_table_is_one_error_line(workdir, monkeypatch, capsys, tmp_path):
    from medrank.cli import main

    models = tmp_path / "models"
    shutil.copytree(workdir / "models", models)
    (models / "steps" / "retrieve" / "medquad.parquet").write_bytes(b"not parquet")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(models)])
    lines = error_lines(capsys.readouterr().err)
    assert e.value.code == 2 and len(lines) == 1 and "differs from the sha256 recorded" in lines[0]


@pytest.mark.parametrize(
    "table",
    ["retrieve/medquad.parquet", "answer_scores/qtype_lr.parquet", "normalize/abbreviations.parquet"],
)
def test_a_flipped_bit_in_a_step_table_is_one_error_line(workdir, monkeypatch, capsys, tmp_path, table):
    """Issue 46 #5: single-bit flips in saved step tables decoded to other valid tables and `medrank rank` exited 0."""
    from medrank.cli import main

    models = tmp_path / "models"
    shutil.copytree(workdir / "models", models)
    path = models / "steps" / table
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(models)])
    lines = error_lines(capsys.readouterr().err)
    stage = {"retrieve": "analysis/dvc.yaml:retrieve", "answer_scores": "bienc", "normalize": "normalize"}[
        table.split("/")[0]
    ]
    assert e.value.code == 2 and len(lines) == 1, lines
    assert f"{table}: differs from the sha256 recorded in" in lines[0] and f"dvc repro {stage}" in lines[0]


def test_edited_step_params_are_one_error_line(workdir, monkeypatch, capsys, tmp_path):
    """Issue 46 #5: step.json's params edited by hand (n_candidates 2 -> 1) were used silently."""
    from medrank.cli import main

    models = tmp_path / "models"
    shutil.copytree(workdir / "models", models)
    step = models / "steps" / "retrieve" / "step.json"
    saved = json.loads(step.read_text())
    assert saved["params"]["n_candidates"] == 2
    saved["params"]["n_candidates"] = 1
    step.write_text(json.dumps(saved, indent=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["rank", str(FIXTURES / "rank_input.json"), "--models", str(models)])
    lines = error_lines(capsys.readouterr().err)
    assert e.value.code == 2 and len(lines) == 1, lines
    assert (
        "retrieve/step.json: edited or damaged since it was saved" in lines[0]
        and "dvc repro analysis/dvc.yaml:retrieve" in lines[0]
    )


# ---------------------------------------------------------------- a file of questions: one batch


def _batch_file(tmp_path: Path, n: int) -> Path:
    one = json.loads((FIXTURES / "rank_input.json").read_text())
    path = tmp_path / f"batch{n}.json"
    path.write_text(json.dumps({"questions": [one] * n}))
    return path


def test_a_file_of_questions_is_ranked_as_one_batch(workdir, monkeypatch, capsys, tmp_path):
    """`medrank rank` over `{"questions": [...]}` (/rank/batch's body): each question's record in input order, as
    `Ranker.rank_many` ranks them, and the keep rule the batch was decided by (a fixed rule: the pick's)."""
    from medrank.serving.rank import Ranker, read_rank_input

    out = json.loads(_rank(workdir, monkeypatch, capsys, str(_batch_file(tmp_path, 3)), "--all"))
    system = json.loads((workdir / "models" / "system.json").read_text())
    assert out["keep"] == {"rule": system["keep_rule"], "fitted_on_batch": False, "questions": 3}
    alone = json.loads(_rank(workdir, monkeypatch, capsys, str(FIXTURES / "rank_input.json"), "--all"))
    assert len(out["results"]) == 3 and all(r["question"] == alone["question"] for r in out["results"])
    together = Ranker.load("models").rank_many(read_rank_input(str(_batch_file(tmp_path, 3))))
    for record, result in zip(out["results"], together):
        kept = [a["id"] for a in record["answers"] if a["kept"]]
        assert kept == result.loc[result["kept"]].sort_values("rank")["id"].tolist()
    table = _rank(workdir, monkeypatch, capsys, str(_batch_file(tmp_path, 2)), "--format", "table")
    assert table.count("question ") == 2 and table.rstrip().endswith(f"2 questions; keep rule {system['keep_rule']}")


@pytest.mark.parametrize(
    "body, says",
    [
        ({"questions": []}, "'questions' must be a non-empty list"),
        ({"questions": [{"question": "q"}]}, "questions[0]: 'answers' must be a list"),
        ({"questions": [], "x": 1}, "expected a JSON object with one key, 'questions'"),
    ],
)
def test_a_bad_file_of_questions_is_one_line(tmp_path, body, says):
    from medrank.serving.rank import read_rank_input

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(MedrankError) as e:
        read_rank_input(str(path))
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value) and "\n" not in str(e.value)


def _adaptive_system(rule: str, cal: pd.DataFrame) -> dict:
    from medrank.selection.decision import fit_keep_on
    from medrank.selection.final_system import calibration_record

    request = fit_keep_on("min_keep_1", cal, cal).to_json()
    return {
        "system": "baseline",
        "mtl_weight": 0.0,
        "keep": {"val": request, "test": request},  # the val / test batches' own fits: not a new batch's
        "keep_rule": rule,
        "order": "rank",
        "request": {"val": request, "test": request},
        "request_rule": "min_keep_1",
        "calibration": {"val": calibration_record(cal), "test": calibration_record(cal)},
    }


@pytest.mark.parametrize("rule", ["em_guarded", "posterior_fraction"])
def test_a_batch_adaptive_rule_is_refitted_on_a_file_of_enough_questions(rule):
    """A rule that adapts to its batch is re-fitted on a file of at least MIN_BATCH_QUESTIONS questions (the smallest
    batch the protocol scored it on), from system.json's calibration rows; a smaller batch, and the server (adapt off:
    its micro-batches mix callers), get the request rule."""
    from medrank.selection.decision import MIN_BATCH_QUESTIONS, Keep, fit_keep_on
    from medrank.steps.system_step import SystemStep

    rng = np.random.default_rng(5)
    n = 300
    cal = pd.DataFrame({"gid": [f"c{i // 10}" for i in range(n)], "label_true": (rng.random(n) < 0.3).astype(int)})
    cal["prob"] = np.clip(0.25 + 0.4 * cal["label_true"] + 0.15 * rng.normal(size=n), 0.01, 0.99)
    system = _adaptive_system(rule, cal)
    rows = pd.DataFrame({"gid": [f"q{i // 4}" for i in range(4 * MIN_BATCH_QUESTIONS)]})
    rows["prob"] = np.clip(0.5 + 0.2 * rng.normal(size=len(rows)), 0.01, 0.99)  # a batch with more correct answers
    step = SystemStep(system, "final", None, None, None, adapt=True)
    keep, how = step.keep_for(rows)
    assert how == {"rule": rule, "fitted_on_batch": True, "questions": MIN_BATCH_QUESTIONS}
    assert keep == fit_keep_on(rule, cal, rows) and keep != Keep.from_json(system["request"]["test"])
    few = rows[rows["gid"] != "q0"]
    assert step.keep_for(few) == (
        Keep.from_json(system["request"]["test"]),
        {"rule": "min_keep_1", "fitted_on_batch": False, "questions": MIN_BATCH_QUESTIONS - 1},
    )
    served = SystemStep(system, "final", None, None, None, adapt=False)
    assert served.keep_for(rows)[1]["fitted_on_batch"] is False


def test_the_system_record_of_a_batch_adaptive_pick_carries_its_calibration_rows():
    from medrank.selection.final_system import system_record

    decided = pd.DataFrame(
        {
            "part": "oof",
            "gid": ["a", "a", "b"],
            "split": ["train_liveqa", "train_liveqa", "val"],
            "label_true": [1, 0, 1],
        }
    ).assign(prob=[0.9, 0.2, 0.7])
    sel = {"weight": 0.0, "fits": {"val": {}, "test": {}}, "rule": "em_guarded", "order": "rank", "decided": decided}
    got = system_record(sel)["calibration"]
    assert got["val"] == {"gid": ["a", "a"], "label_true": [1, 0], "prob": [0.9, 0.2]}
    assert got["test"] == {"gid": ["a", "a", "b"], "label_true": [1, 0, 1], "prob": [0.9, 0.2, 0.7]}
    assert "calibration" not in system_record({**sel, "rule": "min_keep_1"})
