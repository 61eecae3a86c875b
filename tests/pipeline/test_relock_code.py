"""tests/helpers/relock_code.py: a code-only change is recorded in the locks without the outputs, and only where
named; the committed dvc.lock records today's code for every stage of the main pipeline."""

from __future__ import annotations

import pytest

from tests.helpers.relock_code import relock_params, rewrite, stale_code_deps

ENCODERS = """    - path: medrank/encoders
      hash: md5
      md5: aaa.dir
      size: 10
      nfiles: 2
"""  # the same dep in two stages: only the named stage's entry may change
LOCK = f"""schema: '2.0'
stages:
  embed:
    cmd: python -m stages.embed
    deps:
{ENCODERS}    - path: stages/embed.py
      hash: md5
      md5: bbb
      size: 5
  score:
    cmd: python -m stages.score
    deps:
{ENCODERS}"""


def test_rewrite_changes_the_named_stages_entries_only(tmp_path):
    lock = tmp_path / "dvc.lock"
    lock.write_text(LOCK)
    entry = {"path": "medrank/encoders", "md5": "aaa.dir", "size": 10, "nfiles": 2}
    rewrite(str(lock), {"embed": [(entry, {"md5": "ccc.dir", "size": 12, "nfiles": 3})]})
    text = lock.read_text()
    embed, score = text.split("  score:\n")
    assert "md5: ccc.dir\n      size: 12\n      nfiles: 3\n" in embed and "md5: bbb\n      size: 5\n" in embed
    assert score == LOCK.split("  score:\n")[1]  # the same dep of another stage is untouched
    assert text.count("\n") == LOCK.count("\n")


def test_relock_params_records_todays_values_of_the_named_stages_only(tmp_path):
    """A key moved to its one owner (the value the same): the named stage's locked params become today's, as
    `dvc commit -f` writes them; another stage's stay."""
    import subprocess
    import sys

    import yaml

    subprocess.run([sys.executable, "-m", "dvc", "init", "-q", "--no-scm"], cwd=tmp_path, check=True)
    (tmp_path / "params.yaml").write_text("a: {x: 1}\nkeep: [min_keep_1]\n")
    stages = {n: {"cmd": "true", "params": ["a", "keep"]} for n in ("one", "two")}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    old = {"a": {"x": 1, "min_keep": 1}}  # before: the section spelled the key
    lock = {"schema": "2.0", "stages": {n: {"cmd": "true", "params": {"params.yaml": old}} for n in stages}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert relock_params(["one"], ("dvc.yaml",), root=tmp_path) == ["dvc.lock: one"]
    got = yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]
    assert got["one"]["params"] == {"params.yaml": {"a": {"x": 1}, "keep": ["min_keep_1"]}}
    assert got["two"]["params"] == {"params.yaml": old}
    with pytest.raises(SystemExit, match="no locked stage named nope"):
        relock_params(["nope"], ("dvc.yaml",), root=tmp_path)


@pytest.mark.checkout
def test_the_lock_records_todays_code_for_every_pipeline_stage():
    """A code change that cannot move an output is relocked (`python -m tests.helpers.relock_code <paths>`), one
    that can is a re-run: either way dvc.lock names today's code (analysis/dvc.lock's stale rows are listed apart)."""
    stale = stale_code_deps(dvc_files=("dvc.yaml",))
    assert not stale, f"stale code deps in dvc.lock: {stale}"
