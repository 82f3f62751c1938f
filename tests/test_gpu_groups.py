"""Every GPU test file runs in a group of .ci/gpu (the GPU suite in parallel processes), so a
new one cannot be left out of the GPU run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_gpu_test_file_is_in_a_group():
    script = (ROOT / ".ci" / "gpu").read_text()
    files = sorted(p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert files and [f for f in files if f"$G/{f}" not in script] == []
