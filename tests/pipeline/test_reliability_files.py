"""Stages own exactly their outputs and never lose them when killed: medrank.core.io.atomic_dir / sweep_leftovers
unit tests, then acquire and clean killed (SIGKILL, SIGINT) at several instants in a tiny project folder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from medrank.core import io as mio
from medrank.data.schemas import TABLES
from medrank.core.errors import MedrankError
from tests.conftest import REPO, error_lines, write_params
from tests.helpers.raw import FIX, make_raw_dir


def _owned(path: Path) -> bool:
    return (path / "MANIFEST.json").is_file()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fill(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


OLD = {"MANIFEST.json": b"[]", "a.txt": b"old a", "sub/b.txt": b"old b"}
NEW = {"MANIFEST.json": b"[1]", "c.txt": b"new c"}


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project folder (the cwd) with an old complete data/raw."""
    monkeypatch.chdir(tmp_path)
    _fill(tmp_path / "data/raw", OLD)
    return tmp_path


# ---------------------------------------------------------------- atomic_dir


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_atomic_dir_swaps_in_the_new_folder(project, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(mio, "_RENAMEAT2", None)
    elif mio._RENAMEAT2 is None:
        pytest.skip("renameat2 not available here")
    used, real = [], mio._exchange
    monkeypatch.setattr(mio, "_exchange", lambda a, b: used.append(real(a, b)) or used[-1])
    with mio.atomic_dir("data/raw", owns=_owned) as staging:
        assert staging.resolve().parent == project / "data" and not any(staging.iterdir())
        _fill(staging, NEW)
    assert used == [exchange]
    assert _tree(project / "data/raw") == NEW
    assert os.listdir(project / "data") == ["raw"]  # neither staging nor the old copy left


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_atomic_dir_failure_keeps_the_old_folder(project, exc):
    with pytest.raises(type(exc)), mio.atomic_dir("data/raw", owns=_owned) as staging:
        _fill(staging, NEW)
        raise exc
    assert _tree(project / "data/raw") == OLD
    assert os.listdir(project / "data") == ["raw"]


def test_atomic_dir_creates_a_missing_folder(project):
    with mio.atomic_dir("data/new/raw", owns=_owned) as staging:
        _fill(staging, NEW)
    assert _tree(project / "data/new/raw") == NEW


@pytest.mark.parametrize(
    "target, message",
    [
        (".", "refusing to replace the project folder itself"),
        ("..", "refusing to replace a folder outside the project"),
        ("data/raw/../..", "refusing to replace the project folder itself"),
        ("data", "refusing to replace a folder that holds another declared output (data/raw)"),
        ("data/foreign", "refusing to replace a non-empty folder that is not this stage's output"),
        ("data/file.txt", "refusing to replace: not a folder"),
    ],
)
def test_atomic_dir_refuses_what_it_does_not_own(project, target, message):
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"acquire": {"cmd": "x", "outs": ["data/raw"]}}}))
    _fill(project / "data/foreign", {"thesis.txt": b"precious"})
    (project / "data/file.txt").write_text("keep")
    before = (_tree(project), os.listdir(project.parent))
    with pytest.raises(MedrankError) as e, mio.atomic_dir(target, owns=_owned):
        pytest.fail("the block must not run")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert (_tree(project), os.listdir(project.parent)) == before  # nothing touched, no staging made


def test_acquire_refuses_a_folder_it_did_not_write(project):
    """The old `acquire.out_dir` wiped any folder it named; a folder without acquire's MANIFEST.json is kept."""
    from medrank.data import acquire as acq

    _fill(project / "mirror", {"a.txt": b"a"})
    _fill(project / "thesis", {"chapter1.tex": b"precious"})
    with pytest.raises(MedrankError, match="^thesis: refusing to replace a non-empty folder that is not acquire's"):
        acq.acquire(
            "thesis",
            ["mirror"],
            download=False,
            sources=(acq.Source("a.txt", "o/r", "c", "-", acq.hashlib.sha256(b"a").hexdigest(), 1, "CC0"),),
        )
    assert _tree(project / "thesis") == {"chapter1.tex": b"precious"}


