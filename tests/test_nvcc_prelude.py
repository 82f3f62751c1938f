"""kfc builds its kernels against a prelude of the CUDA headers instead of all of cuda_runtime.h
(kfc/codegen/nvcc_prelude.py): the same PTX, in a fraction of nvcc's time. Here kernels of every
kind are built both ways (KFC_NVCC_HEADERS=check, the build cache off), and a difference or a
kernel the prelude cannot build is an error."""

from __future__ import annotations

import pytest

from kfc.codegen import nvcc_prelude, toolchain
from kfc.codegen.toolchain import compile_cuda
from kfc.compile import compile_op
from kfc.diagnostics import InternalError, KfcError
from kfc.frontend import load_kfc
from kfc.model.target import parse_target

# (file, type arguments, target, shape): row programs with the math builtins the prelude declares
# (exp, log1p, sqrt, tanh), narrow types, a tile program (KDA's prepare kernel: shuffles, the
# inverse, mma.sync), GEMMs on wgmma (min of long longs) and on tcgen05. The suite's other
# kernels were compared the same way once, all 677 the suite builds: the same PTX for each.
KERNELS = [
    ("kernels/rmsnorm.kfc", None, "sm_90a", {"N": 4096}),
    ("examples/cross_entropy.kfc", None, "sm_90a", {"N": 32000}),
    ("examples/router.kfc", {"T": "bf16"}, "sm_100a", {"N": 128}),
    ("examples/fp8_quant.kfc", None, "sm_90a", None),
    ("kernels/kda_prepare_flashkda.kfc", None, "sm_90a", {"T": 4096, "K": 128, "V": 128}),
    ("kernels/gemm_bias_gelu.kfc", None, "sm_90a", {"M": 4096, "N": 4096, "K": 4096}),
    ("kernels/gemm.kfc", None, "sm_100a", {"M": 33, "N": 65, "K": 17}),
]


@pytest.fixture
def check_both(monkeypatch):
    monkeypatch.delenv("KFC_BUILD_CACHE", raising=False)  # build, do not read back
    monkeypatch.setenv(nvcc_prelude.ENV, "check")


@pytest.mark.parametrize("path,types,target,shape", KERNELS, ids=[k[0].split("/")[1] + "-" + k[2] for k in KERNELS])
def test_the_prelude_builds_the_ptx_the_full_headers_build(check_both, path, types, target, shape):
    r = compile_op(load_kfc(path, types), parse_target(target), shape=shape)
    assert r.kernel.ptx.count(".entry") >= 1


def test_a_kernel_the_prelude_cannot_build_is_built_with_the_full_headers(monkeypatch):
    """Anything outside the prelude (here <cuda_fp16.h>'s conversions, which need memcpy) takes
    the full headers: same result, slower build; `check` names it."""
    monkeypatch.delenv("KFC_BUILD_CACHE", raising=False)
    cu = ("#include <cuda_fp16.h>\n"
          "extern \"C\" __global__ void k(__half *x) { x[threadIdx.x] = __float2half(1.5f); }\n")
    monkeypatch.setenv(nvcc_prelude.ENV, "light")
    assert ".entry k" in compile_cuda(cu, "sm_90a").ptx
    monkeypatch.setenv(nvcc_prelude.ENV, "check")
    with pytest.raises(InternalError, match="does not compile against kfc's prelude"):
        compile_cuda(cu, "sm_90a")


def test_a_min_the_prelude_would_resolve_otherwise_falls_back(check_both):
    """min of two unsigned ints is CUDA's umin; the prelude declares only int and long long
    minimums, so the call is ambiguous there, not silently another function."""
    cu = ("extern \"C\" __global__ void k(unsigned *x, unsigned a, unsigned b) { x[0] = min(a, b); "
          "x[1] = max(a, 7u); }\n")
    with pytest.raises(InternalError, match="does not compile"):
        compile_cuda(cu, "sm_90a")


def test_an_unknown_header_mode_is_refused(monkeypatch):
    monkeypatch.delenv("KFC_BUILD_CACHE", raising=False)
    monkeypatch.setenv(nvcc_prelude.ENV, "fast")
    with pytest.raises(KfcError, match="KFC_NVCC_HEADERS=fast is not a way kfc builds"):
        compile_cuda("__global__ void k() {}\n", "sm_90a")


def _counted(monkeypatch):
    real, ran = toolchain._run, []

    def run(cmd, what, sources, **how):
        ran.append(what)
        return real(cmd, what, sources, **how)

    monkeypatch.setattr(toolchain, "_run", run)
    monkeypatch.setattr(toolchain, "_PRELUDE_FITS", {})
    monkeypatch.delenv("KFC_BUILD_CACHE", raising=False)
    monkeypatch.setenv(nvcc_prelude.ENV, "light")
    return ran


def test_a_toolchain_the_prelude_does_not_fit_takes_the_full_headers_at_once(monkeypatch):
    """Another CUDA release whose headers the prelude does not fit: the first kernel's failure and
    a probe's tell the toolchain's fault from the kernel's, and later kernels skip the try."""
    ran = _counted(monkeypatch)
    monkeypatch.setattr(nvcc_prelude, "PRELUDE", "#error not this release\n")
    for scale in ("2.0f", "3.0f"):
        compile_cuda(f'extern "C" __global__ void k(float *x) {{ x[threadIdx.x] *= {scale}; }}\n', "sm_90a")
    assert [w.split(" (")[1].split(")")[0] for w in ran if w.startswith("nvcc")] == [
        "CUDA C++ to PTX, kfc's prelude", "a probe of kfc's prelude", "CUDA C++ to PTX", "CUDA C++ to PTX"]


def test_a_kernel_of_its_own_outside_the_prelude_does_not_turn_it_off(monkeypatch):
    ran = _counted(monkeypatch)
    compile_cuda('#include <cuda_fp16.h>\nextern "C" __global__ void k(__half *x) { x[0] = __float2half(2.f); }\n',
                 "sm_90a")
    compile_cuda('extern "C" __global__ void k(float *x) { x[threadIdx.x] = expf(x[1]); }\n', "sm_90a")
    assert set(toolchain._PRELUDE_FITS.values()) == {True}
    assert [w for w in ran if w.startswith("nvcc")][-1] == "nvcc (CUDA C++ to PTX, kfc's prelude)"
