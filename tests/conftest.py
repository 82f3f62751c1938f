import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_OWN_BUILD_CACHE = "_KFC_TESTS_OWN_BUILD_CACHE"


def pytest_configure(config):
    """One toolchain build cache for the whole run (kfc/codegen/build_cache.py): many tests build
    the same kernel for the same target and shape, and nvcc need run once for each. Set before
    pytest-xdist starts its workers, so they inherit and share it; a KFC_BUILD_CACHE given by
    the caller is used as it is and kept."""
    if "KFC_BUILD_CACHE" not in os.environ:
        os.environ["KFC_BUILD_CACHE"] = tempfile.mkdtemp(prefix="kfc-test-builds-")
        os.environ[_OWN_BUILD_CACHE] = os.environ["KFC_BUILD_CACHE"]


def pytest_unconfigure(config):
    own = os.environ.get(_OWN_BUILD_CACHE)
    if own and not hasattr(config, "workerinput"):  # the controller made it; it removes it
        shutil.rmtree(own, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The tests marked slow (tens of seconds or more) first: pytest-xdist hands tests (or a
    module's xdist_group) out in this order with --no-loadscope-reorder, so the longest start at
    once and the workers end together instead of one running a fuzz test alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _repo_root_cwd(monkeypatch):
    """Tests name files relative to the repository root, as a user does."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(autouse=True)
def _no_default_knowledge_base(monkeypatch, tmp_path_factory):
    """kfc compile and kfc.load read the default knowledge base where it exists (kfc.kb.advice):
    each test gets a default of its own that does not exist, so neither the user's
    ~/.cache/kfc/kb.sqlite nor another test's tunes change what a test compiles."""
    monkeypatch.setenv("KFC_KB", str(tmp_path_factory.mktemp("kb") / "kb.sqlite"))


@pytest.fixture
def shared_memory_form(monkeypatch):
    """Tile kernels with every tile in shared memory: tests of that form (the fallback of a
    carried tile in registers, kfc.codegen.tile_columns) keep it whatever the default."""
    from kfc.codegen import cuda  # lazy: only the tests that ask for it build kernels
    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", False)