# ---------------------------------------------------------------- sweep_leftovers and recovery


def test_sweep_removes_only_our_leftovers(project):
    ours = [
        "data/.raw.ab_d12z4.staging/x.txt",  # atomic_dir's staging (or the replaced copy) of a killed run
        "data/.raw.old-0123abcd/x.txt",  # fallback's replaced copy, data/raw present: stale
        "data/interim/clean/.medquad.parquet.k3j_9xq1.tmp",  # atomic_path temp file of the pre-staging clean
        "data/interim/clean/sub/.x.json.abcdefgh.tmp",
        "metrics/.data.json.0a1b2c3d.tmp",
    ]
    foreign = [
        "data/raw.partial/x.txt",
        "data/.raw.keep",
        "data/.other.ab_d12z4.staging/x.txt",  # not beside a listed output
        "data/interim/.normalized.abcdefgh.tmp",
        "data/interim/clean/answers.parquet",
        "data/interim/clean/.answers.parquet.tmp",  # no mkstemp part
        "data/interim/clean/.answers.parquet.ABCDEFGH.tmp",
        "metrics/data.json",
        "metrics/.data.json.abcdefghi.tmp",
    ]
    _fill(project, {p: b"x" for p in ours + foreign})
    removed = mio.sweep_leftovers(["data/raw", "data/interim/clean", "metrics/data.json"])
    assert sorted(p.as_posix() for p in removed) == sorted(p.split("/x.txt")[0] for p in ours)
    left = set(_tree(project))
    assert all(p in left for p in foreign) and not any(p in left for p in ours)
    assert _tree(project / "data/raw") == OLD


def test_a_swap_killed_between_the_fallback_renames_is_undone(project):
    """Fallback (no renameat2): old -> .raw.old-*, new -> raw; a kill between leaves no data/raw."""
    os.rename(project / "data/raw", project / "data/.raw.old-0123abcd")
    _fill(project / "data/.raw.x1y2z3w4.staging", NEW)  # the new copy that never got its name
    mio.sweep_leftovers(["data/raw"])
    assert _tree(project / "data/raw") == OLD
    assert os.listdir(project / "data") == ["raw"]
    # atomic_dir recovers the same way before it swaps (a caller without the runner's sweep)
    os.rename(project / "data/raw", project / "data/.raw.old-0123abcd")
    with mio.atomic_dir("data/raw", owns=_owned) as staging:
        assert _tree(project / "data/raw") == OLD
        _fill(staging, NEW)
    assert _tree(project / "data/raw") == NEW and os.listdir(project / "data") == ["raw"]


_SLOW_WRITER = """
import sys, time
from pathlib import Path
from medrank.core import io as mio
with mio.atomic_dir("data/raw", owns=lambda p: (p / "MANIFEST.json").is_file()) as staging:
    (staging / "MANIFEST.json").write_text("[1]")
    (staging / "first.txt").write_text("1")
    with mio.atomic_path("metrics/data.json") as tmp:
        tmp.write_text("{}")
        Path("ready").touch()
        while not Path("go").exists():
            time.sleep(0.02)
    (staging / "sub").mkdir(parents=True, exist_ok=True)
    (staging / "sub/second.txt").write_text("2")
"""


