"""Issue 64, item 1: nothing a stage owns is deleted before its gate runs, and a stage whose `dvc repro` is killed
does not live on. medrank.core.stash unit tests, then a stage in a tiny DVC project: bad params, a refused input, an
error and a SIGKILL of `dvc repro` each leave the last good outputs (cached and `cache: false`) and dvc.lock as they
were."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from medrank.core import layout
from medrank.core.errors import MedrankError
from medrank.core.io import declared_outputs
from medrank.core.stash import MANIFEST, keep_last_good, restore
from tests.conftest import REPO, error_lines, write_params


def _tree(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {".": root.read_bytes()}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fill(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


@pytest.fixture
def outputs(tmp_path, monkeypatch) -> list[Path]:
    """A project (the cwd) with a last good model folder and submission; `new.csv` has no last good version."""
    monkeypatch.chdir(tmp_path)
    _fill(tmp_path, {"built/m/w.bin": b"old w", "built/m/sub/meta.json": b"{}", "built/subs/val.csv": b"old csv"})
    return [Path("built/m"), Path("built/subs/val.csv"), Path("built/subs/new.csv")]


def _write_new() -> None:
    shutil.rmtree("built/m", ignore_errors=True)
    _fill(Path("."), {"built/m/w.bin": b"new w", "built/subs/val.csv": b"new csv", "built/subs/new.csv": b"new"})


# ---------------------------------------------------------------- keep_last_good / restore


def test_a_stage_that_succeeds_leaves_its_new_outputs_and_no_stash(outputs, tmp_path):
    with keep_last_good(tmp_path / "stash", outputs):
        assert not any(p.exists() for p in outputs)  # the block starts as after DVC's delete
        _write_new()
    assert _tree(Path("built/m")) == {"w.bin": b"new w"}  # the old folder's other files are gone with it
    assert Path("built/subs/val.csv").read_bytes() == b"new csv" and Path("built/subs/new.csv").exists()
    assert not (tmp_path / "stash").exists()


@pytest.mark.parametrize("exc", [MedrankError("bad"), RuntimeError("boom"), KeyboardInterrupt(), SystemExit(143)])
def test_a_stage_that_fails_gets_its_last_good_outputs_back(outputs, tmp_path, exc):
    with pytest.raises(type(exc)):
        with keep_last_good(tmp_path / "stash", outputs):
            _fill(
                Path("."), {"built/m/w.bin": b"half", "built/subs/new.csv": b"half"}
            )  # a partial write, then the error
            raise exc
    assert _tree(Path("built/m")) == {"w.bin": b"old w", "sub/meta.json": b"{}"}
    assert Path("built/subs/val.csv").read_bytes() == b"old csv"
    assert not Path("built/subs/new.csv").exists()  # no last good version: the partial one goes
    assert not (tmp_path / "stash").exists()


_KILLED = """
import os, signal, sys
from pathlib import Path
from medrank.core.stash import keep_last_good
with keep_last_good("stash", ["built/m", "built/subs/val.csv", "built/subs/new.csv"]):
    Path("built/m").mkdir(parents=True)
    Path("built/m/w.bin").write_bytes(b"half")
    Path("built/subs/new.csv").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_stages_stash_goes_back_at_the_next_start(outputs, tmp_path):
    r = subprocess.run([sys.executable, "-c", _KILLED], env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert r.returncode == -signal.SIGKILL
    assert Path("built/m/w.bin").read_bytes() == b"half" and (tmp_path / "stash" / MANIFEST).is_file()
    assert restore(tmp_path / "stash") == [Path("built/m"), Path("built/subs/val.csv")]
    assert _tree(Path("built/m")) == {"w.bin": b"old w", "sub/meta.json": b"{}"}
    assert Path("built/subs/val.csv").read_bytes() == b"old csv" and not Path("built/subs/new.csv").exists()
    assert not (tmp_path / "stash").exists()


def test_a_stash_without_a_manifest_holds_nothing_to_put_back(outputs, tmp_path):
    _fill(tmp_path / "stash", {"0-m/w.bin": b"stale"})  # killed while dropping a succeeded run's stash
    assert restore(tmp_path / "stash") == [] and not (tmp_path / "stash").exists()
    assert Path("built/m/w.bin").read_bytes() == b"old w"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_worker_unwinding_through_the_block_leaves_the_stash_alone(outputs, tmp_path):
    with keep_last_good(tmp_path / "stash", outputs):
        pid = os.fork()
        if pid == 0:  # the worker raises through the parent's frames, as an exception in a forked child can
            try:
                raise RuntimeError("worker")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert (tmp_path / "stash" / MANIFEST).is_file()
        _write_new()
    assert Path("built/m/w.bin").read_bytes() == b"new w" and not (tmp_path / "stash").exists()


# ---------------------------------------------------------------- the pipeline files


@pytest.mark.checkout
def test_every_declared_output_is_persist_so_dvc_never_deletes_it_first():
    """DVC deletes a stage's non-persist outputs before its command (and so before the stage's gate) runs."""
    for dvcfile in ("dvc.yaml", "analysis/dvc.yaml"):
        stages = yaml.safe_load((REPO / dvcfile).read_text(encoding="utf-8"))["stages"]
        for name, stage in stages.items():
            for key in ("outs", "metrics", "plots"):
                for entry in stage.get(key) or []:
                    path, flags = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
                    assert (flags or {}).get("persist") is True, f"{dvcfile}: {name}: {path} is not persist: true"
    declared = set(declared_outputs(dvcfiles=[REPO / "dvc.yaml", REPO / "analysis/dvc.yaml"]))
    assert {REPO / p for p in layout.KEPT_OUTPUTS} <= declared


# ---------------------------------------------------------------- a stage in a DVC project

_STAGE = """
import os, time
from pathlib import Path
from medrank.core.errors import MedrankError
from medrank.stage.runner import run

def main():
    Path("pid").write_text(str(os.getpid()))
    mode = Path("mode").read_text().strip()
    Path("built/m").mkdir(parents=True)
    Path("built/m/w.bin").write_text(mode)
    if mode == "refuse":
        raise MedrankError("models/in.bin: not a model folder")
    if mode == "params":  # what a second `dvc exp run -S` in this workspace does while this stage runs
        Path("params.yaml").write_text(Path("params.yaml").read_text().replace("seed: 13", "seed: 14"))
    if mode == "sleep":
        Path("sleeping").write_text("")
        time.sleep(60)
    Path("built/subs").mkdir(exist_ok=True)
    Path("built/subs/val.csv").write_text(mode)

if __name__ == "__main__":
    run(main)
"""


def _dvc_project(tmp_path: Path) -> tuple[Path, callable]:
    work = tmp_path / "work"
    (work / "stages").mkdir(parents=True)
    (work / "stages/__init__.py").write_text("")
    (work / "stages/fake.py").write_text(_STAGE)
    (work / "mode").write_text("good")
    write_params(work)
    dvc_yaml = {
        "stages": {
            "fake": {
                "cmd": "python -m stages.fake",
                "deps": ["stages/fake.py", "mode"],
                "params": ["mtl"],
                "outs": [{"built/m": {"persist": True}}, {"built/subs/val.csv": {"cache": False, "persist": True}}],
            }
        }
    }
    (work / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml))
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{REPO}", "DVC_NO_ANALYTICS": "1"}

    def dvc(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["dvc", *args], cwd=work, env=env, capture_output=True, text=True, check=False, **kw)

    assert dvc("init", "--no-scm", "-q").returncode == 0
    r = dvc("repro")
    assert r.returncode == 0, r.stderr + r.stdout
    return work, dvc


