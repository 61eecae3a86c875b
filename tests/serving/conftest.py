import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.tiny_project import build_tiny_project, use_tiny_baseline


@pytest.fixture(scope="session")
def tiny_mtl_project(tmp_path_factory) -> Path:
    """The tiny project whose decided system is the MTL (it reads retrieval and the NLI grids). Never write into it."""
    return build_tiny_project(tmp_path_factory.mktemp("serve-mtl"))


@pytest.fixture(scope="session")
def tiny_project(tiny_mtl_project, tmp_path_factory) -> Path:
    """The tiny project with the decided system's shape: a baseline on metadata + bienc + passage. Never write into it."""
    root = tmp_path_factory.mktemp("serve-baseline")
    shutil.copytree(tiny_mtl_project / "models", root / "models")
    # the steps name the tiny encoder by its path, in the MTL project's bert/
    return use_tiny_baseline(root, tiny_mtl_project / "bert")


@pytest.fixture(scope="module")
def ranker(tiny_project):
    """The tiny project's models loaded as `medrank serve` loads them, in the project folder."""
    from medrank.serving.rank import Ranker

    cwd = os.getcwd()
    os.chdir(tiny_project)
    try:
        yield Ranker.load("models")
    finally:
        os.chdir(cwd)