def test_a_second_run_never_sweeps_a_live_runs_temp_files(project):
    """Issue 36 #1: a sweep beside a live run (a stage run by hand beside `dvc repro`) used to delete its staging
    folder, and the live run then published a partial folder with exit 0. Live temp files carry their owner's flock."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER], cwd=project, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        deadline = time.time() + 60
        while not (project / "ready").exists():
            assert writer.poll() is None and time.time() < deadline
            time.sleep(0.02)
        live = [p.name for p in (project / "data").iterdir() if p.name.endswith(".staging")]
        live += [p.name for p in (project / "metrics").iterdir() if p.name.endswith(".tmp")]
        assert len(live) == 2
        assert mio.sweep_leftovers(["data/raw", "metrics/data.json"]) == []  # the second run's sweep
        (project / "go").touch()
        assert writer.wait(60) == 0
    finally:
        writer.kill()
    assert _tree(project / "data/raw") == {"MANIFEST.json": b"[1]", "first.txt": b"1", "sub/second.txt": b"2"}
    assert (project / "metrics/data.json").read_text() == "{}"
    # the same names left by a dead owner (no flock) are swept
    _fill(project, {f"data/{live[0]}/x.txt": b"x", f"metrics/{live[1]}": b"x"})
    assert sorted(p.name for p in mio.sweep_leftovers(["data/raw", "metrics/data.json"])) == sorted(live)


def test_a_second_run_of_a_stage_refuses_with_one_line(tmp_path, monkeypatch):
    from medrank.stage.runner import lock_dir, stage_lock

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc").mkdir()
    with stage_lock("acquire"):
        with pytest.raises(
            MedrankError, match=rf"stage acquire is already running in this project \(process {os.getpid()}, lock "
        ):
            with stage_lock("acquire"):
                pass
        with stage_lock("clean"):  # another stage runs beside it
            pass
    with stage_lock("acquire"):  # released with its run (a killed run's flock goes with its process)
        pass
    assert lock_dir() == Path(".dvc/tmp/medrank-locks")


# A stage (lock + a temp file held) fanning shards out to 2 forked workers that never finish (the encoder sleeps).
_KILLED_POOL = """
import os, sys, time, types
from medrank.encoders.distributed import LocalPool, pool_extract
from medrank.core.io import atomic_path
from medrank.stage.runner import stage_lock

class Sleeper:
    device = types.SimpleNamespace(type="cpu")
    def inference_model(self, precision):
        pass
    def predict(self, pairs, **kw):
        open(f"worker.{os.getpid()}", "w").close()
        time.sleep(120)

with stage_lock("retrieve"), atomic_path("out.txt"):
    pool_extract(Sleeper(), [([b"a"], [("q", "a")]), ([b"b"], [("q", "b")])], "fp32", 8, LocalPool(2), print)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_killed_stages_workers_die_with_it_and_free_its_lock(tmp_path, monkeypatch):
    """Issue 46: `kill -9` of a retrieve run left its forked workers computing on, holding the stage lock (the flock
    is the open file's, and they inherited it): the next run said "already running (process <the dead pid>)"."""
    from medrank.stage.runner import stage_lock

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc").mkdir()
    stage = subprocess.Popen(
        [sys.executable, "-c", _KILLED_POOL], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and stage.poll() is None:
            time.sleep(0.05)
            workers = [int(p.suffix[1:]) for p in tmp_path.glob("worker.*")]
        assert len(workers) == 2, "the workers did not start"
        with pytest.raises(MedrankError, match=rf"already running in this project \(process {stage.pid}, lock "):
            with stage_lock("retrieve"):
                pass
        stage.kill()
        stage.wait(10)
        deadline = time.monotonic() + 5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)], "workers outlived their killed stage"
        with stage_lock("retrieve"):  # nobody holds it any more
            pass
        assert [p.name for p in mio.sweep_leftovers(["out.txt"])][0].startswith(".out.txt.")  # nor the temp file
    finally:
        stage.kill()
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)


def test_a_refusal_names_the_live_holder_never_a_dead_or_missing_pid(tmp_path, monkeypatch):
    """3 of 6 concurrent runs said "process ?": the winner had its flock but had not yet written its pid. A refusal
    waits for the pid (or finds the holder), and never names a dead process left in the file by an earlier run."""
    import fcntl
    import threading

    from medrank.stage.runner import lock_dir, stage_lock

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc").mkdir()
    path = lock_dir() / "embed.lock"
    path.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(str(dead.pid))  # an earlier, finished run's pid
    fd = os.open(path, os.O_RDWR)  # a winner between its flock and its pid write
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        threading.Timer(0.3, lambda: os.pwrite(fd, f"{os.getpid():<20}".encode(), 0)).start()
        with pytest.raises(MedrankError, match=rf"\(process {os.getpid()}, lock "):
            with stage_lock("embed"):
                pass
        os.pwrite(fd, f"{dead.pid:<20}".encode(), 0)  # a pid never written: the holder is found all the same
        with pytest.raises(MedrankError, match=rf"\(process {os.getpid()}, lock "):
            with stage_lock("embed"):
                pass
    finally:
        os.close(fd)


