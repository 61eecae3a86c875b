import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (the 2 cores are shared; tiny models gain nothing from more)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """The one tiny BERT base (tests/helpers/models.make_tiny_bert's defaults: randomly initialised, seed 0) that every
    test which only reads a base model shares; built once per session. Never write into it."""
    from tests.helpers.models import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture
def shared_data() -> Path:
    """The byte-exact mirror beside the repo (CI has it); tests needing real files skip without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"mirror {SHARED_DATA} not present")
    return SHARED_DATA


def run_module(module: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m module` as a user would (exit code + stderr are part of the contract)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full_env, capture_output=True, text=True)


def error_lines(stderr: str) -> list[str]:
    """The user-facing error lines (logs and progress bars may precede them on stderr)."""
    return [line for line in stderr.splitlines() if line.startswith("error:") or "Traceback" in line]


def deep_merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, nested mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_params(folder: Path, overrides: dict | None = None) -> Path:
    """folder/params.yaml: the repository's params with `overrides` merged in (load_params wants every key spelled out)."""
    base = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    path = Path(folder) / "params.yaml"
    path.write_text(yaml.safe_dump(deep_merge(base, overrides or {}), sort_keys=False), encoding="utf-8")
    return path


# a scratch identity: the tiny repos commit without touching the user's git config
GIT = ["git", "-c", "user.name=medrank-smoke", "-c", "user.email=smoke@medrank.invalid", "-c", "commit.gpgsign=false"]


def build_tiny_repo(work: Path, mirror: Path = SHARED_DATA) -> Path:
    """A scratch copy of this checkout's files (tracked + untracked, not ignored) on the tiny params profile, reading
    the raw data from `mirror` only, without dvc.lock (analysis/dvc.lock: the frozen noise band's entry alone), committed
    to a fresh git repo (dvclive needs a revision)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for f in files:
        src = REPO / f
        if src.is_file():
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / f)
    params = deep_merge(
        yaml.safe_load((REPO / "params.yaml").read_text()),
        yaml.safe_load((REPO / "tests/smoke/params_tiny.yaml").read_text()),
    )
    params["acquire"]["mirrors"] = [str(mirror)]
    params["acquire"]["download"] = False
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (work / "dvc.lock").unlink(missing_ok=True)
    # the frozen noise band's entry stays, as in a user's clone: `dvc repro` verifies its committed file against it
    # and never runs it or its upstream (the MTL's path, analysis/dvc.yaml's); every other entry goes
    analysis_lock = work / "analysis" / "dvc.lock"
    lock = yaml.safe_load(analysis_lock.read_text())
    analysis_lock.write_text(
        yaml.safe_dump({**lock, "stages": {"noise_band": lock["stages"]["noise_band"]}}, sort_keys=False)
    )
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=work, check=True)
    subprocess.run([*GIT, "commit", "-qm", "tiny profile"], cwd=work, check=True)
    return work
