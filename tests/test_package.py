"""`kfc package` on the CPU: a packaged rmsnorm installs in a fresh venv that has no kfc, and
the package's own tests pass there (all but the GPU ones, which tests/gpu runs on the H200)."""

import json
import subprocess

import pytest

from kfc.cli import main
from tests.package_venv import build_and_install


@pytest.mark.slow
def test_a_packaged_rmsnorm_installs_and_passes_its_tests_without_kfc(tmp_path):
    pkg, python = build_and_install(tmp_path, "kernels/rmsnorm.kfc", [{"N": 4096}, {"N": 7}])
    r = subprocess.run([str(python), "-c", "import kfc"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and "No module named 'kfc'" in r.stderr
    r = subprocess.run([str(python), "-c", "import kfc_rmsnorm, sys; print(kfc_rmsnorm.rmsnorm); "
                        "assert 'kfc' not in sys.modules"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rmsnorm(Tensor x, Tensor w, float eps=1e-06) -> Tensor" in r.stdout
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-m", "not gpu", "-p", "no:cacheprovider", "tests"],
                       capture_output=True, text=True, cwd=pkg, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
    # run as a user runs it, GPU cases included: on a machine without a GPU they skip, saying why
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
                       capture_output=True, text=True, cwd=pkg, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " skipped" in r.stdout and "no CUDA GPU visible" in r.stdout and "failed" not in r.stdout
    meta = json.loads((pkg / "src" / "kfc_rmsnorm" / "op.json").read_text())
    assert {i["name"] for i in meta["instances"]} == {"rmsnorm_bf16", "rmsnorm_f16", "rmsnorm_f32"}
    assert {(k["target"], k["dims"]["N"]) for i in meta["instances"] for k in i["kernels"]} == \
        {("sm_90a", 4096), ("sm_90a", 7), ("sm_100a", 4096), ("sm_100a", 7)}
    report = json.loads((pkg / "report.json").read_text())
    assert len(report["kernels"]) == 12 and all(k["pipeline"] for k in report["kernels"])


def test_package_refuses_a_folder_with_files(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["package", "kernels/softmax.kfc", "--shape", "N=64", "-o", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("shape,message", [("Q=4", "--shape names Q, which is not a dimension of softmax"),
                                           ("N=4611686018427387904", "more than the 64-bit offsets")])
def test_package_refuses_a_bad_shape_before_it_says_it_is_building(tmp_path, capsys, shape, message):
    out = tmp_path / "pkg"
    assert main(["package", "kernels/softmax.kfc", "--shape", shape, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "building" not in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["package", "kernels/softmax.kfc", "--shape", "N=64"], "required: -o"),
    (["package", "kernels/softmax.kfc", "--target", "sm_80", "-o", "x"], "unknown target"),
])
def test_package_bad_arguments(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_packaged_op_with_an_optional_input_and_two_outputs(tmp_path):
    """rmsnorm_bwd_dx: dres is optional, dx, rstd and dw are outputs of two dtypes and shapes, and
    dw, a sum across rows, makes it two kernels with a workspace."""
    pkg, python = build_and_install(tmp_path, "kernels/rmsnorm_bwd_dx.kfc", [{"N": 64}], targets=("sm_90a",))
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-m", "not gpu", "-p", "no:cacheprovider", "tests"],
                       capture_output=True, text=True, cwd=pkg, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    code = ("import torch, kfc_rmsnorm_bwd_dx as p\n"
            "x = torch.empty(5, 64, device='meta', dtype=torch.float16)\n"
            "w = torch.empty(64, device='meta')\n"
            "dx, rstd, dw = p.torch_op(x, w, x, None)\n"
            "assert dx.dtype == torch.float16 and rstd.shape == (5,) and rstd.dtype == torch.float32\n"
            "assert dw.shape == (64,) and dw.dtype == torch.float32\n"
            "dx, rstd, dw = p.torch_op(x, w, x, x, 1e-5)\n"
            "assert dx.shape == (5, 64)\n"
            "print(p.rmsnorm_bwd_dx)\n")
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Tensor? dres" in r.stdout
    checks = json.loads((pkg / "src" / "kfc_rmsnorm_bwd_dx" / "checks.json").read_text())
    assert checks["reference"] == "kfc_rmsnorm_bwd_dx.reference_norms:rmsnorm_bwd_dx"
    assert (pkg / "src" / "kfc_rmsnorm_bwd_dx" / "reference_norms.py").is_file()
    meta = json.loads((pkg / "src" / "kfc_rmsnorm_bwd_dx" / "op.json").read_text())
    launches = meta["instances"][0]["kernels"][0]["kernels"]
    assert len(launches) == 2 and launches[1]["name"].endswith("_sums")