@pytest.mark.checkout
def test_stage_start_gates_params_before_sweeping_or_running(tmp_path, monkeypatch, capsys):
    """`dvc repro -s X` and `python -m stages.X` skip check_params: each stage checks params.yaml itself, first."""
    from medrank.stage.runner import run

    monkeypatch.chdir(tmp_path)
    base = yaml.safe_load((REPO / "params.yaml").read_text())
    base["mtl"]["lr"] = float("inf")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(base))
    _fill(tmp_path, {"data/.raw.ab_d12z4.staging/x.txt": b"x"})
    ran = []

    def main() -> None:
        ran.append(1)

    main.__module__ = "stages.acquire"
    with pytest.raises(SystemExit) as e:
        run(main)
    assert e.value.code == 2 and not ran and (tmp_path / "data/.raw.ab_d12z4.staging/x.txt").exists()
    assert capsys.readouterr().err.strip() == "error: params.yaml: mtl.lr: Input should be a finite number (got inf)"


def test_atomic_path_fsyncs_file_before_rename_and_folder_after(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (calls.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name)), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", Path(b).name)), real_replace(a, b)))
    mio.write_text(tmp_path / "x.json", "{}")
    assert [c[0] for c in calls] == ["fsync", "replace", "fsync"]
    assert calls[0][1].startswith(".x.json.") and calls[2][1] == tmp_path.name


# ---------------------------------------------------------------- killed stages (subprocesses)

# Runs a stage as `python -m stages.<name>` does (medrank.stage.runner.run, so the start-of-run sweep too), with
# copies, fsyncs and folder removals slowed down so that a test can kill it at a chosen instant.
PROBE = """
import functools, hashlib, importlib, os, shutil, sys, time
from pathlib import Path

slow = float(sys.argv[2])

def slowed(fn, s):
    def wrapper(*a, **k):
        time.sleep(s)
        return fn(*a, **k)
    return wrapper

os.fsync, shutil.copyfile = slowed(os.fsync, slow), slowed(shutil.copyfile, slow)
shutil.rmtree = slowed(shutil.rmtree, 0.3 if slow else 0)
stage = importlib.import_module(sys.argv[1])
if sys.argv[1] == "stages.acquire":  # a tiny registry: whatever the mirror holds
    from medrank.data import acquire as acq
    from medrank.data.sources import Source
    files = sorted(p for p in Path("mirror").rglob("*") if p.is_file())
    sources = tuple(Source(p.relative_to("mirror").as_posix(), "o/r", "c0ffee", "-", hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size, "CC0") for p in files)
    stage.acquire = functools.partial(acq.acquire, sources=sources)
from medrank.stage.runner import run
run(stage.main)
"""


