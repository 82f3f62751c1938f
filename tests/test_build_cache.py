"""The toolchain build cache (KFC_BUILD_CACHE): a kernel built once is read back, not built
again; what it reads back is what nvcc and ptxas made; another arch, other flags or other tools
are other entries; a failed build and a torn entry are never served."""

import pytest

from kfc.codegen import build_cache, toolchain
from kfc.codegen.toolchain import ToolchainRejected, compile_cuda

KERNEL = """extern "C" __global__ void twice(float* y, const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""


@pytest.fixture
def counted_runs(monkeypatch, tmp_path):
    """A fresh cache folder, and the toolchain steps that really ran (tool names)."""
    monkeypatch.setenv("KFC_BUILD_CACHE", str(tmp_path / "builds"))
    monkeypatch.setenv("KFC_NVCC_HEADERS", "light")  # the default, whatever the environment says
    monkeypatch.setattr(toolchain, "_PRELUDE_FITS", {})  # not yet probed
    real, ran = toolchain._run, []

    def run(cmd, what, sources, **how):
        ran.append(what.split()[0])
        return real(cmd, what, sources, **how)

    monkeypatch.setattr(toolchain, "_run", run)
    return ran


def test_a_kernel_built_twice_runs_the_toolchain_once(counted_runs):
    first = compile_cuda(KERNEL, "sm_90a")
    second = compile_cuda(KERNEL, "sm_90a")
    assert counted_runs == ["nvcc", "ptxas"]
    assert (second.ptx, second.cubin, second.ptxas_log, second.report) == (first.ptx, first.cubin, first.ptxas_log, first.report)
    assert second.cu == KERNEL and second.arch == "sm_90a"


def test_the_cache_serves_what_the_toolchain_makes(monkeypatch, counted_runs):
    cached = compile_cuda(KERNEL, "sm_100a")
    monkeypatch.delenv("KFC_BUILD_CACHE")
    fresh = compile_cuda(KERNEL, "sm_100a")
    assert (fresh.ptx, fresh.cubin, fresh.report) == (cached.ptx, cached.cubin, cached.report)


def test_arch_flags_and_tools_are_part_of_the_key(counted_runs):
    compile_cuda(KERNEL, "sm_90a")
    compile_cuda(KERNEL, "sm_100a")
    compile_cuda(KERNEL, "sm_90a", extra_flags=("-lineinfo",))
    assert counted_runs.count("nvcc") == 3
    assert build_cache.key(KERNEL, "sm_90a", (), ("nvcc-a",)) != build_cache.key(KERNEL, "sm_90a", (), ("nvcc-b",))


def test_a_failed_build_is_not_stored(counted_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kept failing sources go here
    broken = KERNEL.replace("2.0f *", "2.0f +* ")
    for _ in range(2):
        with pytest.raises(ToolchainRejected):
            compile_cuda(broken, "sm_90a")
    # each time the try against kfc's prelude of the CUDA headers, then the full headers' build; the
    # first time between them a probe of whether the prelude fits this nvcc at all
    assert counted_runs == ["nvcc"] * 5
    assert not list((tmp_path / "builds").glob("[0-9a-f]*"))


def test_a_torn_entry_is_built_again(counted_runs, tmp_path):
    compile_cuda(KERNEL, "sm_90a")
    (entry,) = (tmp_path / "builds").iterdir()
    (entry / "kernel.cubin").unlink()
    again = compile_cuda(KERNEL, "sm_90a")
    assert counted_runs == ["nvcc", "ptxas", "nvcc", "ptxas"]
    assert again.cubin


def test_off_without_the_variable(monkeypatch, counted_runs):
    monkeypatch.delenv("KFC_BUILD_CACHE")
    compile_cuda(KERNEL, "sm_90a")
    compile_cuda(KERNEL, "sm_90a")
    assert counted_runs == ["nvcc", "ptxas", "nvcc", "ptxas"]
