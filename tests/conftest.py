from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _repo_root_cwd(monkeypatch):
    """Tests name files relative to the repository root, as a user does."""
    monkeypatch.chdir(ROOT)