def _last_good(work: Path) -> dict:
    return {"m": _tree(work / "built/m"), "csv": (work / "built/subs/val.csv").read_text(), "lock": _lock(work)}


def _lock(work: Path) -> str:
    return (work / "dvc.lock").read_text()


@pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc not installed")
def test_bad_params_a_refused_input_or_an_error_keep_the_last_good_outputs(tmp_path):
    """The issue's probe: `dvc repro -s mtl` with `mtl.alpha: -1` printed its one line after DVC had removed
    models/mtl and the (uncached) submissions."""
    work, dvc = _dvc_project(tmp_path)
    good = _last_good(work)
    assert good["m"] == {"w.bin": b"good"} and good["csv"] == "good"

    write_params(work, {"mtl": {"alpha": -1}})
    r = dvc("repro", "-s", "fake")
    assert r.returncode != 0 and [ln for ln in error_lines(r.stderr) if "mtl.alpha" in ln], r.stderr
    assert _last_good(work) == good

    write_params(work)
    for mode in ("refuse", "crash"):
        (work / "mode").write_text(mode)
        if mode == "crash":  # a traceback half-way through the writes
            (work / "stages/fake.py").write_text(
                _STAGE.replace('Path("built/subs").mkdir', "1 / 0\n    Path('built/subs').mkdir")
            )
        r = dvc("repro", "-s", "fake")
        assert r.returncode != 0, r.stdout
        assert _last_good(work) == good, mode
    assert not (work / ".dvc/tmp/medrank-stash/fake").exists()


@pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc not installed")
def test_params_changed_while_the_stage_ran_keep_the_last_good_outputs(tmp_path):
    """Two `dvc exp run` in one workspace: DVC writes the second run's `-S` into params.yaml while the first run's
    stage runs (it gives up its repo lock during a stage command), and then locked outputs of the old values under the
    new ones. The stage now refuses to end on a params.yaml other than the one its gate read."""
    work, dvc = _dvc_project(tmp_path)
    good = _last_good(work)
    (work / "mode").write_text("params")
    r = dvc("repro", "-s", "fake")
    assert r.returncode != 0 and [ln for ln in error_lines(r.stderr) if "params.yaml changed while stage fake" in ln]
    assert _last_good(work) == good


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


_SHELLS = [s for s in ("/bin/sh", "/bin/bash") if Path(s).exists()]


@pytest.mark.skipif(shutil.which("dvc") is None or not sys.platform.startswith("linux"), reason="dvc, /proc")
@pytest.mark.parametrize("shell", _SHELLS)
def test_a_stage_dies_with_its_killed_dvc_repro_and_its_last_good_outputs_stay(tmp_path, shell):
    """A SIGKILL of `dvc repro -s -f mtl` left the stage process running on: it rewrote models/mtl with no dvc.lock
    update. Now the stage sees its starter go, unwinds, and puts its last good outputs back. DVC runs the cmd with
    $SHELL -c: bash execs it, Debian's /bin/sh (dash) stays between as a parent that outlives dvc (CI failed on that)."""
    work, dvc = _dvc_project(tmp_path)
    good = _last_good(work)
    (work / "mode").write_text("sleep")
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{REPO}", "DVC_NO_ANALYTICS": "1", "SHELL": shell}
    repro = subprocess.Popen(["dvc", "repro", "-s", "-f", "fake"], cwd=work, env=env, stderr=subprocess.DEVNULL)
    pid = None
    try:
        assert _wait_for(work / "sleeping", 60), "the stage did not start"
        pid = int((work / "pid").read_text())
        assert (work / "built/m/w.bin").read_text() == "sleep"  # mid-run: the new, partial outputs
        repro.kill()
        repro.wait(10)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the stage outlived its killed dvc repro"
        (work / "mode").write_text("good")
        assert _last_good(work) == good
        assert "up to date" in dvc("status").stdout  # what dvc.lock records is what is on disk
    finally:
        repro.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_unwinds_a_stage_process_and_puts_its_outputs_back(tmp_path):
    """`kill <stage pid>` (what a scheduler or Ctrl-C in another form sends) ran no clean-up before."""
    work, _ = _dvc_project(tmp_path)
    good = _last_good(work)
    (work / "mode").write_text("sleep")
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{REPO}"}
    stage = subprocess.Popen([sys.executable, "-m", "stages.fake"], cwd=work, env=env, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(work / "sleeping", 60), "the stage did not start"
        stage.send_signal(signal.SIGTERM)
        assert stage.wait(15) == 128 + signal.SIGTERM
        (work / "mode").write_text("good")
        assert _last_good(work) == good
    finally:
        stage.kill()


@pytest.mark.checkout  # reads benchmarks/experiment.py of the checkout
@pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc not installed")
def test_a_stage_ends_with_its_peak_rss_which_the_repro_benchmark_reads(tmp_path):
    """Issue 63: a cold repro's peak RSS (3.74 GiB against 3.5) had no stage to it. Each stage's last line names its
    peak RSS (its process and its largest worker); benchmarks/experiment.py reads it into the per-stage table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("experiment_bench", REPO / "benchmarks/experiment.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    work, dvc = _dvc_project(tmp_path)
    peaks: dict[str, int] = {}
    with pytest.MonkeyPatch.context() as mp:  # timed_dvc's dvc inherits the environment: the toy stage's imports
        mp.setenv("PYTHONPATH", f"{work}{os.pathsep}{REPO}")
        mp.setenv("DVC_NO_ANALYTICS", "1")
        wall, stages = bench.timed_dvc(["repro", "-f"], work, peaks)
    assert set(stages) == {"fake"} and stages["fake"] is not None
    assert set(peaks) == {"fake"} and 20 < peaks["fake"] < 4096  # MiB: a Python process with medrank imported
