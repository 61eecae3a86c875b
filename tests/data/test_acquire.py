import gzip
import hashlib
import io
import tarfile

import pytest

from medrank.data import acquire as acq
from medrank.data.sources import SOURCES, Source
from medrank.core.errors import MedrankError
from tests.conftest import error_lines, run_module, write_params


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """acquire replaces only folders inside the project (the cwd): run each test in its own."""
    monkeypatch.chdir(tmp_path)


def _src(path: str, data: bytes, **kw) -> Source:
    return Source(path, "o/r", "c0ffee", path, hashlib.sha256(data).hexdigest(), len(data), "CC0", **kw)


def test_registry_matches_sources_md(shared_data):
    """Every file listed in SOURCES.md is pinned with the same sha256, and nothing else."""
    listed = {}
    for line in (shared_data / "SOURCES.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and len(cells[6]) == 64:
            listed[cells[0]] = cells[6]
    assert listed == {s.path: s.sha256 for s in SOURCES}
    assert not any("wLabels" in s.path or "testSet_ground_truth" in s.path for s in SOURCES)


def test_acquire_from_mirror_copies_and_verifies(tmp_path):
    mirror = tmp_path / "mirror"
    (mirror / "d").mkdir(parents=True)
    (mirror / "d/a.txt").write_bytes(b"hello")
    out = tmp_path / "raw"
    man = acq.acquire(out, [tmp_path / "missing", mirror], download=False, sources=(_src("d/a.txt", b"hello"),))
    assert (out / "d/a.txt").read_bytes() == b"hello"
    assert man[0]["origin"] == str(mirror)
    assert (out / "MANIFEST.json").exists()


def test_checksum_mismatch_is_one_clear_error_and_writes_nothing(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "good.txt").write_bytes(b"good")
    (mirror / "bad.txt").write_bytes(b"tampered")
    srcs = (_src("good.txt", b"good"), _src("bad.txt", b"original"))
    out = tmp_path / "raw"
    with pytest.raises(MedrankError, match="bad.txt: sha256 mismatch"):
        acq.acquire(out, [mirror], download=False, sources=srcs)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["mirror"]  # no staging folder left either


def test_a_mirror_file_of_the_wrong_size_is_refused_before_it_is_copied(tmp_path, monkeypatch):
    """A 3 GB sparse file at a mirror path used to be copied and hashed before it was refused."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with open(mirror / "a.txt", "wb") as f:
        f.truncate(3 << 30)  # sparse: no disk used
    monkeypatch.setattr(acq.shutil, "copyfile", lambda *a: pytest.fail("copied before the size was checked"))
    with pytest.raises(
        MedrankError, match=rf"a.txt: {3 << 30} bytes, the pinned file has 5; the mirror copy is not the pinned file"
    ):
        acq.acquire(tmp_path / "raw", [mirror], download=False, sources=(_src("a.txt", b"hello"),))


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    import errno

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "a.txt").write_bytes(b"hello")

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(src))  # what shutil reports: the file it read

    monkeypatch.setattr(acq.shutil, "copyfile", full)
    with pytest.raises(OSError) as e:
        acq.acquire(tmp_path / "raw", [mirror], download=False, sources=(_src("a.txt", b"hello"),))
    assert e.value.errno == errno.ENOSPC and e.value.filename.endswith("a.txt") and str(mirror) not in e.value.filename


def test_no_source_reachable(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise acq.urllib.error.URLError("network unreachable")

    monkeypatch.setattr(acq, "_download", offline)
    with pytest.raises(
        MedrankError,
        match="x.txt: not in any mirror and download from https://raw.githubusercontent.com/o/r/c0ffee/x.txt failed",
    ):
        acq.acquire(tmp_path / "raw", [], sources=(_src("x.txt", b"x"),))
    with pytest.raises(MedrankError, match="acquire.download is false"):
        acq.acquire(tmp_path / "raw", [], download=False, sources=(_src("x.txt", b"x"),))
    assert not (tmp_path / "raw").exists()


def test_download_paths_verify_content(tmp_path, monkeypatch):
    blob = b"format-version: 1.2\n"
    members = [("sub/a.html", b"<p>a</p>"), ("sub/b.html", b"<p>b</p>"), ("sub/skip.js", b"x"), ("drop.zip", b"z")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(f"r-c0ffee/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    payload = {
        "https://raw.githubusercontent.com/o/r/c0ffee/x.obo": blob,
        "https://codeload.github.com/o/r/tar.gz/c0ffee": buf.getvalue(),
    }
    monkeypatch.setattr(acq, "_download", lambda url, timeout: payload[url])
    kept = [("sub/a.html", b"<p>a</p>"), ("sub/b.html", b"<p>b</p>")]
    gz = Source(
        "x.obo.gz",
        "o/r",
        "c0ffee",
        "x.obo",
        "-",
        0,
        "CC0",
        kind="gzip",
        content_sha256=hashlib.sha256(blob).hexdigest(),
    )
    tb = Source(
        "t.tar.gz",
        "o/r",
        "c0ffee",
        "sub/*.html",
        "-",
        0,
        "CC0",
        kind="tarball",
        member_prefix="top",
        content_sha256=acq.tar_content_digest(kept),
    )
    acq.fetch_upstream(gz, tmp_path / "x.obo.gz", 1)
    assert gzip.decompress((tmp_path / "x.obo.gz").read_bytes()) == blob
    acq.fetch_upstream(tb, tmp_path / "t.tar.gz", 1)
    with tarfile.open(tmp_path / "t.tar.gz") as tar:
        assert tar.getnames() == ["top/sub/a.html", "top/sub/b.html"]
    # repacking is deterministic: same bytes twice
    first = (tmp_path / "t.tar.gz").read_bytes()
    acq.fetch_upstream(tb, tmp_path / "t.tar.gz", 1)
    assert (tmp_path / "t.tar.gz").read_bytes() == first
    bad = Source("t.tar.gz", "o/r", "c0ffee", "sub/*", "-", 0, "CC0", kind="tarball", content_sha256=tb.content_sha256)
    with pytest.raises(MedrankError, match="content digest mismatch"):
        acq.fetch_upstream(bad, tmp_path / "t2.tar.gz", 1)


@pytest.mark.parametrize("src", [s for s in SOURCES if s.kind != "file"], ids=lambda s: s.path)
def test_snapshot_content_digests_match_mirror(shared_data, src):
    """The online verification hash, computed from the mirror copy, equals the pinned one."""
    data = (shared_data / src.path).read_bytes()
    if src.kind == "gzip":
        assert hashlib.sha256(gzip.decompress(data)).hexdigest() == src.content_sha256
    else:
        assert acq.tar_content_digest(acq._snapshot_members(data, src)) == src.content_sha256


def test_stage_cli_error_exit_2(tmp_path):
    write_params(tmp_path, {"acquire": {"mirrors": ["nowhere"], "download": False}})
    r = run_module("stages.acquire", cwd=tmp_path)
    assert r.returncode == 2
    errs = error_lines(r.stderr)
    assert len(errs) == 1 and "acquire.download is false" in errs[0]
    assert not (tmp_path / "data/raw").exists()
