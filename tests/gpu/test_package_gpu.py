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


def test_a_packaged_op_of_two_kernels_runs_without_kfc(tmp_path):
    """rmsnorm_bwd_dx: the row kernel leaves partials of dw in a workspace the package allocates,
    the second kernel adds them; the package's own tests (its check cases) pass, and it agrees to
    the bit with kfc's runtime."""
    pkg, python = build_and_install(tmp_path, "kernels/rmsnorm_bwd_dx.kfc", [{"N": 4096}, {"N": 7}],
                                    targets=("sm_90a",))
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       capture_output=True, text=True, cwd=pkg, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "passed" in r.stdout and "failed" not in r.stdout and "skipped" not in r.stdout
    code = ("import torch, kfc_rmsnorm_bwd_dx as p\n"
            "g = torch.Generator(device='cuda').manual_seed(0)\n"
            "x = torch.randn(3000, 4096, device='cuda', generator=g).bfloat16()\n"
            "dy = torch.randn(3000, 4096, device='cuda', generator=g).bfloat16()\n"
            "w = torch.randn(4096, device='cuda', generator=g)\n"
            "dx, rstd, dw = p.rmsnorm_bwd_dx(x, w, dy, None)\n"
            "torch.save((x, dy, w, dx, rstd, dw), 'out.pt')\n")
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import torch

    import kfc

    x, dy, w, dx, rstd, dw = torch.load(tmp_path / "out.pt")
    got = kfc.load("kernels/rmsnorm_bwd_dx.kfc")(x, w, dy, None)
    assert torch.equal(got[0], dx) and torch.equal(got[1], rstd) and torch.equal(got[2], dw)
