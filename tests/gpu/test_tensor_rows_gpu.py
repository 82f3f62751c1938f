"""Whole-tensor row programs on the GPU (rows-of-tensors): the column sum kernels/colsum.kfc and
rmsnorm's backward written on whole tensors (kernels/rmsnorm_bwd_tensors.kfc), NaN-poisoned
outputs, at M in {1, 7, 32768} and N in {1, 4095, 16384}, against float64 torch; the sums
over rows bit-identical across calls (two phases, no float atomics). Run with `pytest -m gpu`."""

import pytest

from tests.gpu.test_rmsnorm_bwd_gpu import close, closed_form, inputs, reference, requires_gpu

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TOL = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5}
MS = [1, 7, 32768]
NS = [1, 4095, 16384]
_loaded = {}


def kernel(path):
    import kfc

    if path not in _loaded:
        _loaded[path] = kfc.load(path)
    return _loaded[path]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
def test_the_column_sum_matches_torch(dtype, n):
    requires_gpu()
    k = kernel("kernels/colsum.kfc")
    gen = torch.Generator(device="cuda")
    for m in MS:
        gen.manual_seed(m * 131 + n)
        x = torch.randn(m, n, device="cuda", generator=gen).to(DTYPES[dtype])
        before = x.clone()
        y = torch.full((n,), float("nan"), device="cuda")
        got = k(x, out=(y,))
        torch.cuda.synchronize()
        got = got[0] if isinstance(got, tuple) else got
        assert got.data_ptr() == y.data_ptr()
        # a sum of m f32 terms: its rounding grows with m
        close(y, x.double().sum(0), 1e-5 if m < 32768 else 1e-4, f"colsum {dtype} {m}x{n}")
        assert torch.equal(x, before), "the kernel modified its input"
        again = k(x)
        again = again[0] if isinstance(again, tuple) else again
        assert torch.equal(again, y), "the sum over rows changed between calls"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
def test_the_whole_tensor_rmsnorm_backward_matches_autograd(dtype, n):
    requires_gpu()
    k = kernel("kernels/rmsnorm_bwd_tensors.kfc")
    gen = torch.Generator(device="cuda")
    for m in MS:
        gen.manual_seed(m * 7 + n)
        x, w, dout, rstd = inputs(m, n, DTYPES[dtype], gen)
        dx = torch.full((m, n), float("nan"), device="cuda", dtype=DTYPES[dtype])
        dw = torch.full((n,), float("nan"), device="cuda")
        k(x, w, dout, rstd, out=(dx, dw))
        torch.cuda.synchronize()
        what = f"{dtype} {m}x{n}"
        cdx, cdw = closed_form(x, w, dout, rstd)
        scale = (rstd.double()[:, None] * dout.double() * w.double()).abs() if n == 1 else None
        close(dx, cdx, TOL[dtype], f"dx {what}", scale)
        close(dw, cdw, max(TOL[dtype], 1e-4), f"dw {what}")
        if n > 1:
            rdx, rdw = reference(x, w, dout)
            close(dx, rdx, TOL[dtype], f"dx {what} (autograd)")
            close(dw, rdw, max(TOL[dtype], 1e-4), f"dw {what} (autograd)")
