"""`kfc package` on the H200: a packaged rmsnorm, installed in a fresh venv without kfc, passes
its own tests, GPU cases included (the check block's cases against its reference with
NaN-poisoned outputs), and its benchmark runs. Run with `pytest -m gpu`."""

import subprocess

import pytest

from tests.package_venv import build_and_install

pytestmark = pytest.mark.gpu


def test_a_packaged_rmsnorm_passes_its_gpu_tests_without_kfc(tmp_path):
    pkg, python = build_and_install(tmp_path, "kernels/rmsnorm.kfc", [{"N": 4096}, {"N": 7}, {"N": 4095}],
                                    targets=("sm_90a",))
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       capture_output=True, text=True, cwd=pkg, timeout=900)
    print(r.stdout[-1500:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "passed" in r.stdout and "failed" not in r.stdout and "skipped" not in r.stdout
    r = subprocess.run([str(python), "bench/bench_rmsnorm.py", "--rows", "8192"], capture_output=True, text=True,
                       cwd=pkg, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("TB/s") >= 6