def _start(work: Path, module: str, slow: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # SIGINT back to its default in the child: a test run started in the background (`cmd &` without job control)
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    return subprocess.Popen(
        [sys.executable, "probe.py", module, str(slow)],
        cwd=work,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate()
    assert proc.returncode == 0, err


def _kill_when(proc: subprocess.Popen, event, sig: int, delay: float = 0.0) -> tuple[int, str]:
    deadline = time.monotonic() + 60
    while not event():
        assert proc.poll() is None, f"stage ended before the event: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(sig)
    _, err = proc.communicate()
    return proc.returncode, err


def _new_staging(parent: Path, name: str):
    before = set(parent.glob(f".{name}.*.staging"))
    return lambda: bool(set(parent.glob(f".{name}.*.staging")) - before)


def _staging_has(parent: Path, name: str, files: list[str]):
    before = set(parent.glob(f".{name}.*.staging"))
    return lambda: any(all((s / f).exists() for f in files) for s in set(parent.glob(f".{name}.*.staging")) - before)


def _swapped(folder: Path):
    """True once `folder` is another inode: the new copy has been swapped in (the old one is being removed)."""
    ino = folder.stat().st_ino
    return lambda: folder.stat().st_ino != ino


def _acquire_project(tmp_path) -> Path:
    work = tmp_path / "work"
    for version, n in (("a", 120), ("b", 130)):
        _fill(work / f"mirror_{version}", {f"d{i % 4}/f{i}.txt": f"{version}{i}\n".encode() * 40 for i in range(n)})
    shutil.copy(REPO / "dvc.yaml", work / "dvc.yaml")  # the runner reads acquire's declared outputs from it
    (work / "probe.py").write_text(PROBE)
    write_params(work, {"acquire": {"mirrors": ["mirror"], "download": False}})
    return work


def _use_mirror(work: Path, version: str) -> None:
    link = work / "mirror"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"mirror_{version}")


def _raw_version(work: Path) -> str:
    """'a' or 'b': data/raw is exactly one complete acquire of that mirror (files and MANIFEST)."""
    got = _tree(work / "data/raw")
    manifest = json.loads(got.pop("MANIFEST.json"))
    for version in "ab":
        want = _tree(work / f"mirror_{version}")
        if got == want:
            assert {m["path"] for m in manifest} == set(want)
            return version
    raise AssertionError("data/raw is neither complete copy")


@pytest.mark.checkout
def test_acquire_killed_at_any_instant_keeps_a_complete_data_raw(tmp_path):
    work = _acquire_project(tmp_path)
    data = work / "data"
    _use_mirror(work, "a")
    _finish(_start(work, "stages.acquire", 0))
    current = _raw_version(work)
    staging, staged, swapped = (
        (lambda: _new_staging(data, "raw")),
        (lambda: _staging_has(data, "raw", ["MANIFEST.json"])),
        (lambda: _swapped(data / "raw")),
    )
    trials = [  # (signal, event, delay): while copying, fsyncing the complete staging folder, removing the old copy
        (signal.SIGKILL, staging, 0.1),
        (signal.SIGKILL, staged, 0.0),
        (signal.SIGINT, staged, 0.05),
        (signal.SIGINT, swapped, 0.0),
        (signal.SIGKILL, swapped, 0.0),
    ]
    for sig, event, delay in trials:
        target = "b" if current == "a" else "a"
        _use_mirror(work, target)
        rc, err = _kill_when(_start(work, "stages.acquire", 0.002), event(), sig, delay)
        state = _raw_version(work)
        assert state == target if event is swapped else state in (current, target), (sig, state)
        if sig == signal.SIGINT:
            assert rc == 130 and error_lines(err) == ["error: interrupted"], err
        current = state
    assert any(
        p.name.startswith(".raw.") for p in data.iterdir()
    )  # the last kill left the old copy behind (swept below)
    _use_mirror(work, "b")
    _finish(_start(work, "stages.acquire", 0))
    assert _raw_version(work) == "b"
    assert os.listdir(data) == ["raw"]  # the start-of-run sweep removed every leftover


CLEAN_VERSIONS = {
    "a": {"squad_max_articles": 1, "mednli_dir": None},
    "b": {"squad_max_articles": None, "mednli_dir": str(FIX / "mednli")},
}


@pytest.mark.checkout
def test_clean_killed_during_its_writes_keeps_a_complete_folder(tmp_path):
    work = tmp_path / "work"
    make_raw_dir(work / "data")
    shutil.copy(REPO / "dvc.yaml", work / "dvc.yaml")
    (work / "probe.py").write_text(PROBE)
    interim, clean = work / "data/interim", work / "data/interim/clean"
    snapshots = {}
    for version in "ab":  # the two complete outputs (nli and squad differ)
        write_params(work, {"clean": CLEAN_VERSIONS[version]})
        _finish(_start(work, "stages.clean", 0))
        snapshots[version] = (_tree(clean), (work / "metrics/data.json").read_bytes())
    assert snapshots["a"][0]["nli.parquet"] != snapshots["b"][0]["nli.parquet"]

    def version() -> str:
        tables, counts = _tree(clean), (work / "metrics/data.json").read_bytes()
        assert len(tables) == 8
        for v, (want, _) in snapshots.items():
            if tables == want:
                assert counts in (snapshots["a"][1], snapshots["b"][1])
                return v
        raise AssertionError("data/interim/clean mixes two runs or is incomplete")

    current = "b"
    tables = [f"{name}.parquet" for name in TABLES]
    for event, delay in (
        (lambda: _new_staging(interim, "clean"), 0.05),
        (lambda: _staging_has(interim, "clean", tables), 0.0),
        (lambda: _swapped(clean), 0.0),
    ):
        target = "b" if current == "a" else "a"
        write_params(work, {"clean": CLEAN_VERSIONS[target]})
        _kill_when(_start(work, "stages.clean", 0.02), event(), signal.SIGKILL, delay)
        current = version()
    assert current == target  # the last kill came after the swap
    assert any(p.name.startswith(".clean.") for p in interim.iterdir())
    # what the pre-staging clean left when killed, plus a file that is not ours
    _fill(
        work,
        {
            "data/interim/clean/.medquad.parquet.k3j_9xq1.tmp": b"x" * 1000,
            "metrics/.data.json.0a1b2c3d.tmp": b"{",
            "data/interim/notes.txt": b"mine",
        },
    )
    _finish(_start(work, "stages.clean", 0))
    assert sorted(os.listdir(interim)) == ["clean", "notes.txt"] and not list((work / "metrics").glob(".*"))
    assert version() == target


@pytest.mark.checkout
def test_clean_sweeps_the_temp_file_a_killed_pre_staging_run_left_inside_its_folder(tmp_path):
    work = tmp_path / "work"
    make_raw_dir(work / "data")
    shutil.copy(REPO / "dvc.yaml", work / "dvc.yaml")
    write_params(work, {"clean": CLEAN_VERSIONS["a"]})
    _fill(
        work,
        {"data/interim/clean/.medquad.parquet.k3j_9xq1.tmp": b"x" * 1000, "data/interim/clean/answers.parquet": b"old"},
    )
    r = subprocess.run(
        [sys.executable, "-m", "stages.clean"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert len(os.listdir(work / "data/interim/clean")) == 8 and not list((work / "data/interim/clean").glob(".*"))


def test_clean_refuses_a_folder_holding_foreign_files(tmp_path):
    work = tmp_path / "work"
    make_raw_dir(work / "data")
    write_params(work, {"clean": CLEAN_VERSIONS["a"]})
    _fill(work, {"data/interim/clean/notes.txt": b"mine"})
    r = subprocess.run(
        [sys.executable, "-m", "stages.clean"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert error_lines(r.stderr) == [
        "error: data/interim/clean: refusing to replace a non-empty folder that is not clean's (only the table parquets)"
    ]
    assert os.listdir(work / "data/interim/clean") == ["notes.txt"] and not (work / "metrics/data.json").exists()


# ---------------------------------------------------------------- DVC does not delete the folder first


@pytest.mark.checkout
@pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc not installed")
def test_failed_dvc_repro_keeps_the_old_data_raw(tmp_path):
    """acquire's data/raw is `persist: true` in dvc.yaml: a failing `dvc repro acquire` leaves the old folder."""
    work = _acquire_project(tmp_path)
    _use_mirror(work, "a")
    outs = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["acquire"]["outs"]
    (work / "dvc.yaml").write_text(
        yaml.safe_dump(
            {"stages": {"acquire": {"cmd": "python probe.py stages.acquire 0", "params": ["acquire"], "outs": outs}}}
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_NO_ANALYTICS": "1"}

    def dvc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["dvc", *args], cwd=work, env=env, capture_output=True, text=True, check=False)

    assert dvc("init", "--no-scm", "-q").returncode == 0
    r = dvc("repro", "acquire")
    assert r.returncode == 0, r.stderr + r.stdout
    write_params(work, {"acquire": {"mirrors": ["/nonexistent"], "download": False}})
    r = dvc("repro", "acquire")
    assert r.returncode != 0 and "acquire.download is false" in r.stderr + r.stdout
    assert _raw_version(work) == "a"
    write_params(work, {"acquire": {"mirrors": ["mirror"], "download": False}})
    assert "up to date" in dvc("status").stdout  # the same folder hash as the lock
